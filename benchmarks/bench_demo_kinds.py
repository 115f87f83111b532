"""Which demonstrations help a frozen model: its own passing replies that show their working,
its own bare answers, or the task's references, as chat turns or a system section.

Per seed: the seed prompt answers the train split once (greedy); the passing replies are split
into worked (`demo_search.shows_work`) and bare; two demos of each kind (a seeded draw) are
placed in the skill, and the val split is answered with each skill and paired per item
against the seed prompt alone. One model job, run sequentially; every evaluation is saved as
it ends and a re-run resumes.

A design tool (benchmarks/README.md, "Protocol"): it scores on val only, never on test, and
refuses the report seeds of report_settings.json. (Its results before 2026-11-26 were scored
on val + test of the peer benchmark's seeds, which is what the protocol now forbids.)

    python benchmarks/bench_demo_kinds.py --seeds 0 1 \\
        --model local:~/.cache/selftaught/models/qwen2.5-coder-0.5b-instruct.gguf

`--order DIR` compares instead two orders of the worked replies in a run's demo pool
(`DIR/basic_arithmetic_s<seed>.json`, a `demo_pool.json` saved from the peer benchmark's
selftaught runs): the top 1 and 2 shortest first (the order before 2026-11-25) against the
top 1 and 2 in the order they are filled now (`demo_search._ranked`: most steps first), each paired
per item against the seed prompt and against each other; and the top 3 and 4 in the new
order (how many demos help).

`--stratify` compares the first fresh demo set a step proposes with and without
`SkillOptConfig.demo_stratify` (on a task with few distinct answers each answer gets its share
of the slots), from the pool the trainer holds once the seed prompt has answered train: the
references the scorer passes, each replaced by the model's own reply where that passed. The
splits are sized as the report's (train 30, val 30, test 100; test is never scored; the
sizes decide which items each split draws, so these are not `bench_peers.py`'s dev splits,
sized test 50):

    python benchmarks/bench_demo_kinds.py --stratify --task gym:syllogism --seeds 0 1 2 \
        --model local:~/.cache/selftaught/models/qwen2.5-coder-0.5b-instruct.gguf \
        --out benchmarks/results/demo_stratify_qwen.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from common import RESULTS
from protocol import check_design_use

from selftaught.demos import Demo, LeakCheck, join_skill
from selftaught.evaluation import evaluate_split
from selftaught.gate import paired_comparison
from selftaught.models import load_model
from selftaught.models.base import GenerationParams, run_sync
from selftaught.policy import Policy
from selftaught.rollout import RolloutConfig, arun_rollouts
from selftaught.runs import atomic_write_json, read_json
from selftaught.skill.demo_search import (
    DemoPool,
    _ranked,
    bootstrapped,
    from_references,
    propose_sets,
    shows_work,
)
from selftaught.stats import sign_test_two_sided, wilson_interval
from selftaught.tasks.registry import load_task

PEER_TASK = "gym:basic_arithmetic?min_terms=2&max_terms=3&min_digits=1&max_digits=2"
SEED_PROMPT = "You are a helpful assistant."
KINDS = ("worked-turns", "bare-turns", "ref-system", "worked-system")
SPLITS = ("val",)  # a design tool never scores test


def _demo_sets(task: Any, model: Any, cfg: RolloutConfig, seed: int) -> dict[str, list[Demo]]:
    train = task.examples("train")
    rollouts = run_sync(arun_rollouts(model, Policy(skill=SEED_PROMPT), task, train, cfg))
    boot = bootstrapped(rollouts, {e.id: e for e in train})
    pools = {
        "worked": [d for d in boot if shows_work(d.reply)],
        "bare": [d for d in boot if not shows_work(d.reply)],
        "ref": from_references(task, train),
    }
    print({k: [d.reply for d in v] for k, v in pools.items()}, flush=True)
    rng = random.Random(seed)
    drawn = {k: rng.sample(v, 2) if len(v) >= 2 else [] for k, v in pools.items()}
    held_out = LeakCheck.of_task(task)
    for demos in drawn.values():
        held_out.assert_clean(demos)  # no demo may copy a held-out item
    return {kind: drawn[kind.split("-")[0]] for kind in KINDS}


def _row(base: dict[str, float], hard: dict[str, float]) -> dict[str, Any]:
    paired = paired_comparison(hard, base)
    solved = int(sum(hard.values()))
    return {
        "solved": solved,
        "n": len(hard),
        "ci95": [round(x, 3) for x in wilson_interval(solved, len(hard))],
        "wins": paired.wins,
        "losses": paired.losses,
        "p_gain": round(paired.sign_test_p, 4),  # one-sided: the gate's question
        "p_two_sided": round(sign_test_two_sided(paired.wins, paired.losses), 4),
    }


class Evals:
    """The saved evaluations (one per seed and skill), written after each one."""

    def __init__(self, out: Path, settings: dict[str, Any]):
        self.out = out
        self.saved: dict[str, Any] = read_json(out) if out.exists() else {}
        if self.saved.get("settings") != settings:
            self.saved = {"settings": settings, "evals": {}, "rows": {}}

    def hard(self, key: str, task: Any, model: Any, cfg: RolloutConfig, skill: str) -> dict:
        """Per-item hard scores of `skill` on val (from the file when saved)."""
        saved = self.saved["evals"].get(key)
        if saved is None or saved["skill"] != skill:  # a changed skill is evaluated again
            t0, hard = time.perf_counter(), {}
            for split in SPLITS:
                res = evaluate_split(task, model, Policy(skill=skill), split=split, rollout=cfg)
                hard |= {r.example_id: r.score.hard for r in res.rollouts if r.ok and r.score}
            self.saved["evals"][key] = {
                "hard": hard,
                "skill": skill,
                "seconds": round(time.perf_counter() - t0, 1),
                "load": list(os.getloadavg()),
            }
            atomic_write_json(self.out, self.saved)
        return self.saved["evals"][key]["hard"]

    def add_row(self, key: str, row: dict[str, Any]) -> None:
        self.saved["rows"][key] = row
        atomic_write_json(self.out, self.saved)


def _orders(pool_file: Path, seed: int) -> dict[str, list[Demo]]:
    """The pool in the order demo sets were filled before 2026-11-25 (worked replies first,
    shortest first: a seeded shuffle, then a stable sort) and in the order they are filled
    now (`demo_search._ranked`, the same seed: most steps first)."""
    pool = [Demo.from_dict(d) for d in json.loads(pool_file.read_text())["demos"]]
    shuffled = list(pool)
    random.Random(seed).shuffle(shuffled)
    shortest = sorted(
        shuffled, key=lambda d: (d.source == "reference", not shows_work(d.reply), len(d.reply))
    )
    steps = _ranked(pool, random.Random(seed))
    orders = {f"{name}{k}": order[:k] for name, order in (("short", shortest), ("steps", steps))
              for k in (1, 2)}  # fmt: skip
    # how many demos: 3 and 4 (the cap, `demos_max`) in the new order
    return orders | {f"steps{k}": steps[:k] for k in (3, 4)}


def compare_orders(evals: Evals, task: Any, model: Any, cfg: RolloutConfig, seed: int,
                   pool_file: Path) -> None:  # fmt: skip
    base = evals.hard(f"s{seed}-none", task, model, cfg, SEED_PROMPT)
    held_out = LeakCheck.of_task(task)
    hard = {}
    for name, demos in _orders(pool_file, seed).items():
        held_out.assert_clean(demos)
        skill = join_skill(SEED_PROMPT, demos, "turns")
        hard[name] = evals.hard(f"s{seed}-rank-{name}", task, model, cfg, skill)
        row = {**_row(base, hard[name]), "replies": [d.reply for d in demos]}
        evals.add_row(f"s{seed}-rank-{name}", row)
        print(f"seed {seed} {name}: {row} (none: {int(sum(base.values()))}/{len(base)})")
    for k in (1, 2):
        row = _row(hard[f"short{k}"], hard[f"steps{k}"])  # steps against shortest, per item
        evals.add_row(f"s{seed}-rank-steps{k}-vs-short{k}", row)
        print(f"seed {seed} steps{k} vs short{k}: {row}")


def _first_fresh_sets(task: Any, model: Any, cfg: RolloutConfig, seed: int, k: int) -> dict:
    """The first fresh set of a step with `demo_stratify` off and on, from the trainer's pool
    after the seed prompt answered train once (leaks refused as the trainer refuses them)."""
    train = task.examples("train")
    held_out = LeakCheck.of_task(task)
    pool = DemoPool()
    pool.add(from_references(task, train), held_out)
    rollouts = run_sync(arun_rollouts(model, Policy(skill=SEED_PROMPT), task, train, cfg))
    pool.add(bootstrapped(rollouts, {e.id: e for e in train}), held_out)
    demos = list(pool.demos.values())
    print(f"seed {seed} pool: {sorted(f'{d.source}:{d.reply}' for d in demos)}", flush=True)
    sets = {}
    for name, stratify in (("fresh", False), ("stratified", True)):
        moves = propose_sets([], demos, k, 8, random.Random(seed), set(), stratify)
        sets[name] = next(list(s) for s, why in moves if why.split()[0] == name)
    return sets


def compare_stratified(evals: Evals, task: Any, model: Any, cfg: RolloutConfig, seed: int,
                       k: int = 4) -> None:  # fmt: skip
    base = evals.hard(f"s{seed}-none", task, model, cfg, SEED_PROMPT)
    hard = {}
    for name, demos in _first_fresh_sets(task, model, cfg, seed, k).items():
        skill = join_skill(SEED_PROMPT, demos, "turns")
        hard[name] = evals.hard(f"s{seed}-{name}", task, model, cfg, skill)
        row = {**_row(base, hard[name]), "replies": [d.reply for d in demos]}
        evals.add_row(f"s{seed}-{name}", row)
        print(f"seed {seed} {name}: {row} (none: {int(sum(base.values()))}/{len(base)})")
    row = _row(hard["fresh"], hard["stratified"])  # stratified against the old set, per item
    evals.add_row(f"s{seed}-stratified-vs-fresh", row)
    print(f"seed {seed} stratified vs fresh: {row}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="local")
    p.add_argument("--task", default=PEER_TASK)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--out", default=str(RESULTS / "demo_kinds_qwen.json"))
    p.add_argument("--order", metavar="DIR", help="compare two orders of the pools saved in DIR")
    p.add_argument("--stratify", action="store_true", help="the first fresh set, stratified or not")
    a = p.parse_args()
    check_design_use("bench_demo_kinds.py", seeds=a.seeds, splits=SPLITS)
    settings = {"model": a.model, "task": a.task, "max_tokens": a.max_tokens, "splits": SPLITS}
    evals = Evals(Path(a.out), settings)
    model = load_model(os.path.expanduser(a.model))
    cfg = RolloutConfig(params=GenerationParams(max_tokens=a.max_tokens), progress=False)
    for seed in a.seeds:
        test_size = 100 if a.stratify else 50  # --stratify: sized as the report's
        task = load_task(a.task, seed=seed, train_size=30, val_size=30, test_size=test_size)
        if a.stratify:
            compare_stratified(evals, task, model, cfg, seed)
            continue
        if a.order:
            compare_orders(
                evals, task, model, cfg, seed, Path(a.order) / f"basic_arithmetic_s{seed}.json"
            )
            continue
        base = evals.hard(f"s{seed}-none", task, model, cfg, SEED_PROMPT)
        for kind, demos in _demo_sets(task, model, cfg, seed).items():
            if not demos:
                continue
            skill = join_skill(SEED_PROMPT, demos, kind.split("-")[1])
            row = _row(base, evals.hard(f"s{seed}-{kind}", task, model, cfg, skill))
            evals.add_row(f"s{seed}-{kind}", row)
            print(f"seed {seed} {kind}: {row} (none: {int(sum(base.values()))}/{len(base)})")


if __name__ == "__main__":
    main()
