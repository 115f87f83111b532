"""Local generation throughput against the hardware's raw decode rate.

For a real task's chat prompts (mixed reply lengths), greedy, at each concurrency C:

- continuous: `LocalModel` (continuous batching, at most C sequences decoded together)
  answering C concurrent `achat` calls at a time: useful output tokens/s (what came back,
  each reply ending at its own end-of-turn token or at max_tokens);
- static: what LocalModel did before continuous batching: `model.generate` on chunks of
  C prompts, each chunk waiting for its longest reply;
- raw: the limit: `model.generate` on the same prompts, C at a time, every sequence forced
  to the same length (min_new_tokens = max_new_tokens = --raw-tokens): the plain decode
  rate, with no padding waste and no refills.

Repeats are interleaved (and the order of the three rotated) so that load on the machine
falls on all of them alike; ratios are taken per repeat, then the median. Each run also
records the process CPU time it used: on a shared machine, tokens per CPU-second (with
--threads 1) is steadier than tokens per wall-clock second.

--shared-prefix N...: the same prompts behind a system prompt of about N tokens that all of
them share (a skill), answered by the engine with prefix reuse and without it
(`prefix_cache_mb=0`), interleaved: time to first token (median, p90) and useful tokens/s.

    python benchmarks/bench_generation.py              # full: 64 prompts, max_tokens 256, C=8,32
    python benchmarks/bench_generation.py --quick      # smoke test, ~1-2 min on 2 idle cores
    python benchmarks/bench_generation.py --shared-prefix 0 500 2000 --concurrency 8 \
        --modes continuous                              # prefix reuse only

--engine-arms: the engine's layout settings (issue 53), instead of the three modes: the same
prompts answered by the engine with chunked prefill and compaction off (`off`, today's
engine), `chunked` (`prefill_chunk=--prefill-chunk`), `compact` (`compact_at=--compact-at`),
`both`, and the raw decode rate (`raw`) in the same run, at each C; (repeat, C, arm) units
interleaved, the arms' order rotated every repeat. The file is written after every unit and
running the same command again resumes (more --repeats add repeats; other settings refuse).
Each engine unit records its useful tokens/s, the engine's counters (prefill chunks,
compactions, columns dropped, padding attended) and a hash of every reply; the summary gives
per C each arm's median, its ratio to `off` and to `raw` per repeat, and how many replies
are the same as `off`'s.

    python benchmarks/bench_generation.py --engine-arms --repeats 3   # C=8,32 -> results/

--kv-arms: the KV layouts (issue 67): the same prompts answered by the engine with its keys
and values in the block pool (`pool`, `SELFTAUGHT_KV=pool`) and in the dense cache that grows
(`dynamic`), and the raw decode rate (`raw`), each unit in a fresh child process, so that
each has its own peak memory: useful tokens/s, ru_maxrss, the resident memory sampled every
--rss-every seconds (after the load, and its peak), the pool's counters (blocks, most in use,
waits) and a hash of every reply. (repeat, C, arm) units interleaved as --engine-arms's,
resumable the same way; the summary gives per C each arm's medians, tok/s against `dynamic`
and `raw` per repeat, the memory, and the replies the same as `dynamic`'s.

    python benchmarks/bench_generation.py --kv-arms --repeats 3      # C=8,32 -> results/

--host-profile: where the milliseconds of one engine step go when the forward costs almost
nothing (issue 67): a tiny random Llama (2 layers, hidden 64, the real tokenizer's prompts,
replies capped at mixed lengths, no end-of-turn) built in each unit's process, nothing loaded;
the engine's functions timed by self time (building the inputs, the forward, sampling, stop
checks, eviction, delivery, the scheduler, the event loop's share) per decode step, in the
thread's CPU time (steadier than the wall clock on a shared machine), beside the same tiny
model's `generate` (`raw`). --host-arms NAME=SRC... compares source trees (each a `src` folder, e.g.
an older commit's from `git archive`); (repeat, C, arm) units interleaved, each in a process
of its own (what one leaves in the allocator changes the next one's times), resumable as
--kv-arms.

    python benchmarks/bench_generation.py --host-profile --threads 1 --repeats 3 \
        --host-arms before=/tmp/before/src after=src        # -> results/generation_host_cpu.json

Writes benchmarks/results/generation_<device>.json (--engine-arms:
generation_engine_<device>.json, --kv-arms: generation_kv_<device>.json, --host-profile:
generation_host_<device>.json).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from common import RESULTS, RssTrace, command_line, pending_units, resumed_units, rss_gb

from selftaught.models.base import GenerationParams, Message  # noqa: E402
from selftaught.models.local import LocalModel  # noqa: E402
from selftaught.models.raw_rate import raw_decode, static_generate  # noqa: E402
from selftaught.policy import Policy  # noqa: E402
from selftaught.runs import atomic_write_json  # noqa: E402
from selftaught.tasks.registry import load_task  # noqa: E402

MODES = ("continuous", "static", "raw")
ENGINE_ARMS = ("off", "chunked", "compact", "both", "raw")
KV_ARMS = ("pool", "dynamic", "raw")
PREFILL_CHUNK = 256  # tokens per prefill chunk in the chunked arms
COMPACT_AT = 0.25  # the compaction threshold in the compact arms


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model folder or .gguf (default: embedded)")
    p.add_argument("--task", default="gym:basic_arithmetic")
    p.add_argument("--split", default="test")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--raw-tokens", type=int, default=128, help="forced length of the raw run")
    p.add_argument(
        "--raw-batches", type=int, default=2, help="chunks of C prompts timed for the raw rate"
    )
    p.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES))
    p.add_argument("--device", default=None, help="cpu, cuda, mps (default: best available)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument(
        "--shared-prefix",
        type=int,
        nargs="+",
        default=[],
        metavar="N",
        help="also time prompts behind a shared N-token system prompt, with and without reuse",
    )
    p.add_argument(
        "--shape-bound",
        action="store_true",
        help="also time a decode step by rows in the batch, and from it what a perfect engine "
        "would take for each continuous run's batch shape",
    )
    p.add_argument(
        "--engine-arms",
        action="store_true",
        help="time the engine with chunked prefill / compaction off and on, and raw decode, "
        "interleaved, resumable (instead of --modes)",
    )
    p.add_argument(
        "--kv-arms",
        action="store_true",
        help="time the KV pool against the dynamic cache and raw decode, each unit in its own "
        "process (tok/s and peak memory), interleaved, resumable (instead of --modes)",
    )
    p.add_argument("--kv-pool-mb", type=float, default=None, help="for --kv-arms (default: auto)")
    p.add_argument("--rss-every", type=float, default=0.25, help="for --kv-arms: seconds")
    p.add_argument("--kv-unit", choices=KV_ARMS, default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--host-profile",
        action="store_true",
        help="time each part of an engine step on a tiny random model (host work), each unit "
        "in its own process (instead of --modes)",
    )
    p.add_argument(
        "--host-arms",
        nargs="+",
        default=None,
        metavar="NAME=SRC",
        help="for --host-profile: source trees to compare, interleaved (default: this one)",
    )
    p.add_argument("--host-unit", default=None, help=argparse.SUPPRESS)
    p.add_argument("--unit-out", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--prefill-chunk", type=int, default=PREFILL_CHUNK, help="for --engine-arms")
    p.add_argument("--compact-at", type=float, default=COMPACT_AT, help="for --engine-arms")
    p.add_argument("--quick", action="store_true", help="16 prompts, 64 tokens, C=8, 1 repeat")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.quick:
        args.prompts, args.max_tokens, args.concurrency = 16, 64, [8]
        args.repeats, args.raw_tokens, args.raw_batches = 1, 32, 1
    if args.prompts < 1 or args.max_tokens < 1 or args.repeats < 1 or args.raw_tokens < 1:
        p.error("--prompts, --max-tokens, --repeats and --raw-tokens must be >= 1")
    if min(args.concurrency) < 1:
        p.error("--concurrency values must be >= 1")
    if args.shared_prefix and min(args.shared_prefix) < 0:
        p.error("--shared-prefix values must be >= 0")
    if args.prefill_chunk < 1 or not 0 < args.compact_at <= 1:
        p.error("--prefill-chunk must be >= 1 and --compact-at in (0, 1]")
    return args


def load_prompts(args: argparse.Namespace) -> list[list[Message]]:
    task = load_task(args.task, test_size=max(args.prompts, 1))
    examples = task.examples(args.split)[: args.prompts]
    if len(examples) < args.prompts:
        raise SystemExit(f"{args.task} has only {len(examples)} {args.split} examples")
    policy = Policy()
    return [policy.messages(task, ex) for ex in examples]


class Bench:
    """The three ways of answering the same prompts with one loaded model."""

    def __init__(self, local: LocalModel, prompts: list[list[Message]], args: argparse.Namespace):
        import torch

        self.torch = torch
        self.local, self.args = local, args
        self.model, self.tok = local.model, local.tokenizer
        self.eos = set(local._eos_ids)
        self.texts = [local.format_prompt(m) for m in prompts]
        self.prompts = prompts

    def _sync(self) -> None:
        if self.model.device.type == "cuda":
            self.torch.cuda.synchronize()

    def _generate(self, texts: list[str], **kwargs: Any) -> Any:
        return static_generate(self.model, self.tok, sorted(self.eos), texts, **kwargs)

    def continuous(self, c: int) -> tuple[int, float, list[str]]:
        replies, seconds, self.last_stats = self.engine_run(c, self.prompts)
        return sum(r.completion_tokens for r in replies), seconds, [r.text for r in replies]

    def step_costs(self, c: int, steps: int = 24) -> dict[int, float]:
        """Seconds of one decode step of the engine's batcher by rows in the batch (1, 2, 4,
        ..., c), rows forced past their end: what the batch's shape costs, engine aside."""
        from selftaught.models.batching import ContinuousBatcher, GenSequence

        ids = [self.tok(t, add_special_tokens=False)["input_ids"] for t in self.texts]
        sizes = sorted({min(c, 2**i) for i in range(c.bit_length() + 1)})
        costs = {}
        for b in sizes:
            batcher = ContinuousBatcher(self.model, [-1], self.tok.pad_token_id or 0, str)
            rows = [ids[i % len(ids)] for i in range(b)]
            batcher.admit(
                [
                    GenSequence(owner=i, index=0, prompt_ids=p, max_new_tokens=steps)
                    for i, p in enumerate(rows)
                ]
            )
            times = []
            while batcher.rows:
                self._sync()
                t0 = time.perf_counter()
                batcher.step()
                self._sync()
                times.append(time.perf_counter() - t0)
            costs[b] = statistics.median(times[2:])
        return costs

    def engine_run(
        self, c: int, prompts: list[list[Message]], **engine_kwargs: Any
    ) -> tuple[list[Any], float, Any]:
        """C concurrent `achat` calls at a time on a fresh engine: the replies, the wall
        time and the engine's stats."""
        engine = LocalModel.from_pretrained_model(
            self.model, self.tok, max_batch_size=c, **engine_kwargs
        )
        params = GenerationParams(max_tokens=self.args.max_tokens)

        async def run() -> list[Any]:
            gate = asyncio.Semaphore(c)

            async def one(messages: list[Message]) -> Any:
                async with gate:
                    return await engine.achat(messages, params)

            return await asyncio.gather(*(one(m) for m in prompts))

        self._sync()
        t0 = time.perf_counter()
        replies = asyncio.run(run())
        self._sync()
        seconds = time.perf_counter() - t0
        engine.close()
        return replies, seconds, engine.stats

    def static(self, c: int) -> tuple[int, float, list[str]]:
        tokens, texts = 0, []
        self._sync()
        t0 = time.perf_counter()
        for start in range(0, len(self.texts), c):
            for row in self._generate(
                self.texts[start : start + c], max_new_tokens=self.args.max_tokens
            ):
                end = next((i for i, t in enumerate(row) if t in self.eos), None)
                kept = row if end is None else row[: end + 1]
                tokens += len(kept)
                texts.append(self.tok.decode(kept, skip_special_tokens=True))
        self._sync()
        return tokens, time.perf_counter() - t0, texts

    def raw(self, c: int) -> tuple[int, float, list[str]]:
        """The raw decode rate (`selftaught.models.raw_rate`, as `selftaught doctor` takes it)."""
        rate = raw_decode(
            self.model,
            self.tok,
            sorted(self.eos),
            self.texts,
            batch=c,
            tokens=self.args.raw_tokens,
            batches=self.args.raw_batches,
        )
        return rate.tokens, rate.seconds, []


