"""The README's main command, timed: the embedded model practises on 32 train problems and the
shipped skill is checked on the test split. Runs the command exactly as the README gives it
(plus an output folder), and records its summary, wall and CPU time, the load average and,
measured just before, the machine's raw decode rate (`raw_decode`, as `selftaught doctor`
takes it: doctor scales `wall_s` by it, so copy both into `selftaught/doctor.py`).

    python benchmarks/bench_quickstart.py            # results/quickstart_demos_local.json
    python benchmarks/bench_quickstart.py --test-size 100 --out /tmp/quickstart_100.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

from common import RESULTS

from selftaught.runs import atomic_write_json

TASK = "gym:basic_arithmetic?max_terms=2&max_digits=1"  # the README's quick-start task
MAX_TOKENS = 64
COMMAND = (
    f'selftaught optimize --task "{TASK}" --model local '
    "--proposals 0 --epochs 1 --batch-size 16 --train-size 32 --val-size 30 --test-size {test} "
    f"--max-tokens {MAX_TOKENS}"
)
TEST_SIZE = 400  # the README's --test-size


def _ci(summary: dict) -> list[float]:
    return [round(x, 3) for x in summary["hard_ci"]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--test-size", type=int, default=TEST_SIZE)
    p.add_argument("--out", type=Path, default=RESULTS / "quickstart_demos_local.json")
    a = p.parse_args()
    command = COMMAND.format(test=a.test_size)
    from selftaught.doctor import measure_raw_rate

    raw = measure_raw_rate()  # the yardstick: doctor scales wall_s by it on other machines
    with tempfile.TemporaryDirectory() as tmp:
        load0, t0 = os.getloadavg(), time.perf_counter()
        subprocess.run([*shlex.split(command), "--output", tmp], check=True)
        wall = time.perf_counter() - t0
        load1 = os.getloadavg()
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        lines = (Path(tmp) / "history.jsonl").read_text().splitlines()
        history = [json.loads(x) for x in lines if x.strip()]
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    test = summary["test"]
    atomic_write_json(
        a.out,
        {
            "command": command,
            "summary": summary,
            "test": test,
            "history": [{k: r.get(k) for k in ("step", "gate", "candidates")} for r in history],
            "best_skill": summary.get("best_skill"),
            "wall_s": round(wall, 1),
            "cpu_user_s": round(cpu.ru_utime, 1),
            "raw_decode": raw.to_dict(),
            "load_average": {"start": list(load0), "end": list(load1)},
        },
    )
    if a.out.resolve().parent == RESULTS.resolve():
        from common import write_tables

        write_tables()  # the READMEs' quick-start figures come from these files
    i, b = test["initial"], test["best"]
    print(
        f"test {i['hard']:.3f} {_ci(i)} -> {b['hard']:.3f} {_ci(b)} "
        f"W/L {test['paired']['wins']}/{test['paired']['losses']} in {wall:.0f} s "
        f"(load {load0[0]:.1f} -> {load1[0]:.1f})"
    )


if __name__ == "__main__":
    main()
