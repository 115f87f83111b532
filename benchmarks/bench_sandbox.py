"""Cost of the bubblewrap sandbox: per-execution overhead, sandboxed vs the resource-limits-only
mode (`unsafe_exec`), and HumanEval scoring of the 164 canonical solutions end to end in both
modes. The two modes alternate (ABAB...) in one run, so machine load hits both alike.

    python benchmarks/bench_sandbox.py [--quick] [--execs 40] [--rounds 3] [--concurrency 1]

Prints medians and the ratios; writes benchmarks/results/sandbox.json (sandbox_quick.json with
--quick). Needs bubblewrap (apt-get install bubblewrap).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import RESULTS

from selftaught.runs import atomic_write_json
from selftaught.tasks.base import SPLITS
from selftaught.tasks.humaneval import HumanEvalTask, load_problems
from selftaught.tasks.sandbox import Sandbox, find_bwrap, open_sandbox

# A small program like a HumanEval check: a function, a loop, a few asserts.
SMALL_PROGRAM = """\
def f(n):
    return sum(i * i for i in range(n))

for n in range(200):
    assert f(n) >= 0
print(f(100))
"""


def per_execution(modes: dict[str, Sandbox], execs: int) -> dict:
    """Wall seconds of one run_python-equivalent call, the modes alternating call by call."""
    times: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(execs):
        for name, sandbox in modes.items():
            t0 = time.perf_counter()
            result = sandbox.run(SMALL_PROGRAM)
            times[name].append(time.perf_counter() - t0)
            if not result.passed:
                raise SystemExit(f"{name}: the small program failed: {result.summary()}")
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {
        "executions_per_mode": execs,
        "median_s": {k: round(v, 4) for k, v in medians.items()},
        "mean_s": {k: round(statistics.fmean(t), 4) for k, t in times.items()},
        "ratio_sandboxed_over_unsafe": round(medians["bubblewrap"] / medians["unsafe"], 2),
    }


def humaneval_pass(task: HumanEvalTask, replies: dict, examples: dict, concurrency: int):
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(task.score, replies[pid], examples[pid]) for pid in replies]
        solved = sum(f.result().hard for f in futures)
    return time.perf_counter() - t0, int(solved)


def humaneval(modes: dict[str, Sandbox], rounds: int, limit: int | None, concurrency: int):
    """Score the canonical solutions: one pass per mode per round, the modes alternating."""
    problems = load_problems()
    ids = sorted(problems, key=lambda k: int(k.split("/")[-1]))[:limit]
    replies = {
        pid: f"```python\n{problems[pid]['prompt']}{problems[pid]['canonical_solution']}```"
        for pid in ids
    }
    tasks = {}
    for name, sandbox in modes.items():
        tasks[name] = HumanEvalTask(unsafe_exec=True)
        tasks[name].sandbox = sandbox  # the mode under test, whatever this machine has
    examples = {e.id: e for s in SPLITS for e in tasks["bubblewrap"].examples(s)}
    walls: dict[str, list[float]] = {name: [] for name in modes}
    solved: dict[str, list[int]] = {name: [] for name in modes}
    for _ in range(rounds):
        for name, task in tasks.items():
            wall, n = humaneval_pass(task, replies, examples, concurrency)
            walls[name].append(round(wall, 3))
            solved[name].append(n)
    medians = {name: statistics.median(w) for name, w in walls.items()}
    return {
        "problems": len(ids),
        "rounds": rounds,
        "concurrency": concurrency,
        "wall_s": walls,
        "solved": solved,
        "median_wall_s": {k: round(v, 3) for k, v in medians.items()},
        "median_s_per_problem": {k: round(v / len(ids), 4) for k, v in medians.items()},
        "ratio_sandboxed_over_unsafe": round(medians["bubblewrap"] / medians["unsafe"], 2),
    }


def machine() -> dict:
    bwrap = find_bwrap()
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "bwrap": version.strip(),
        "bwrap_mode": "root (drops to a throw-away uid)" if os.geteuid() == 0 else "user namespace",
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: few runs")
    parser.add_argument("--execs", type=int, default=40, help="small-program runs per mode")
    parser.add_argument("--rounds", type=int, default=3, help="HumanEval passes per mode")
    parser.add_argument("--concurrency", type=int, default=1, help="HumanEval scoring threads")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    execs, rounds, limit = (5, 1, 20) if args.quick else (args.execs, args.rounds, None)
    if find_bwrap() is None:
        sys.exit("bubblewrap is not installed (apt-get install bubblewrap)")
    modes = {"bubblewrap": open_sandbox(), "unsafe": Sandbox(None)}
    info = machine()
    modes["bubblewrap"].run("pass")  # warm both paths once (imports, page cache)
    modes["unsafe"].run("pass")
    results = {
        "quick": args.quick,
        "per_execution": per_execution(modes, execs),
        "humaneval_canonical": humaneval(modes, rounds, limit, args.concurrency),
        "machine": {**info, "load_average_after": [round(x, 2) for x in os.getloadavg()]},
    }
    out = args.out or RESULTS / ("sandbox_quick.json" if args.quick else "sandbox.json")
    atomic_write_json(out, results)
    print(json.dumps(results, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