def main() -> None:
    args = parse_args()
    if args.kv_arms and args.kv_unit is None:
        run_kv_arms(args)  # the parent loads nothing: each unit is a process of its own
        return
    if args.host_profile:  # a tiny model only, built in each unit's process
        if args.threads:
            from selftaught.models.threads import fix_threads

            fix_threads(args.threads)
        if args.host_unit is not None:
            host_unit(args)
        else:
            run_host_profile(args)
        return
    if args.threads:
        from selftaught.models.threads import fix_threads

        fix_threads(args.threads)  # the local model keeps to it
    prompts = load_prompts(args)
    t0 = time.perf_counter()
    local = LocalModel(args.model, device=args.device)
    _ = local.model
    load_s = time.perf_counter() - t0
    bench = Bench(local, prompts, args)
    if args.kv_unit is not None:
        kv_unit(bench, args)
        return
    bench.raw(min(args.concurrency))  # warm-up: first calls allocate and tune kernels
    if args.engine_arms:
        run_engine_arms(bench, args, local)
        return
    step_costs = {c: bench.step_costs(c) for c in args.concurrency} if args.shape_bound else {}

    runs: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for c in args.concurrency:
            k = (repeat + args.concurrency.index(c)) % max(1, len(args.modes))
            for mode in args.modes[k:] + args.modes[:k]:  # rotate the order every time
                load_before = os.getloadavg()[0]
                cpu_before = time.process_time()
                tokens, seconds, texts = getattr(bench, mode)(c)
                cpu_seconds = time.process_time() - cpu_before
                run = {
                    "repeat": repeat,
                    "concurrency": c,
                    "mode": mode,
                    "tokens": tokens,
                    "seconds": round(seconds, 3),
                    "tok_per_s": round(tokens / seconds, 2),
                    "cpu_seconds": round(cpu_seconds, 3),
                    "tok_per_cpu_s": round(tokens / cpu_seconds, 2),
                    "load_before": round(load_before, 2),
                    "texts": texts,
                }
                if mode == "continuous":
                    run["engine"] = engine_summary(bench.last_stats, step_costs.get(c))
                runs.append(run)
                print(
                    f"repeat {repeat} C={c:<3} {mode:<10} {tokens:>6} tok {seconds:7.1f} s "
                    f"{tokens / seconds:7.1f} tok/s {tokens / cpu_seconds:7.1f} tok/cpu-s "
                    f"(load {load_before:.1f})",
                    flush=True,
                )
    result = summarize(runs, args, local, load_s)
    if args.shared_prefix:
        result["shared_prefix"] = prefix_runs(bench, args)
    device = str(local.device.type)
    out = args.out or RESULTS / f"generation_{device}{'_quick' if args.quick else ''}.json"
    atomic_write_json(out, result)
    print_summary(result)
    print(f"wrote {out}")


