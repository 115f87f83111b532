"""What `selftaught proxy` adds to the time to the first byte of a streamed agent reply, in the
agents' own formats (Anthropic Messages as Claude Code sends it, OpenAI Responses as Codex does),
against the same scripted upstream called directly.

Three processes: the scripted upstream (`tests/agent_upstream.py`: the real SSE event sequence
of each API, one event every `--chunk-ms`), `selftaught proxy` in front of it (a fresh log, an
adopted skill to inject, the client's model passed through) and this client. Each repeat sends
the same agent-sized request (`--body-kb`: a system prompt and tools as large as Claude Code's,
~50 KB) once directly and once through the proxy, the order alternating, one request at a time;
the time to first byte is from sending the request to the first body chunk. Reported per wire
format: the median of each side and the median of the paired differences with a 95% bootstrap
interval. Target: <= 20 ms median overhead.

    python benchmarks/bench_proxy_ttfb.py            # 200 repeats per wire format
    python benchmarks/bench_proxy_ttfb.py --quick    # 30 repeats: a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_proxy import free_port, wait_up  # noqa: E402
from common import RESULTS, command_line, machine_info  # noqa: E402

from selftaught.runs import atomic_write_json  # noqa: E402

MODEL = "bench-agent-model"
REPLY = " ".join(f"word{i}" for i in range(30))
TARGET_MS = 20.0


def serve_upstream(port: int, chunk_ms: float) -> None:
    sys.path.insert(0, str(REPO))
    from tests.agent_upstream import AgentUpstream

    with AgentUpstream(lambda _: REPLY, chunk_delay_s=chunk_ms / 1000, port=port) as up:
        up.thread.join()  # until the parent terminates this process


def agent_body(wire: str, body_kb: int) -> dict[str, Any]:
    """A request the size of a coding agent's: a long system prompt, many tools."""
    rng = random.Random(0)

    def text(chars: int) -> str:
        out, size = [], 0
        while size < chars:
            out.append(f"w{rng.randrange(10_000)}")
            size += len(out[-1]) + 1
        return " ".join(out)

    system = text(body_kb * 1024 // 5)  # a fifth in the system prompt, the rest in 20 tools
    schema = {"type": "object", "properties": {"command": {"type": "string"}}}
    tools = [(f"Tool{i}", text(body_kb * 1024 * 4 // 5 // 20), schema) for i in range(20)]
    ask = "Run the tests and tell me what failed."
    if wire == "messages":
        return {
            "model": MODEL,
            "max_tokens": 1024,
            "stream": True,
            "system": [{"type": "text", "text": system}],
            "tools": [{"name": n, "description": d, "input_schema": s} for n, d, s in tools],
            "messages": [{"role": "user", "content": [{"type": "text", "text": ask}]}],
        }
    return {
        "model": MODEL,
        "stream": True,
        "instructions": system,
        "tools": [
            {"type": "function", "name": n, "description": d, "parameters": s} for n, d, s in tools
        ],
        "input": [{"type": "message", "role": "user", "content": ask}],
    }


def first_byte_ms(client: Any, url: str, body: bytes) -> tuple[float, float]:
    """(ms to the first body chunk, ms to the end) of one streamed request."""
    headers = {"content-type": "application/json", "x-api-key": "bench-client-key"}
    started = time.perf_counter()
    first = None
    with client.stream("POST", url, content=body, headers=headers) as response:
        response.raise_for_status()
        for _ in response.iter_raw():
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    return 1000 * ((first or end) - started), 1000 * (end - started)


def bootstrap_median(diffs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(n))
    return medians[int(0.025 * n)], medians[int(0.975 * n) - 1]


def measure(direct: str, proxied: str, wire: str, repeats: int, body_kb: int) -> dict:
    import httpx

    path = "messages" if wire == "messages" else "responses"
    body = json.dumps(agent_body(wire, body_kb)).encode()
    sides: dict[str, list[tuple[float, float]]] = {"direct": [], "proxy": []}
    with httpx.Client(timeout=60) as client:
        for base in (direct, proxied):  # warm up both paths
            for _ in range(5):
                first_byte_ms(client, f"{base}/{path}", body)
        for i in range(repeats):
            order = [("direct", direct), ("proxy", proxied)]
            for side, base in order if i % 2 == 0 else order[::-1]:
                sides[side].append(first_byte_ms(client, f"{base}/{path}", body))
    diffs = [p[0] - d[0] for d, p in zip(sides["direct"], sides["proxy"], strict=True)]
    lo, hi = bootstrap_median(diffs)
    ttfb = {side: [round(x[0], 3) for x in values] for side, values in sides.items()}
    return {
        "body_bytes": len(body),
        "repeats": repeats,
        "direct_ttfb_median_ms": round(statistics.median(ttfb["direct"]), 2),
        "proxy_ttfb_median_ms": round(statistics.median(ttfb["proxy"]), 2),
        "overhead_median_ms": round(statistics.median(diffs), 2),
        "overhead_ci95_ms": [round(lo, 2), round(hi, 2)],
        "direct_total_median_ms": round(statistics.median(x[1] for x in sides["direct"]), 2),
        "proxy_total_median_ms": round(statistics.median(x[1] for x in sides["proxy"]), 2),
        "meets_target": statistics.median(diffs) <= TARGET_MS,
        "ttfb_ms": ttfb,
    }


def adopt_skill(home: Path, project: str) -> None:
    folder = home / "projects" / project / "adopted"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "skill.md").write_text("Run the tests before answering.\nQuote failures exactly.\n")
    (folder / "memory.md").write_text("The test command is `pytest -q`.\n")
    (folder / "version").write_text("1\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--chunk-ms", type=float, default=5.0)
    parser.add_argument("--body-kb", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="30 repeats")
    parser.add_argument("--out", type=Path, default=RESULTS / "proxy_ttfb.json")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream, args.chunk_ms)
        return
    if args.quick:
        args.repeats = 30
    load_before = [round(x, 2) for x in os.getloadavg()]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    workdir = Path(tempfile.mkdtemp(prefix="bench-ttfb-"))
    env["SELFTAUGHT_HOME"] = str(workdir / "home")
    adopt_skill(workdir / "home", "bench")
    up_port, proxy_port = free_port(), free_port()
    direct = f"http://127.0.0.1:{up_port}/v1"
    proxied = f"http://127.0.0.1:{proxy_port}/v1"
    upstream_cmd = [sys.executable, __file__, "--serve-upstream", str(up_port),
                    "--chunk-ms", str(args.chunk_ms)]  # fmt: skip
    proxy_cmd = [sys.executable, "-m", "selftaught", "proxy", "--upstream",
                 f"http://127.0.0.1:{up_port}", "--port", str(proxy_port), "--project", "bench",
                 "--log", str(workdir / "log.db")]  # fmt: skip
    procs = [subprocess.Popen(upstream_cmd, env=env), subprocess.Popen(proxy_cmd, env=env)]
    try:
        wait_up(direct + "/models", procs[0])
        wait_up(proxied.removesuffix("/v1") + "/health", procs[1])
        started = time.perf_counter()
        wires = {w: measure(direct, proxied, w, args.repeats, args.body_kb)
                 for w in ("messages", "responses")}  # fmt: skip
        wall = time.perf_counter() - started
        import httpx

        time.sleep(1)
        log = httpx.get(proxied.removesuffix("/v1") + "/health").json()["log"]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "what": "time to first byte of a streamed agent reply: through selftaught proxy vs direct",
        "command": command_line(),
        "config": {
            "repeats": args.repeats,
            "chunk_ms": args.chunk_ms,
            "body_kb": args.body_kb,
            "adopted_skill": True,
            "target_overhead_ms": TARGET_MS,
        },  # fmt: skip
        "wires": wires,
        "proxy_log": log,
        "wall_s": round(wall, 1),
        "loadavg_before": load_before,
        "machine": machine_info(),
    }
    atomic_write_json(args.out, report)
    for wire, r in wires.items():
        lo, hi = r["overhead_ci95_ms"]
        print(f"{wire}: direct {r['direct_ttfb_median_ms']} ms, proxy "
              f"{r['proxy_ttfb_median_ms']} ms, overhead {r['overhead_median_ms']} ms "
              f"[{lo}, {hi}] (target <= {TARGET_MS} ms: {r['meets_target']})")  # fmt: skip
    print(f"proxy log: {log}; load {load_before} -> {report['machine']['loadavg']}; {args.out}")


if __name__ == "__main__":
    main()
