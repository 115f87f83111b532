"""Benchmark: selftaught's rollout overhead against the raw limit.

For a fixed batch of 200 rollouts, A = selftaught's wall time (`selftaught.rollout.
arun_rollouts`: prompt assembly, an OpenAI-compatible model with its retry policy, bounded
concurrency, scoring each reply with the task's scorer) and B = the same 200 requests sent
directly with the `openai` async client at the same concurrency to the same endpoint.
A and B alternate (ABAB…, after one untimed warm-up of each), so a change in machine load
hits both; the result is the median of the per-pair ratios A/B and their spread. Target:
a median ratio ≤ 1.05.

The default endpoint is a fake OpenAI server with a fixed latency (benchmarks/fake_openai.py,
in its own process), so the framework's own cost is not hidden behind model time; add any
real endpoint with `--endpoint http://HOST:PORT/v1#MODEL` (e.g. `selftaught serve`).

    python benchmarks/bench_overhead.py                 # fake 50 ms endpoint, C = 1, 8, 32
    python benchmarks/bench_overhead.py --endpoint http://127.0.0.1:8011/v1#qwen
    python benchmarks/bench_overhead.py --serve local --concurrency 8   # the embedded SmolLM2
    python benchmarks/bench_overhead.py --quick         # seconds

Results: benchmarks/results/overhead.json and a regenerated section of benchmarks/README.md
(`--quick` writes runs/bench/quick/overhead.json and leaves the README alone).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from common import (
    REPO,
    RESULTS,
    command_line,
    machine_info,
    markdown_table,
    selftaught_server,
    split_spec,
    write_tables,
)
from fake_openai import fake_server

TASK = "gym:basic_arithmetic?min_terms=2&max_terms=3&min_digits=1&max_digits=2"
SKILL = "You are a helpful assistant."
TARGET = 1.05


@dataclass
class Settings:
    rollouts: int = 200
    concurrencies: list[int] = field(default_factory=lambda: [1, 8, 32])
    pairs: int = 5
    latency_ms: float = 50.0
    max_tokens: int = 32
    endpoints: list[str] = field(default_factory=list)  # real ones, besides the fake
    serve: str | None = None  # a model for `selftaught serve`, started for the run
    quick: bool = False


def parse_args(argv: Sequence[str] | None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 pairs, C = 8, 20 ms: seconds")
    p.add_argument("--rollouts", type=int, help="batch size (default 200)")
    p.add_argument("--concurrency", type=int, nargs="+", help="default 1 8 32")
    p.add_argument("--pairs", type=int, help="A/B pairs per setting (default 5, at least 3)")
    p.add_argument("--latency-ms", type=float, help="the fake endpoint's latency (default 50)")
    p.add_argument("--endpoint", action="append", default=[], help="a real endpoint URL#MODEL")
    p.add_argument(
        "--serve", help="also a `selftaught serve --model MODEL` started here (e.g. local)"
    )
    args = p.parse_args(argv)
    s = (
        Settings(concurrencies=[8], pairs=3, latency_ms=20.0, quick=True)
        if args.quick
        else Settings()
    )
    if args.rollouts:
        s.rollouts = args.rollouts
    if args.concurrency:
        s.concurrencies = args.concurrency
    if args.pairs:
        s.pairs = args.pairs
    if args.latency_ms is not None:
        s.latency_ms = args.latency_ms
    s.endpoints = args.endpoint
    s.serve = args.serve
    if s.pairs < 3:
        raise SystemExit(f"--pairs must be at least 3, got {s.pairs}")
    return s


# ---- the two sides ----------------------------------------------------------------------


def build_batch(n: int) -> tuple[Any, list[Any], list[list[dict[str, Any]]]]:
    """The task, `n` examples, and the exact messages selftaught sends for each."""
    from selftaught.policy import Policy
    from selftaught.tasks import load_task

    task = load_task(TASK, seed=0, train_size=0, val_size=0, test_size=n)
    examples = task.examples("test")
    messages = [[dict(m) for m in Policy(SKILL).messages(task, e)] for e in examples]
    return task, examples, messages


async def time_selftaught(
    spec: str, task: Any, examples: list[Any], c: int, max_tokens: int
) -> float:
    """Seconds for selftaught to roll out and score the batch (a fresh model, as a run has)."""
    from selftaught.models import GenerationParams, load_model
    from selftaught.policy import Policy
    from selftaught.rollout import RolloutConfig, arun_rollouts

    params = GenerationParams(max_tokens=max_tokens, temperature=0.0)
    cfg = RolloutConfig(concurrency=c, params=params, progress=False)
    t0 = time.perf_counter()
    model = load_model(spec)
    rollouts = await arun_rollouts(model, Policy(SKILL), task, examples, cfg)
    elapsed = time.perf_counter() - t0
    failed = [r.error for r in rollouts if r.error]
    if failed:
        raise SystemExit(f"selftaught side: {len(failed)} rollouts failed, e.g. {failed[0]}")
    return elapsed


async def time_direct(
    spec: str, messages: list[list[dict[str, Any]]], c: int, max_tokens: int
) -> float:
    """Seconds for the same requests sent with the `openai` async client, `c` in flight."""
    import openai

    base, name = split_spec(spec)
    sem = asyncio.Semaphore(c)
    t0 = time.perf_counter()
    async with openai.AsyncOpenAI(base_url=base, api_key="EMPTY", max_retries=0) as client:

        async def one(msgs: list[dict[str, Any]]) -> None:
            async with sem:
                await client.chat.completions.create(
                    model=name,
                    messages=msgs,  # type: ignore[arg-type]
                    max_tokens=max_tokens,
                    temperature=0.0,
                    top_p=1.0,
                )

        await asyncio.gather(*(one(m) for m in messages))
    return time.perf_counter() - t0


# ---- measurement ------------------------------------------------------------------------


def ratio_stats(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Per-pair ratios A/B with their median, spread (min, max, interquartile range)."""
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {
        "ratios": [round(r, 4) for r in ratios],
        "median": round(statistics.median(ratios), 4),
        "min": round(min(ratios), 4),
        "max": round(max(ratios), 4),
        "iqr": [round(q[0], 4), round(q[2], 4)],
        "a_median_s": round(statistics.median(a), 4),
        "b_median_s": round(statistics.median(b), 4),
        "meets_target": statistics.median(ratios) <= TARGET,
    }