def engine_summary(stats: Any, costs: dict[int, float] | None) -> dict[str, Any]:
    """The engine's own account of a continuous run: forward time by kind, decode steps by
    rows in the batch, prefix reuse; with step costs, the shape bound: the decode time the
    same steps take at the measured cost of a step with that many rows (no prefill, no host
    work, no engine)."""
    out = {
        "prefill_seconds": round(stats.prefill_seconds, 3),
        "decode_seconds": round(stats.decode_seconds, 3),
        "prefill_calls": stats.prefill_calls,
        "prefilled_tokens": stats.prefilled_tokens,
        "prefix_tokens_reused": stats.prefix_tokens_reused,
        "decode_rows": dict(sorted(stats.decode_rows.items())),
    }
    if costs:
        sizes = sorted(costs)

        def cost(rows: int) -> float:  # linear between the measured sizes
            above = next(s for s in sizes if s >= rows)
            below = max((s for s in sizes if s <= rows), default=above)
            if above == below:
                return costs[above]
            w = (rows - below) / (above - below)
            return costs[below] * (1 - w) + costs[above] * w

        out["shape_bound_seconds"] = round(
            sum(n * cost(r) for r, n in stats.decode_rows.items()), 3
        )
        out["step_costs_s"] = {str(k): round(v, 4) for k, v in costs.items()}
    return out


# ---------------------------------------------------------------------- --engine-arms


def engine_arm_settings(arm: str, chunk: int, compact_at: float) -> dict[str, Any]:
    """The `LocalModel` settings of an engine arm (`raw` runs no engine)."""
    settings: dict[str, Any] = {"prefill_chunk": None, "compact_at": None}
    if arm in ("chunked", "both"):
        settings["prefill_chunk"] = chunk
    if arm in ("compact", "both"):
        settings["compact_at"] = compact_at
    return settings


def engine_plan(
    repeats: int, concurrency: list[int], arms: tuple[str, ...] = ENGINE_ARMS
) -> list[tuple[int, int, str]]:
    """(repeat, C, arm) in the order they run: each repeat runs every arm once at each C,
    the arms' order rotated by one per repeat and per C."""
    order = []
    for repeat in range(repeats):
        for j, c in enumerate(concurrency):
            k = (repeat + j) % len(arms)
            order += [(repeat, c, arm) for arm in arms[k:] + arms[:k]]
    return order


def engine_pending(
    order: list[tuple[int, int, str]], runs: list[dict[str, Any]]
) -> list[tuple[int, int, str]]:
    """What is left of `order` after the units already recorded (a resumed benchmark)."""
    return pending_units(order, runs, ("repeat", "concurrency", "arm"))


