"""Demonstrations on a frozen model: placement (chat turns vs a system-prompt section) and
source (the model's own passing replies vs the task's references), measured on one val set.

For each of `--draws` random demo sets of `--k` demos (drawn from train only, the same draw
for both placements), the val split is answered with the skill's demos placed as turns and
as a system section, and paired per item against the same val items with no demos: mean
accuracy difference with a 95% interval over items, wins / losses, sign test. One model job,
run sequentially; results are saved after every evaluation and a re-run resumes.

A design tool (benchmarks/README.md, "Protocol"): it scores on train and val only, never on
test (`--split test` is refused), and refuses the report seeds of report_settings.json. (Its
results before 2026-11-26 were scored on the test split.)

    python benchmarks/bench_demos.py --model local \\
        --task "gym:basic_arithmetic?max_terms=2&max_digits=1" --k 2 --draws 3
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path
from typing import Any

from common import RESULTS
from protocol import check_design_use

from selftaught.demos import Demo, join_skill
from selftaught.evaluation import evaluate_split
from selftaught.models import load_model
from selftaught.models.base import GenerationParams, run_sync
from selftaught.policy import Policy
from selftaught.rollout import RolloutConfig, arun_rollouts
from selftaught.runs import atomic_write_json, read_json
from selftaught.skill.demo_search import bootstrapped, from_references
from selftaught.stats import mean_interval, sign_test_pvalue, sign_test_two_sided
from selftaught.tasks.registry import load_task


def _paired(base: dict[str, float], new: dict[str, float]) -> dict[str, Any]:
    ids = [i for i in base if i in new]
    diffs = [new[i] - base[i] for i in ids]
    lo, hi = mean_interval(diffs)
    wins = sum(d > 0 for d in diffs)
    losses = sum(d < 0 for d in diffs)
    return {
        "n": len(ids),
        "acc": sum(new[i] for i in ids) / len(ids),
        "diff": sum(diffs) / len(ids),
        "diff_ci95": [round(lo, 4), round(hi, 4)],
        "wins": wins,
        "losses": losses,
        "sign_test_p_gain": round(sign_test_pvalue(wins, losses), 4),
        "sign_test_p_two_sided": round(sign_test_two_sided(wins, losses), 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="local")
    p.add_argument("--task", default="gym:basic_arithmetic?max_terms=2&max_digits=1")
    p.add_argument("--train-size", type=int, default=48)
    p.add_argument("--val-size", type=int, default=100)
    p.add_argument("--split", default="val", help="the split scored: val (or train); never test")
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--draws", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS / "demos_placement.json"))
    a = p.parse_args()
    check_design_use("bench_demos.py", seeds=[a.seed], splits=[a.split])
    out = Path(a.out)
    saved: dict[str, Any] = read_json(out) if out.exists() else {}
    settings = {k: v for k, v in vars(a).items() if k != "out"}
    if saved.get("settings") != settings:
        saved = {"settings": settings, "evals": {}}
    task = load_task(a.task, seed=a.seed, train_size=a.train_size, val_size=a.val_size, test_size=4)
    model = load_model(a.model)
    params = GenerationParams(max_tokens=a.max_tokens)
    train, scored = task.examples("train"), task.examples(a.split)

    def run(name: str, skill: str) -> dict[str, float]:
        if name not in saved["evals"]:
            t0 = time.perf_counter()
            cfg = RolloutConfig(params=params, progress=False)
            res = evaluate_split(task, model, Policy(skill=skill), split=a.split, rollout=cfg)
            saved["evals"][name] = {
                "hard": {r.example_id: r.score.hard for r in res.rollouts if r.ok and r.score},
                "seconds": round(time.perf_counter() - t0, 1),
                "load": list(os.getloadavg()),
            }
            atomic_write_json(out, saved)
            print(
                f"{name}: {sum(saved['evals'][name]['hard'].values()) / len(scored):.3f}",
                flush=True,
            )
        return saved["evals"][name]["hard"]

    base = run("none", "")
    rollouts = run_sync(
        arun_rollouts(model, Policy(), task, train, RolloutConfig(params=params, progress=False))
    )
    pools = {
        "bootstrap": bootstrapped(rollouts, {e.id: e for e in train}),
        "reference": from_references(task, train),
    }
    rows = []
    for source, pool in pools.items():
        for draw in range(a.draws):
            if len(pool) < a.k:
                continue
            demos: list[Demo] = random.Random(a.seed * 1000 + draw).sample(pool, a.k)
            for placement in ("turns", "system"):
                name = f"{source}-{placement}-{draw}"
                hard = run(name, join_skill("", demos, placement))
                rows.append(
                    {
                        "source": source,
                        "placement": placement,
                        "draw": draw,
                        "demos": [d.reply[:60] for d in demos],
                        **_paired(base, hard),
                    }
                )
    saved["pool_sizes"] = {k: len(v) for k, v in pools.items()}
    saved["rows"] = rows
    atomic_write_json(out, saved)
    for r in rows:
        print(
            f"{r['source']:9} {r['placement']:6} draw {r['draw']}: acc {r['acc']:.3f} "
            f"diff {r['diff']:+.3f} {r['diff_ci95']} W/L {r['wins']}/{r['losses']}"
        )


if __name__ == "__main__":
    main()