def measure(spec: str, label: str, c: int, s: Settings) -> dict[str, Any]:
    task, examples, messages = build_batch(s.rollouts)

    def a() -> float:
        return asyncio.run(time_selftaught(spec, task, examples, c, s.max_tokens))

    def b() -> float:
        return asyncio.run(time_direct(spec, messages, c, s.max_tokens))

    a(), b()  # warm-up: imports, connections, the server's first requests
    times_a, times_b = [], []
    for _ in range(s.pairs):
        times_a.append(a())
        times_b.append(b())
    stats = ratio_stats(times_a, times_b)
    print(
        f"{label} C={c}: selftaught {stats['a_median_s']:.3f}s, direct "
        f"{stats['b_median_s']:.3f}s, ratio {stats['median']:.3f} "
        f"[{stats['min']:.3f}-{stats['max']:.3f}]",
        flush=True,
    )
    return {"endpoint": label, "concurrency": c, "a_s": times_a, "b_s": times_b, **stats}


def table(rows: Sequence[dict[str, Any]]) -> str:
    header = [
        "endpoint",
        "C",
        "selftaught (median s)",
        "direct openai (median s)",
        "ratio median [min–max]",
        "per-pair ratios",
        f"≤ {TARGET}",
    ]
    body = [
        [
            r["endpoint"],
            r["concurrency"],
            f"{r['a_median_s']:.3f}",
            f"{r['b_median_s']:.3f}",
            f"{r['median']:.3f} [{r['min']:.3f}–{r['max']:.3f}]",
            ", ".join(f"{x:.3f}" for x in r["ratios"]),
            "yes" if r["meets_target"] else "no",
        ]
        for r in rows
    ]
    return markdown_table(header, body)


def report(s: Settings, meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    return "\n".join(
        [
            f"Command: `{meta['command']}`  ",
            f"Date: {meta['date']}; machine: {meta['machine']}, {meta['cpu_count']} CPUs; "
            f"load average (1/5/15 min) at start {meta['loadavg']}, at end "
            f"{meta['loadavg_end']}; total wall {meta['wall_s']:.0f} s  ",
            f"Versions: selftaught {meta['versions']['selftaught']}, openai "
            f"{meta['versions']['openai']}; python {meta['python']}  ",
            f"{s.rollouts} rollouts of `{TASK}` per measurement, max_tokens {s.max_tokens}, "
            f"{s.pairs} A/B pairs after one warm-up each",
            "",
            table(rows),
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    from selftaught.runs import atomic_write_json, atomic_write_text

    s = parse_args(argv)
    meta = {**machine_info(), "command": command_line()}
    t0 = time.perf_counter()
    rows = []
    with fake_server(s.latency_ms) as fake:
        for c in s.concurrencies:
            rows.append(measure(fake, f"fake, {s.latency_ms:g} ms fixed latency", c, s))
    for spec in s.endpoints:
        for c in s.concurrencies:
            rows.append(measure(spec, spec, c, s))
    if s.serve:
        with selftaught_server(s.serve, "served", max_batch_size=max(s.concurrencies)) as spec:
            for c in s.concurrencies:
                rows.append(measure(spec, f"selftaught serve --model {s.serve}", c, s))
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out_dir = REPO / "runs" / "bench" / "quick" if s.quick else RESULTS
    path = out_dir / "overhead.json"
    atomic_write_json(path, {"meta": meta, "settings": asdict(s), "results": rows})
    markdown = report(s, meta, rows)
    atomic_write_text(path.with_suffix(".md"), markdown + "\n")
    if not s.quick:
        write_tables()
    print(f"wrote {path}\n\n{markdown}")


if __name__ == "__main__":
    main()