def engine_settings(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """What must match for a resumed --engine-arms run to add to an earlier one."""
    return {
        "model": model,
        "task": args.task,
        "split": args.split,
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "concurrency": list(args.concurrency),
        "raw_tokens": args.raw_tokens,
        "raw_batches": args.raw_batches,
        "prefill_chunk": args.prefill_chunk,
        "compact_at": args.compact_at,
        "threads": args.threads,
    }


def engine_unit(bench: Bench, c: int, arm: str, args: argparse.Namespace) -> dict[str, Any]:
    """One (C, arm) unit: its tokens, seconds, CPU time and load; an engine arm also its
    counters and a hash of each reply."""
    load_before, cpu_before = os.getloadavg()[0], time.process_time()
    row: dict[str, Any] = {"concurrency": c, "arm": arm}
    if arm == "raw":
        tokens, seconds, _ = bench.raw(c)
    else:
        settings = engine_arm_settings(arm, args.prefill_chunk, args.compact_at)
        replies, seconds, stats = bench.engine_run(c, bench.prompts, **settings)
        tokens = sum(r.completion_tokens for r in replies)
        ttfts = sorted(r.extra["ttft_s"] for r in replies)
        row["engine"] = {
            **engine_summary(stats, None),
            **{k: getattr(stats, k) for k in LAYOUT_COUNTERS},
            "ttft_median_s": round(statistics.median(ttfts), 4),
        }
        row["reply_sha"] = [hashlib.sha256(r.text.encode()).hexdigest()[:12] for r in replies]
    cpu_seconds = time.process_time() - cpu_before
    row.update(
        tokens=tokens,
        seconds=round(seconds, 3),
        tok_per_s=round(tokens / seconds, 2),
        cpu_seconds=round(cpu_seconds, 3),
        tok_per_cpu_s=round(tokens / cpu_seconds, 2) if cpu_seconds > 0 else None,
        load_before=round(load_before, 2),
        load_after=round(os.getloadavg()[0], 2),
    )
    return row


LAYOUT_COUNTERS = (
    "prefill_chunks",
    "max_prefill_tokens",
    "compactions",
    "compacted_columns",
    "decode_columns",
    "decode_live_columns",
)


def summarize_engine_arms(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per C: each arm's tok/s (all, median), its ratio to `off` and to `raw` (paired by
    repeat, then the median), the replies the same as `off`'s (same repeat, the fewest), and
    the padding share of the key columns its decode steps attended."""
    return _per_concurrency(runs, ENGINE_ARMS, _arm_summary)


ArmRows = dict[tuple[int, str], dict[str, Any]]


def _per_concurrency(
    runs: list[dict[str, Any]],
    arms: Sequence[str],
    summary: Callable[[str, list[dict[str, Any]], ArmRows], dict[str, Any]],
) -> dict[str, Any]:
    """Per C, each arm's `summary` of its rows (by repeat), given every run of that C by
    (repeat, arm) to pair with."""
    out: dict[str, Any] = {}
    for c in sorted({r["concurrency"] for r in runs}):
        mine = [r for r in runs if r["concurrency"] == c]
        by = {(r["repeat"], r["arm"]): r for r in mine}
        entry: dict[str, Any] = {}
        for arm in arms:
            rows = sorted((r for r in mine if r["arm"] == arm), key=lambda r: r["repeat"])
            if rows:
                entry[arm] = summary(arm, rows, by)
        out[str(c)] = entry
    return out


def _rates(
    arm: str, rows: list[dict[str, Any]], by: ArmRows, bases: tuple[str, ...]
) -> dict[str, Any]:
    """An arm's tok/s (all, median) and its ratio to each base arm, paired by repeat."""
    rates = [r["tok_per_s"] for r in rows]
    out: dict[str, Any] = {"tok_per_s": rates, "median": statistics.median(rates)}
    for base in bases:
        paired = [
            r["tok_per_s"] / by[(r["repeat"], base)]["tok_per_s"]
            for r in rows
            if (r["repeat"], base) in by and arm != base
        ]
        if paired:
            out[f"vs_{base}"] = round(statistics.median(paired), 3)
            out[f"vs_{base}_per_repeat"] = [round(x, 3) for x in paired]
    return out


def _arm_summary(arm: str, rows: list[dict[str, Any]], by: ArmRows) -> dict[str, Any]:
    out = _rates(arm, rows, by, ("off", "raw"))
    same = [
        _same(r["reply_sha"], by[(r["repeat"], "off")]["reply_sha"])
        for r in rows
        if "reply_sha" in r and (r["repeat"], "off") in by
    ]
    if same:
        out["same_replies_as_off"] = min(same)
    engines = [r["engine"] for r in rows if "engine" in r]
    if engines:
        attended = sum(e["decode_columns"] for e in engines)
        live = sum(e["decode_live_columns"] for e in engines)
        out["padding_attended"] = round(1 - live / attended, 3) if attended else 0.0
        for key in ("prefill_chunks", "compactions", "compacted_columns"):
            out[key] = statistics.median(e[key] for e in engines)
    return out


def _same(a: list[str], b: list[str]) -> int:
    return sum(x == y for x, y in zip(a, b, strict=True))


def run_engine_arms(bench: Bench, args: argparse.Namespace, local: LocalModel) -> None:
    """The --engine-arms benchmark: every pending unit, the file written after each."""
    device = str(local.device.type)
    out = args.out or RESULTS / f"generation_engine_{device}{'_quick' if args.quick else ''}.json"
    settings = engine_settings(args, local.name)
    runs = resumed_units(out, settings)
    for repeat, c, arm in engine_pending(engine_plan(args.repeats, args.concurrency), runs):
        run = {"repeat": repeat, **engine_unit(bench, c, arm, args)}
        runs.append(run)
        result = {
            "command": command_line(),
            "settings": settings,
            "machine": {
                "device": str(local.device),
                "dtype": str(local.model.dtype),
                "cpus": os.cpu_count(),
                "torch_threads": bench.torch.get_num_threads(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
            },
            "summary": summarize_engine_arms(runs),
            "runs": runs,
        }
        atomic_write_json(out, result)  # after every unit: an interruption loses one
        print(
            f"repeat {repeat} C={c:<3} {arm:<8} {run['tokens']:>6} tok {run['seconds']:7.1f} s "
            f"{run['tok_per_s']:7.1f} tok/s (load {run['load_before']:.1f})",
            flush=True,
        )
    for c, entry in summarize_engine_arms(runs).items():
        parts = [
            f"{arm} {e['median']:.1f} tok/s"
            + (f" ({e['vs_off']:.2f}x off)" if "vs_off" in e else "")
            + (f" ({e['vs_raw']:.2f}x raw)" if "vs_raw" in e else "")
            for arm, e in entry.items()
        ]
        print(f"  C={c}: " + ", ".join(parts))
    print(f"wrote {out}")


# ---------------------------------------------------------------------- --kv-arms


def kv_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What must match for a resumed --kv-arms run to add to an earlier one."""
    return {
        "model": args.model or "embedded",
        "task": args.task,
        "split": args.split,
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "concurrency": list(args.concurrency),
        "raw_tokens": args.raw_tokens,
        "raw_batches": args.raw_batches,
        "threads": args.threads,
        "kv_pool_mb": args.kv_pool_mb,
        "dtype": os.environ.get("SELFTAUGHT_DTYPE", "auto"),
    }


def kv_unit_command(args: argparse.Namespace, c: int, arm: str, out: Path) -> list[str]:
    """The child process that runs one (C, arm) unit and writes its row to `out`."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--kv-arms", "--kv-unit", arm]
    cmd += ["--concurrency", str(c), "--unit-out", str(out), "--task", args.task]
    cmd += ["--split", args.split, "--prompts", str(args.prompts)]
    cmd += ["--max-tokens", str(args.max_tokens), "--raw-tokens", str(args.raw_tokens)]
    cmd += ["--raw-batches", str(args.raw_batches), "--rss-every", str(args.rss_every)]
    for flag, value in (
        ("--model", args.model),
        ("--device", args.device),
        ("--threads", args.threads),
        ("--kv-pool-mb", args.kv_pool_mb),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def kv_unit(bench: Bench, args: argparse.Namespace) -> None:
    """In the child: one unit, its memory traced from just after the model loaded; a short
    warm-up through the same arm first (the first forwards allocate and tune kernels)."""
    c, arm = args.concurrency[0], args.kv_unit
    after_load = rss_gb()
    row: dict[str, Any] = {
        "concurrency": c,
        "arm": arm,
        "rss_after_load_gb": None if after_load is None else round(after_load, 3),
    }
    settings = {} if arm == "raw" else {"kv": arm, "kv_pool_mb": args.kv_pool_mb}
    if arm == "raw":
        bench.raw(c)
    else:
        warm = GenerationParams(max_tokens=4)
        engine = LocalModel.from_pretrained_model(bench.model, bench.tok, **settings)
        engine.generate_batch(bench.prompts[:2], warm)
        engine.close()
    load_before, cpu_before = os.getloadavg()[0], time.process_time()
    with RssTrace(args.rss_every) as trace:
        if arm == "raw":
            tokens, seconds, _ = bench.raw(c)
        else:
            replies, seconds, stats = bench.engine_run(c, bench.prompts, **settings)
            tokens = sum(r.completion_tokens for r in replies)
            row["engine"] = {
                **engine_summary(stats, None),
                **{k: getattr(stats, k) for k in LAYOUT_COUNTERS + KV_COUNTERS},
            }
            row["reply_sha"] = [hashlib.sha256(r.text.encode()).hexdigest()[:12] for r in replies]
    cpu_seconds = time.process_time() - cpu_before
    row.update(
        tokens=tokens,
        seconds=round(seconds, 3),
        tok_per_s=round(tokens / seconds, 2),
        cpu_seconds=round(cpu_seconds, 3),
        load_before=round(load_before, 2),
        load_after=round(os.getloadavg()[0], 2),
        dtype=str(bench.model.dtype),
        **trace.summary(),
    )
    atomic_write_json(args.unit_out, row)


KV_COUNTERS = ("kv_pool_blocks", "kv_block_tokens", "kv_peak_blocks", "kv_waits")


def run_kv_arms(args: argparse.Namespace) -> None:
    """The --kv-arms benchmark: every pending unit in a child process, the file written
    after each."""
    device = args.device or "auto"
    out = args.out or RESULTS / f"generation_kv_{device}{'_quick' if args.quick else ''}.json"
    settings = kv_settings(args)
    runs = resumed_units(out, settings)
    for repeat, c, arm in engine_pending(
        engine_plan(args.repeats, args.concurrency, KV_ARMS), runs
    ):
        with tempfile.TemporaryDirectory() as tmp:
            unit_out = Path(tmp) / "unit.json"
            subprocess.run(kv_unit_command(args, c, arm, unit_out), check=True)
            run = {"repeat": repeat, **json.loads(unit_out.read_text())}
        runs.append(run)
        result = {
            "command": command_line(),
            "settings": settings,
            "machine": {
                "device": device,
                "cpus": os.cpu_count(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
            },
            "summary": summarize_kv_arms(runs),
            "runs": runs,
        }
        atomic_write_json(out, result)  # after every unit: an interruption loses one
        print(
            f"repeat {repeat} C={c:<3} {arm:<8} {run['tok_per_s']:7.1f} tok/s, max RSS "
            f"{run['max_rss_gb']:.2f} GB (after load {run['rss_after_load_gb'] or 0:.2f}) "
            f"(load {run['load_before']:.1f})",
            flush=True,
        )
    for c, entry in summarize_kv_arms(runs).items():
        parts = [
            f"{arm} {e['median']:.1f} tok/s, {e['max_rss_gb']:.2f} GB"
            + (f" ({e['vs_dynamic']:.2f}x dynamic)" if "vs_dynamic" in e else "")
            + (f" ({e['vs_raw']:.2f}x raw)" if "vs_raw" in e else "")
            for arm, e in entry.items()
        ]
        print(f"  C={c}: " + ", ".join(parts))
    print(f"wrote {out}")


def summarize_kv_arms(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per C: each arm's tok/s (all, median), its ratio to `dynamic` and to `raw` (paired by
    repeat, then the median), its memory (medians of ru_maxrss, of the sampled peak, and of
    the peak over what the process held after loading) and the replies the same as
    `dynamic`'s (same repeat, the fewest)."""
    return _per_concurrency(runs, KV_ARMS, _kv_arm_summary)


def _kv_arm_summary(arm: str, rows: list[dict[str, Any]], by: ArmRows) -> dict[str, Any]:
    out = _rates(arm, rows, by, ("dynamic", "raw"))
    out["max_rss_gb"] = statistics.median(r["max_rss_gb"] for r in rows)
    peaks = [r["peak_rss_gb"] for r in rows if r.get("peak_rss_gb") is not None]
    if peaks:
        out["peak_rss_gb"] = statistics.median(peaks)
        grown = [
            r["peak_rss_gb"] - r["rss_after_load_gb"]
            for r in rows
            if r.get("peak_rss_gb") is not None and r.get("rss_after_load_gb") is not None
        ]
        if grown:
            out["peak_over_load_gb"] = round(statistics.median(grown), 3)
    same = [
        _same(r["reply_sha"], by[(r["repeat"], "dynamic")]["reply_sha"])
        for r in rows
        if "reply_sha" in r and (r["repeat"], "dynamic") in by and arm != "dynamic"
    ]
    if same:
        out["same_replies_as_dynamic"] = min(same)
    engines = [r["engine"] for r in rows if "engine" in r]
    if engines and arm == "pool":
        out["kv_peak_blocks"] = max(e["kv_peak_blocks"] for e in engines)
        out["kv_pool_blocks"] = engines[0]["kv_pool_blocks"]
        out["kv_waits"] = max(e["kv_waits"] for e in engines)
    return out


# ---------------------------------------------------------------------- --host-profile

# The engine's functions timed, by where they are defined: (module, class, function,
# part). A part's time is its functions' self time (less the timed calls they make), so the
# parts add up to the run's time; what no timed function holds is the event loop's (hand-offs,
# the callers' coroutines). A name a source tree lacks is skipped.
HOST_TIMED = (
    ("selftaught.models.local_scheduler", "RequestScheduler", "_drive_step", "scheduler"),
    ("selftaught.models.local_scheduler", "RequestScheduler", "_settled", "scheduler"),
    ("selftaught.models.local_scheduler", "RequestScheduler", "_intake", "intake"),
    ("selftaught.models.local_scheduler", "RequestScheduler", "_serve_step", "scheduler"),
    ("selftaught.models.local_scheduler", "RequestScheduler", "_drop_abandoned", "scheduler"),
    ("selftaught.models.local_scheduler", "RequestScheduler", "_deliver", "deliver"),
    ("selftaught.models.batching", "ContinuousBatcher", "admit", "admission"),
    ("selftaught.models.batching", "ContinuousBatcher", "_advance_joining", "admission"),
    ("selftaught.models.batching", "ContinuousBatcher", "_step", "bookkeeping"),
    ("selftaught.models.paged", "PagedBatcher", "_step", "bookkeeping"),
    ("selftaught.models.paged", "PagedBatcher", "_plan", "inputs"),
    ("selftaught.models.paged", "PagedBatcher", "_decode_inputs", "inputs"),
    ("selftaught.models.batching", "ContinuousBatcher", "_forward", "forward_call"),
    ("selftaught.models.batching", "ContinuousBatcher", "_sample", "sample"),
    ("selftaught.models.batching", "ContinuousBatcher", "_evict_finished", "evict"),
)
# What each part is, in the order reported (`model_forward` and `kv_cache` are timed inside
# the forward: the tiny model's `forward` and the engine's cache update per layer).
HOST_PARTS = {
    "inputs": "block tables, slots, mask, ids, positions of a decode step",
    "forward_call": "the engine's wrapper around the model call (mode switch, logits cast)",
    "model_forward": "transformers' forward of the tiny model, less the cache updates",
    "kv_cache": "the engine's cache update in each layer (write the new keys, gather the rows)",
    "sample": "argmax / sampling, tokens to Python",
    "bookkeeping": "the rest of a decode step: each row's token appended and its stop "
    "checks (end-of-turn, cap, stop strings), counters",
    "evict": "rows that finished leave the batch (blocks released)",
    "deliver": "finished rows become replies (detokenised, futures resolved)",
    "intake": "new requests into sequences (the chat template, tokenising)",
    "scheduler": "refills, finished and abandoned requests, the thread governor",
    "admission": "prefilling newcomers, host part (prefill forwards not included)",
    "prefill_forward": "the prefill forwards (their cache updates included)",
    "event_loop": "the rest of the thread's time: hand-offs to the callers and back",
}


class HostTimer:
    """Self time by part of the functions it wraps: a call's time less that of the timed
    calls it makes (by default the thread's CPU time: what the step costs, whatever else
    runs on the machine). Inside `admission`, a `forward call` is a `prefill forward` and
    nothing else is timed apart."""

    def __init__(self, clock: Callable[[], float] = time.thread_time) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.calls = 0
        self._stack: list[list[Any]] = []  # [part, seconds of timed calls inside]
        self._within: str | None = None  # the opaque part being timed (`_OPAQUE`)
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, fn: Callable[..., Any], part: str) -> Callable[..., Any]:
        import functools

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = self._stack
            mine = part
            if self._within == "admission" and part == "forward_call":
                mine = "prefill_forward"
            elif self._within is not None:
                return fn(*args, **kwargs)
            outer, self._within = self._within, self._within or _OPAQUE.get(mine)
            frame: list[Any] = [mine, 0.0]
            stack.append(frame)
            t0 = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = self.clock() - t0
                self._within = outer
                stack.pop()
                self.seconds[mine] = self.seconds.get(mine, 0.0) + elapsed - frame[1]
                self.calls += 1
                if stack:
                    stack[-1][1] += elapsed

        return timed

    def patch(self, owner: Any, name: str, part: str) -> bool:
        """Time `owner.name` (a function defined on it) as `part` until `restore`."""
        fn = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if fn is None:
            return False
        self._undo.append((owner, name, vars(owner).get(name, _MISSING)))
        setattr(owner, name, self.wrap(fn, part))
        return True

    def restore(self) -> None:
        for owner, name, old in reversed(self._undo):
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._undo.clear()


_MISSING = object()
_OPAQUE = {"admission": "admission", "prefill_forward": "prefill_forward"}


def host_parts_ms(seconds: dict[str, float], total: float, steps: int) -> dict[str, float]:
    """Milliseconds per decode step of each part (`HOST_PARTS`' order); the event loop's is
    what no part holds of `total`."""
    parts = {**seconds, "event_loop": total - sum(seconds.values())}
    per = max(1, steps)
    return {k: round(1000 * parts.get(k, 0.0) / per, 4) for k in HOST_PARTS}


def tiny_host_model(tokenizer: Any, eos_ids: Sequence[int], seed: int = 0) -> Any:
    """A 2-layer random Llama over the real tokenizer's ids whose replies draw from its
    first 512 tokens, never an end-of-turn one (replies run to their caps): a forward that
    costs almost nothing, so that what a step takes is the engine's host work."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=list(eos_ids),
        pad_token_id=tokenizer.pad_token_id or min(eos_ids),
        tie_word_embeddings=False,
    )
    generator = torch.Generator().manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    model.lm_head = torch.nn.Linear(64, 512, bias=True)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
        model.lm_head.bias[[i for i in eos_ids if i < 512]] = -1e4
    return model.eval()


def reply_caps(n: int, max_tokens: int, seed: int = 0) -> list[int]:
    """Mixed reply lengths: `n` token caps drawn evenly from 8 to 11/16 of `max_tokens` (92 on
    average for 256: the embedded model's mean reply on the benchmark's prompts was 92.5)."""
    import random

    rng = random.Random(seed)
    return [rng.randint(8, max(8, max_tokens * 11 // 16)) for _ in range(n)]


def host_settings(args: argparse.Namespace, arms: dict[str, str]) -> dict[str, Any]:
    """What must match for a resumed --host-profile run to add to an earlier one."""
    return {
        "model": "tiny random Llama (2 layers, hidden 64, 512 reply tokens)",
        "tokenizer": args.model or "embedded",
        "task": args.task,
        "split": args.split,
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "concurrency": list(args.concurrency),
        "raw_tokens": args.raw_tokens,
        "raw_batches": args.raw_batches,
        "threads": args.threads,
        "kv": os.environ.get("SELFTAUGHT_KV", "pool"),
        "arms": arms,
    }


def host_arms(args: argparse.Namespace) -> dict[str, str]:
    """--host-arms as {name: src folder}; by default one arm, the selftaught this runs."""
    if not args.host_arms:
        import selftaught

        return {"here": str(Path(selftaught.__file__).resolve().parents[1])}
    arms = {}
    for spec in args.host_arms:
        name, sep, src = spec.partition("=")
        if not sep or name in ("", "raw") or not (Path(src) / "selftaught").is_dir():
            raise SystemExit(f"--host-arms takes NAME=SRC (SRC holding selftaught/), got {spec}")
        arms[name] = str(Path(src).resolve())
    return arms


def host_unit_command(args: argparse.Namespace, c: int, arm: str, out: Path) -> list[str]:
    """The child process that runs one --host-profile unit and writes its row to `out`."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--host-profile", "--host-unit", arm]
    cmd += ["--concurrency", str(c), "--unit-out", str(out), "--task", args.task]
    cmd += ["--split", args.split, "--prompts", str(args.prompts)]
    cmd += ["--max-tokens", str(args.max_tokens), "--raw-tokens", str(args.raw_tokens)]
    cmd += ["--raw-batches", str(args.raw_batches)]
    for flag, value in (("--model", args.model), ("--threads", args.threads)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def run_host_profile(args: argparse.Namespace) -> None:
    """The --host-profile benchmark: every pending unit in a child process running its arm's
    source (`raw`: the tiny model's `generate`, in a process of its own), the file written
    after each."""
    arms = host_arms(args)
    out = args.out or RESULTS / "generation_host_cpu.json"
    settings = host_settings(args, arms)
    runs = resumed_units(out, settings)
    names = (*arms, "raw")
    for repeat, c, arm in engine_pending(engine_plan(args.repeats, args.concurrency, names), runs):
        with tempfile.TemporaryDirectory() as tmp:
            unit_out = Path(tmp) / "unit.json"
            paths = [arms.get(arm), os.environ.get("PYTHONPATH")]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
            subprocess.run(host_unit_command(args, c, arm, unit_out), check=True, env=env)
            run = {"repeat": repeat, **json.loads(unit_out.read_text())}
        runs.append(run)
        result = {
            "command": command_line(),
            "settings": settings,
            "parts": HOST_PARTS,
            "machine": {"cpus": os.cpu_count(), "load_average": list(os.getloadavg())},
            "summary": summarize_host(runs, names),
            "runs": runs,
        }
        atomic_write_json(out, result)  # after every unit: an interruption loses one
        host = f", host {run['host_ms_per_step']:.3f}" if "host_ms_per_step" in run else ""
        print(
            f"repeat {repeat} C={c:<3} {arm:<8} {run['ms_per_step']:.3f} ms/step{host}, "
            f"{run['tok_per_cpu_s']:.0f} tok/cpu-s (load {run['load_before']:.1f})",
            flush=True,
        )
    for c, entry in summarize_host(runs, names).items():
        parts = [
            f"{arm} {e['ms_per_step']:.3f} ms/step"
            + (f" (host {e['host_ms_per_step']:.3f})" if "host_ms_per_step" in e else "")
            + (f" {e['vs_raw']:.2f}x raw" if "vs_raw" in e else "")
            for arm, e in entry.items()
        ]
        print(f"  C={c}: " + ", ".join(parts))
    print(f"wrote {out}")


def summarize_host(runs: list[dict[str, Any]], arms: Sequence[str]) -> dict[str, Any]:
    """Per C and arm: the medians over repeats of the CPU ms a decode step takes, of its host
    share and of each part; tokens per CPU second and their ratio to raw's (paired by
    repeat); the replies the same as the first arm's (same repeat, the fewest)."""
    first = arms[0]

    def summary(arm: str, rows: list[dict[str, Any]], by: ArmRows) -> dict[str, Any]:
        keys = ("ms_per_step", "wall_ms_per_step", "tok_per_cpu_s")
        if arm != "raw":
            keys += ("host_ms_per_step", "decode_steps")
        out: dict[str, Any] = {
            key: round(statistics.median(r[key] for r in rows), 4) for key in keys
        }
        if arm != "raw":
            out["parts_ms"] = {
                part: round(statistics.median(r["parts_ms"][part] for r in rows), 4)
                for part in HOST_PARTS
            }
        out["load_before"] = [r["load_before"] for r in rows]
        paired = [
            r["tok_per_cpu_s"] / by[(r["repeat"], "raw")]["tok_per_cpu_s"]
            for r in rows
            if (r["repeat"], "raw") in by and arm != "raw"
        ]
        if paired:
            out["vs_raw"] = round(statistics.median(paired), 3)
            out["vs_raw_per_repeat"] = [round(x, 3) for x in paired]
        same = [
            _same(r["reply_sha"], by[(r["repeat"], first)]["reply_sha"])
            for r in rows
            if (r["repeat"], first) in by and arm not in (first, "raw")
        ]
        if same:
            out[f"same_replies_as_{first}"] = min(same)
        return out

    return _per_concurrency(runs, arms, summary)


def host_unit(args: argparse.Namespace) -> None:
    """In the child: the tiny model; for `raw` its `generate` at C, forced to --raw-tokens;
    for an engine arm a warm-up run of the engine, then one timed run at C."""
    import importlib

    import torch
    import transformers

    import selftaught
    from selftaught.models import embedded
    from selftaught.models.local_prompts import eos_token_ids

    c, arm = args.concurrency[0], args.host_unit
    cached = embedded.cache_root() / "models" / embedded.EMBEDDED_NAME
    folder = Path(args.model) if args.model else cached
    if not folder.exists():  # the embedded model, not yet converted
        folder = embedded.embedded_model_dir()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    texts = load_prompts(args)
    eos = eos_token_ids(tok)
    model = tiny_host_model(tok, eos)
    row: dict[str, Any] = {"concurrency": c, "arm": arm, "torch_threads": torch.get_num_threads()}
    load_before = os.getloadavg()[0]
    if arm == "raw":
        formatted = [LocalModel.from_pretrained_model(model, tok).format_prompt(m) for m in texts]
        cpu0 = time.thread_time()
        rate = raw_decode(
            model, tok, eos, formatted, batch=c, tokens=args.raw_tokens, batches=args.raw_batches
        )
        cpu = time.thread_time() - cpu0
        steps = rate.tokens // c
        row.update(tokens=rate.tokens, seconds=round(rate.seconds, 3), cpu_seconds=round(cpu, 3))
        row.update(
            ms_per_step=round(1000 * cpu / steps, 4),
            wall_ms_per_step=round(1000 * rate.seconds / steps, 4),
            tok_per_cpu_s=round(rate.tokens / cpu, 2),
        )
        row.update(load_before=round(load_before, 2), load_after=round(os.getloadavg()[0], 2))
        atomic_write_json(args.unit_out, row)
        return
    caps = reply_caps(len(texts), args.max_tokens)

    def engine_run(
        prompts: list[list[Message]], caps: list[int]
    ) -> tuple[list[Any], float, float, Any]:
        engine = LocalModel.from_pretrained_model(model, tok, max_batch_size=c)

        async def run() -> list[Any]:
            gate = asyncio.Semaphore(c)

            async def one(messages: list[Message], cap: int) -> Any:
                async with gate:
                    return await engine.achat(messages, GenerationParams(max_tokens=cap))

            return await asyncio.gather(*(one(m, k) for m, k in zip(prompts, caps, strict=True)))

        t0, cpu0 = time.perf_counter(), time.thread_time()
        replies = asyncio.run(run())
        cpu, seconds = time.thread_time() - cpu0, time.perf_counter() - t0
        engine.close()
        return replies, seconds, cpu, engine.stats

    engine_run(texts[: 2 * c], [8] * min(len(texts), 2 * c))  # warm-up
    timer = HostTimer()
    for module, owner, name, part in HOST_TIMED:
        mod = importlib.import_module(module)
        if hasattr(mod, owner):
            timer.patch(getattr(mod, owner), name, part)
    timer.patch(model, "forward", "model_forward")
    from selftaught.models import paged

    if hasattr(paged, "_view_class"):
        timer.patch(paged._view_class(), "update", "kv_cache")
    load_before = os.getloadavg()[0]
    try:
        replies, seconds, cpu, stats = engine_run(texts, caps)
    finally:
        timer.restore()
    steps = stats.decode_steps
    parts = host_parts_ms(timer.seconds, cpu, steps)
    ms = 1000 * cpu / steps
    tokens = sum(r.completion_tokens for r in replies)
    sources = [
        Path(importlib.import_module(m).__file__ or "").read_bytes()
        for m in sorted({t[0] for t in HOST_TIMED} | {"selftaught.models.kv_pool"})
    ]
    row.update(
        source=str(Path(selftaught.__file__).resolve().parents[1]),
        engine_sha=hashlib.sha256(b"".join(sources)).hexdigest()[:12],
        decode_steps=steps,
        tokens=tokens,
        seconds=round(seconds, 3),
        cpu_seconds=round(cpu, 3),
        ms_per_step=round(ms, 4),
        host_ms_per_step=round(ms - parts["model_forward"] - parts["prefill_forward"], 4),
        wall_ms_per_step=round(1000 * seconds / steps, 4),
        tok_per_cpu_s=round(tokens / cpu, 2),
        parts_ms=parts,
        timed_calls_per_step=round(timer.calls / max(1, steps), 1),
        reply_sha=[hashlib.sha256(r.text.encode()).hexdigest()[:12] for r in replies],
        load_before=round(load_before, 2),
        load_after=round(os.getloadavg()[0], 2),
    )
    atomic_write_json(args.unit_out, row)


SKILL_RULES = (
    "Rule {i}: read the whole question before answering; name the operation you will do; do it "
    "step by step, one digit at a time; check the result with the inverse operation; give the "
    "final answer on its own line, as a number, with no units and no other words. "
)


def shared_system_prompt(tok: Any, n_tokens: int) -> str:
    """A skill-like system prompt of about `n_tokens` tokens (numbered rules)."""
    text, i = "", 1
    while len(tok(text, add_special_tokens=False)["input_ids"]) < n_tokens:
        text += SKILL_RULES.format(i=i)
        i += 1
    ids = tok(text, add_special_tokens=False)["input_ids"][:n_tokens]
    return tok.decode(ids)


def prefix_runs(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """Per shared-prefix length and concurrency: the engine with prefix reuse and without,
    interleaved (the order alternating per repeat), each on a fresh engine (a cold cache):
    time to first token and useful tokens/s."""
    out: dict[str, Any] = {}
    for n in args.shared_prefix:
        system = shared_system_prompt(bench.tok, n) if n else ""
        prompts = [
            ([{"role": "system", "content": system}] if system else []) + [m[-1]]
            for m in bench.prompts
        ]
        for c in args.concurrency:
            arms: dict[str, list[dict[str, Any]]] = {"reuse": [], "no_reuse": []}
            for repeat in range(args.repeats):
                order = ["reuse", "no_reuse"][:: 1 if repeat % 2 == 0 else -1]
                for arm in order:
                    mb = {} if arm == "reuse" else {"prefix_cache_mb": 0}
                    replies, seconds, stats = bench.engine_run(c, prompts, **mb)
                    run = prefix_run_row(replies, seconds, stats)
                    arms[arm].append(run)
                    print(
                        f"prefix {n:>5} C={c:<3} {arm:<8} {run['tok_per_s']:7.1f} tok/s, "
                        f"TTFT median {run['ttft_median_s']:.3f} s p90 {run['ttft_p90_s']:.3f} s "
                        f"(load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
            out[f"{n}/C={c}"] = summarize_prefix(arms, n, c)
    return out


def prefix_run_row(replies: list[Any], seconds: float, stats: Any) -> dict[str, Any]:
    ttfts = sorted(r.extra["ttft_s"] for r in replies)
    tokens = sum(r.completion_tokens for r in replies)
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tok_per_s": round(tokens / seconds, 2),
        "ttft_median_s": round(statistics.median(ttfts), 4),
        "ttft_p90_s": round(ttfts[int(0.9 * (len(ttfts) - 1))], 4),
        "prompt_tokens": sum(r.prompt_tokens for r in replies),
        "prefilled_tokens": stats.prefilled_tokens,
        "prefix_tokens_reused": stats.prefix_tokens_reused,
        "prefill_seconds": round(stats.prefill_seconds, 3),
        "decode_seconds": round(stats.decode_seconds, 3),
        "texts": [r.text for r in replies],
        "load_after": round(os.getloadavg()[0], 2),
    }


def summarize_prefix(arms: dict[str, list[dict[str, Any]]], n: int, c: int) -> dict[str, Any]:
    pairs = list(zip(arms["reuse"], arms["no_reuse"], strict=True))
    entry: dict[str, Any] = {"shared_prefix_tokens": n, "concurrency": c}
    for arm, runs in arms.items():
        entry[arm] = {
            "tok_per_s": statistics.median(r["tok_per_s"] for r in runs),
            "ttft_median_s": statistics.median(r["ttft_median_s"] for r in runs),
            "ttft_p90_s": statistics.median(r["ttft_p90_s"] for r in runs),
            "runs": [{k: v for k, v in r.items() if k != "texts"} for r in runs],
        }
    entry["throughput_ratio"] = round(
        statistics.median(a["tok_per_s"] / b["tok_per_s"] for a, b in pairs), 3
    )
    entry["ttft_ratio"] = round(
        statistics.median(a["ttft_median_s"] / b["ttft_median_s"] for a, b in pairs), 3
    )
    entry["same_replies"] = sum(
        x == y for x, y in zip(pairs[0][0]["texts"], pairs[0][1]["texts"], strict=True)
    )
    return entry


def summarize(
    runs: list[dict[str, Any]], args: argparse.Namespace, local: LocalModel, load_s: float
) -> dict[str, Any]:
    import torch

    by_c: dict[str, Any] = {}
    for c in args.concurrency:
        mine = [r for r in runs if r["concurrency"] == c]
        rates = {m: [r["tok_per_s"] for r in mine if r["mode"] == m] for m in args.modes}
        cpu_rates = {m: [r["tok_per_cpu_s"] for r in mine if r["mode"] == m] for m in args.modes}
        entry: dict[str, Any] = {
            m: {
                "tok_per_s": rates[m],
                "median": round(statistics.median(rates[m]), 2),
                "tok_per_cpu_s": cpu_rates[m],
            }
            for m in args.modes
        }
        if "raw" in args.modes:
            for m in ("continuous", "static"):
                if m in args.modes:
                    ratios = [a / b for a, b in zip(rates[m], rates["raw"], strict=True)]
                    entry[f"{m}_vs_raw"] = round(statistics.median(ratios), 3)
                    cpu = [a / b for a, b in zip(cpu_rates[m], cpu_rates["raw"], strict=True)]
                    entry[f"{m}_vs_raw_cpu_time"] = round(statistics.median(cpu), 3)
        replies = {m: [r for r in mine if r["mode"] == m] for m in ("continuous", "static")}
        if replies["continuous"] and replies["static"]:
            a, b = replies["continuous"][0]["texts"], replies["static"][0]["texts"]
            entry["same_replies_as_static"] = sum(x == y for x, y in zip(a, b, strict=True))
        if replies["continuous"]:
            entry["mean_reply_tokens"] = round(replies["continuous"][0]["tokens"] / args.prompts, 1)
            bounds = [
                r["tokens"] / r["engine"]["shape_bound_seconds"]
                for r in replies["continuous"]
                if r["engine"].get("shape_bound_seconds")
            ]
            if bounds and "raw" in args.modes:
                # what a perfect engine reaches on this batch shape, against the raw rate
                entry["shape_bound_vs_raw"] = round(
                    statistics.median(bounds) / statistics.median(rates["raw"]), 3
                )
        by_c[str(c)] = entry
    return {
        "model": local.name,
        "task": args.task,
        "split": args.split,
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "raw_tokens": args.raw_tokens,
        "raw_batches": args.raw_batches,
        "repeats": args.repeats,
        "quick": args.quick,
        "load_s": round(load_s, 2),
        "results": by_c,
        "runs": [{k: v for k, v in r.items() if k != "texts"} for r in runs],
        "machine": {
            "device": str(local.device),
            "dtype": str(local.model.dtype),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
    }


def print_summary(result: dict[str, Any]) -> None:
    print(f"\n{result['model']} on {result['machine']['device']}, {result['prompts']} prompts")
    for c, entry in result["results"].items():
        parts = [f"{m} {entry[m]['median']:.1f} tok/s" for m in MODES if m in entry]
        ratios = [f"{k} {v:.2f}x" for k, v in entry.items() if "_vs_raw" in k]
        print(f"  C={c}: " + ", ".join(parts) + ("; " + ", ".join(ratios) if ratios else ""))
    for key, e in result.get("shared_prefix", {}).items():
        r, b = e["reuse"], e["no_reuse"]
        print(
            f"  shared prefix {key}: TTFT {r['ttft_median_s']:.3f} s vs {b['ttft_median_s']:.3f} s "
            f"without reuse ({e['ttft_ratio']:.2f}x), {r['tok_per_s']:.1f} vs "
            f"{b['tok_per_s']:.1f} tok/s ({e['throughput_ratio']:.2f}x), "
            f"{e['same_replies']} same replies"
        )


if __name__ == "__main__":
    main()
