"""The quick-start eval alone and beside one busy process: do the local model's threads follow
the free cores?

Measured before the threads did (issue 53): `selftaught eval` of 40 quick-start items took
56-71 s alone, 140 s beside one busy process, and 62 s beside it with one thread. Three arms,
each the same command (`selftaught eval` of the first 40 test items of the README's quick-start
task, its max tokens), interleaved and rotated every repeat so that load on the machine falls on
all of them alike:

- `alone`: as selftaught runs now (the threads follow the free cores);
- `busy`: the same beside one busy process (`python -c "while True: pass"`);
- `busy_all_cores`: beside it with the old behaviour: torch's default threads, fixed
  (`SELFTAUGHT_THREADS`), whatever the other process takes.

Target: the median of `busy` at most 1.2x the median of `alone`. Every run records its wall
time and the load average before and after; the file is written after every run, and running
the script again resumes (with more --repeats, it adds repeats). Run it on a quiet machine.

    python benchmarks/bench_busy.py                 # 3 repeats -> results/busy.json
    python benchmarks/bench_busy.py --repeats 5     # resumes, adds two repeats
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_quickstart import MAX_TOKENS, TASK, TEST_SIZE
from common import RESULTS, command_line, machine_info, pending_units, resumed_units

from selftaught.runs import atomic_write_json

ARMS = ("alone", "busy", "busy_all_cores")
TARGET = 1.2  # busy / alone, medians
ITEMS = 40
BUSY_CODE = "while True: pass"


def plan(repeats: int, arms: Sequence[str] = ARMS) -> list[tuple[int, str]]:
    """(repeat, arm) in the order they run: every repeat runs each arm once, the order
    rotated by one each repeat."""
    order: list[tuple[int, str]] = []
    for repeat in range(repeats):
        k = repeat % len(arms)
        order += [(repeat, arm) for arm in [*arms[k:], *arms[:k]]]
    return order


def pending(
    order: Sequence[tuple[int, str]], runs: Sequence[dict[str, Any]]
) -> list[tuple[int, str]]:
    """What is left of `order` after the runs already recorded (a resumed benchmark)."""
    return pending_units(order, runs, ("repeat", "arm"))


def eval_command(items: int, output: str) -> list[str]:
    """The quick-start eval: the first `items` of the README's test split."""
    return [
        "selftaught",
        "eval",
        "--task",
        TASK,
        "--model",
        "local",
        "--split",
        "test",
        "--test-size",
        str(TEST_SIZE),
        "--limit",
        str(items),
        "--max-tokens",
        str(MAX_TOKENS),
        "--output",
        output,
    ]


def arm_env(arm: str, base: dict[str, str], all_cores: int) -> dict[str, str]:
    """The environment of one arm: the threads follow the machine, or (the old behaviour)
    are fixed at torch's default."""
    env = {k: v for k, v in base.items() if k != "SELFTAUGHT_THREADS"}
    if arm == "busy_all_cores":
        env["SELFTAUGHT_THREADS"] = str(all_cores)
    return env


def summarize(runs: Sequence[dict[str, Any]], target: float = TARGET) -> dict[str, Any]:
    """Per arm: the seconds of each run and their median; the ratios to `alone` (of the
    medians, and per repeat); whether `busy` met the target."""
    arms: dict[str, Any] = {}
    for arm in ARMS:
        seconds = [r["seconds"] for r in runs if r["arm"] == arm]
        if seconds:
            arms[arm] = {"seconds": seconds, "median": round(statistics.median(seconds), 1)}
    out: dict[str, Any] = {"arms": arms, "target_busy_vs_alone": target}
    if "alone" not in arms:
        return out
    alone = {r["repeat"]: r["seconds"] for r in runs if r["arm"] == "alone"}
    for arm in ARMS[1:]:
        if arm not in arms:
            continue
        out[f"{arm}_vs_alone"] = round(arms[arm]["median"] / arms["alone"]["median"], 3)
        paired = [
            round(r["seconds"] / alone[r["repeat"]], 3)
            for r in runs
            if r["arm"] == arm and r["repeat"] in alone
        ]
        out[f"{arm}_vs_alone_per_repeat"] = paired
    if "busy_vs_alone" in out:
        out["met"] = out["busy_vs_alone"] <= target
    return out


def run_once(arm: str, items: int, all_cores: int) -> dict[str, Any]:
    """One eval, beside a busy process for the busy arms: its seconds and the load."""
    busy = None
    if arm != "alone":
        busy = subprocess.Popen([sys.executable, "-c", BUSY_CODE])
        time.sleep(1.0)  # let it take its core
    try:
        with tempfile.TemporaryDirectory() as tmp:
            env = arm_env(arm, dict(os.environ), all_cores)
            load0, t0 = os.getloadavg(), time.perf_counter()
            subprocess.run(
                eval_command(items, str(Path(tmp) / "eval.jsonl")),
                check=True,
                env=env,
                stdout=subprocess.DEVNULL,
            )
            seconds = time.perf_counter() - t0
            load1 = os.getloadavg()
    finally:
        if busy is not None:
            busy.terminate()
            busy.wait()
    return {
        "arm": arm,
        "seconds": round(seconds, 1),
        "threads_setting": env.get("SELFTAUGHT_THREADS"),
        "load_average": {
            "start": [round(x, 2) for x in load0],
            "end": [round(x, 2) for x in load1],
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--items", type=int, default=ITEMS)
    p.add_argument("--out", type=Path, default=RESULTS / "busy.json")
    a = p.parse_args()
    from selftaught.models.threads import torch_default_threads, usable_cpus

    all_cores = torch_default_threads() or len(usable_cpus())
    settings = {"task": TASK, "items": a.items, "max_tokens": MAX_TOKENS, "all_cores": all_cores}
    runs = resumed_units(a.out, settings)
    for repeat, arm in pending(plan(a.repeats), runs):
        run = {"repeat": repeat, **run_once(arm, a.items, all_cores)}
        runs.append(run)
        result = {
            "command": command_line(),
            "machine": machine_info(),
            "settings": settings,
            "summary": summarize(runs),
            "runs": runs,
        }
        atomic_write_json(a.out, result)  # after every run: an interruption loses one
        print(f"repeat {repeat} {arm}: {run['seconds']:.1f} s", flush=True)
    summary = summarize(runs)
    print({k: v for k, v in summary.items() if k != "arms"})


if __name__ == "__main__":
    main()
