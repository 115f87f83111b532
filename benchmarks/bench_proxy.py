"""What `selftaught proxy` costs: latency (p50, p99) and throughput through the proxy against the
same upstream called directly, at the same concurrency, in one run, as ratios.

Three processes: an OpenAI-compatible upstream (FastAPI/uvicorn; each request waits
`--upstream-delay-ms` like a model would, then answers; half the requests stream, in chunks),
`selftaught proxy` in front of it (logging to a fresh log, nothing adopted), and this client
(httpx, asyncio). Both modes send the same requests; the proxy's log is checked to hold every
exchange once.

    python benchmarks/bench_proxy.py            # 2,000 requests per mode, concurrency 32
    python benchmarks/bench_proxy.py --quick    # 200 requests, a smoke test
"""

# No `from __future__ import annotations`: FastAPI reads the upstream's annotations at runtime.
import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS

from selftaught.runs import atomic_write_json

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
MODEL = "bench-model"
REPLY_WORDS = 40


def upstream_app(delay_s: float) -> Any:
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    words = [f"w{i}" for i in range(REPLY_WORDS)]

    @app.get("/v1/models")
    async def models() -> Any:
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        await asyncio.sleep(delay_s)
        usage = {"prompt_tokens": 12, "completion_tokens": REPLY_WORDS, "total_tokens": 52}
        if not body.get("stream"):
            message = {"role": "assistant", "content": " ".join(words)}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": MODEL,
                "choices": [choice],
                "usage": usage,
            }

        async def events() -> Any:
            base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
            for i in range(0, REPLY_WORDS, 8):
                delta = {"content": " ".join(words[i : i + 8]) + " "}
                choice = {"index": 0, "delta": delta, "finish_reason": None}
                yield f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"
            done = {"index": 0, "delta": {}, "finish_reason": "stop"}
            yield f"data: {json.dumps({**base, 'choices': [done]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited ({proc.returncode})")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def run_mode(base_url: str, n: int, concurrency: int) -> dict[str, Any]:
    import httpx

    latencies: list[float] = []
    errors = 0
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def one(i: int) -> None:
            nonlocal errors
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"request {i}: say forty words"}],
                "max_tokens": 64,
                "stream": i % 2 == 1,
            }
            async with sem:
                t0 = time.perf_counter()
                try:
                    async with client.stream(
                        "POST", f"{base_url}/chat/completions", json=body
                    ) as r:
                        async for _ in r.aiter_raw():
                            pass
                        if r.status_code != 200:
                            errors += 1
                except httpx.HTTPError:
                    errors += 1
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": n,
        "errors": errors,
        "wall_s": round(wall, 3),
        "throughput_rps": round(n / wall, 1),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 2),
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2),
        "mean_ms": round(1000 * statistics.fmean(latencies), 2),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--upstream-delay-ms", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="200 requests, concurrency 16")
    parser.add_argument("--out", type=Path, default=RESULTS / "proxy_overhead.json")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.concurrency = 200, 16
    return args


def wait_logged(health_url: str, expected: int, timeout_s: float = 60) -> dict[str, Any]:
    """The proxy's log counters once every sent request is accounted for (or at the timeout)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        health = httpx.get(health_url).json()["log"]
        done = health["logged"] + health["failures"] + health["dropped"] >= expected
        if done or time.monotonic() >= deadline:
            return health
        time.sleep(0.2)


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start the upstream and a proxy in front of it; time both; the proxy's log counters."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    workdir = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    env["SELFTAUGHT_HOME"] = str(workdir / "home")
    up_port, proxy_port = free_port(), free_port()
    delay = ["--upstream-delay-ms", str(args.upstream_delay_ms)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--serve-upstream", str(up_port), *delay], env=env
        ),
    ]
    direct = f"http://127.0.0.1:{up_port}/v1"
    proxy_cmd = ["proxy", "--upstream", f"{direct}#{MODEL}", "--port", str(proxy_port)]
    procs.append(
        subprocess.Popen(
            [sys.executable, "-m", "selftaught", *proxy_cmd, "--log", str(workdir / "log.db")],
            env=env,
        )
    )
    proxied = f"http://127.0.0.1:{proxy_port}/v1"
    health_url = proxied.removesuffix("/v1") + "/health"
    try:
        wait_up(direct + "/models", procs[0])
        wait_up(health_url, procs[1])
        for url in (direct, proxied):  # warm up connections and code paths
            asyncio.run(run_mode(url, 2 * args.concurrency, args.concurrency))
        results = {
            "direct": asyncio.run(run_mode(direct, args.requests, args.concurrency)),
            "proxy": asyncio.run(run_mode(proxied, args.requests, args.concurrency)),
        }
        health = wait_logged(health_url, args.requests + 2 * args.concurrency)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    return results, health


def main() -> None:
    args = parse_args()
    if args.serve_upstream:
        import uvicorn

        app = upstream_app(args.upstream_delay_ms / 1000)
        uvicorn.run(app, host="127.0.0.1", port=args.serve_upstream, log_level="warning")
        return
    results, health = measure(args)
    d, p = results["direct"], results["proxy"]
    report = {
        "what": "selftaught proxy vs the same upstream called directly (half streamed)",
        "config": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "upstream_delay_ms": args.upstream_delay_ms,
            "reply_words": REPLY_WORDS,
            "quick": args.quick,
        },
        **results,
        "ratios": {
            "p50": round(p["p50_ms"] / d["p50_ms"], 3),
            "p99": round(p["p99_ms"] / d["p99_ms"], 3),
            "throughput": round(p["throughput_rps"] / d["throughput_rps"], 3),
        },
        "added_ms": {
            "p50": round(p["p50_ms"] - d["p50_ms"], 2),
            "p99": round(p["p99_ms"] - d["p99_ms"], 2),
        },
        "proxy_log": health,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(),
        },
    }
    atomic_write_json(args.out, report)
    print(json.dumps({k: report[k] for k in ("ratios", "added_ms", "direct", "proxy")}, indent=2))
    print(f"proxy log: {health}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
