"""The gate under known truth: a Monte Carlo study of `selftaught.gate.gate` settings.

A real gate sweep (`bench_peers.py --gate`) costs hours of CPU per seed and sees a handful of
steps; this one runs the package's own gate function on thousands of simulated optimization
runs whose *true* effects are known, so its regressions and missed gains can be counted.

The model of a run (the assumptions, stated so they can be argued with):
- a task has items with a latent logit each (`N(logit(base_acc), item_sd)`); a skill adds a
  true effect `e` to every logit plus a per-item, per-skill perturbation `N(0, churn)` (a new
  prompt at temperature 0 flips some answers for no reason); each skill's outcome on each item
  is drawn once (greedy replies are fixed for a given prompt);
- a run is `steps` candidates; each candidate's effect is the current skill's plus a step
  `N(edit_mean, edit_sd)` (most edits neutral or slightly harmful, some helpful);
- the gate sees val (30 items) only, exactly as `SkillTrainer` calls it (candidate vs current
  and best; "accept" moves current, "accept_new_best" moves best); the best on val ships;
- outcome on a fresh test set (50 items) of the shipped skill vs the seed, measured the way
  `bench_peers.py` reports it (Wilson intervals disjoint; one-sided paired sign test p <= 0.05),
  plus the true (expected) accuracy change, which a real benchmark cannot see.

    python benchmarks/bench_gate_sim.py                  # 5 settings x 3 scenarios, 2,000 runs each
    python benchmarks/bench_gate_sim.py --quick          # 500 runs each
    python benchmarks/bench_gate_sim.py --pooled         # the pooled val's false accepts (issue 52)
    python benchmarks/bench_gate_sim.py --power          # power at one false-accept rate (issue 65)

Writes benchmarks/results/gate_sim.json and prints a Markdown table (`--pooled`:
gate_sim_pooled.json, `--power`: gate_power.json, resumed cell by cell).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from common import RESULTS, markdown_table, pending_units, resumed_units

from selftaught.gate import GateConfig, ValScores, gate, pooled_gate
from selftaught.runs import atomic_write_json
from selftaught.stats import sign_test_pvalue, wilson_interval

GATES: dict[str, GateConfig] = {
    "margin1": GateConfig(margin=1.0),
    "p<=0.1": GateConfig(margin=0.0, confidence=0.9),
    "p<=0.2": GateConfig(margin=0.0, confidence=0.8),
    "margin1+p<=0.1": GateConfig(margin=1.0, confidence=0.9),
    "strict>": GateConfig(margin=0.0),
}


SKILL_GATE = GateConfig(margin=1.0, confidence=0.8)  # SkillOptConfig's default gate


@dataclass(frozen=True)
class Scenario:
    name: str
    edit_mean: float  # mean true effect of one edit, in logits
    edit_sd: float
    base_acc: float = 0.35
    item_sd: float = 1.5
    churn: float = 1.0  # per-item perturbation of a new prompt, in logits
    steps: int = 4
    n_val: int = 30
    n_test: int = 50


SCENARIOS = (
    Scenario("mostly neutral/harmful edits", edit_mean=-0.1, edit_sd=0.2),
    Scenario("no edit helps (pure noise)", edit_mean=0.0, edit_sd=0.0),
    Scenario("some edits help", edit_mean=0.1, edit_sd=0.3),
)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class SimRun:
    """One simulated optimization run: items, skills, outcomes."""

    def __init__(self, sc: Scenario, rng: random.Random) -> None:
        self.sc, self.rng = sc, rng
        centre = math.log(sc.base_acc / (1 - sc.base_acc))
        n = sc.n_val + sc.n_test
        self.logits = [rng.gauss(centre, sc.item_sd) for _ in range(n)]

    def skill(self, effect: float) -> tuple[float, list[float]]:
        """A skill with true effect `effect`: its greedy outcome (0/1) on every item."""
        noisy = [sigmoid(x + effect + self.rng.gauss(0, self.sc.churn)) for x in self.logits]
        return effect, [1.0 if self.rng.random() < p else 0.0 for p in noisy]

    def true_accuracy(self, effect: float) -> float:
        """Expected accuracy over the items and the prompt perturbation (the probit
        approximation E[sigmoid(x + N(0, c))] ~ sigmoid(x / sqrt(1 + pi c^2 / 8)))."""
        scale = 1.0 / math.sqrt(1.0 + math.pi * self.sc.churn**2 / 8.0)
        return statistics.fmean(sigmoid((x + effect) * scale) for x in self.logits)


def val_of(outcomes: list[float], n_val: int) -> dict[str, float | None]:
    return {f"v{i}": outcomes[i] for i in range(n_val)}


def simulate(sc: Scenario, cfg: GateConfig, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    run = SimRun(sc, rng)
    seed_skill = run.skill(0.0)
    current = best = seed_skill
    accepted = 0
    for _ in range(sc.steps):
        candidate = run.skill(current[0] + rng.gauss(sc.edit_mean, sc.edit_sd))
        result = gate(
            val_of(candidate[1], sc.n_val),
            val_of(current[1], sc.n_val),
            val_of(best[1], sc.n_val),
            cfg,
        )
        if result.decision == "accept_new_best":
            current = best = candidate
            accepted += 1
        elif result.decision == "accept":
            current = candidate
    shipped_changed = best is not seed_skill
    seed_test = seed_skill[1][sc.n_val :]
    ship_test = best[1][sc.n_val :]
    wins = sum(1 for a, b in zip(ship_test, seed_test, strict=True) if a > b)
    losses = sum(1 for a, b in zip(ship_test, seed_test, strict=True) if a < b)
    lo_seed, hi_seed = wilson_interval(sum(seed_test), sc.n_test)
    lo_ship, hi_ship = wilson_interval(sum(ship_test), sc.n_test)
    true_change = run.true_accuracy(best[0]) - run.true_accuracy(0.0) if shipped_changed else 0.0
    return {
        "accepted": accepted,
        "changed": shipped_changed,
        "true_change": true_change,
        "loss_beyond_ci": hi_ship < lo_seed,
        "loss_p05": shipped_changed and sign_test_pvalue(losses, wins) <= 0.05,
        "gain_beyond_ci": lo_ship > hi_seed,
        "gain_p05": shipped_changed and sign_test_pvalue(wins, losses) <= 0.05,
    }


def summarize(rows: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    n = len(rows)
    share = lambda key: sum(1 for r in rows if r[key]) / n  # noqa: E731
    changes = [r["true_change"] for r in rows]
    return {
        "runs": n,
        "accepted_step_rate": sum(r["accepted"] for r in rows) / (n * steps),
        "shipped_changed": share("changed"),
        "true_regression": sum(1 for c in changes if c < -0.01) / n,
        "true_gain": sum(1 for c in changes if c > 0.01) / n,
        "mean_true_change": statistics.fmean(changes),
        "test_loss_beyond_ci": share("loss_beyond_ci"),
        "test_loss_p05": share("loss_p05"),
        "test_gain_beyond_ci": share("gain_beyond_ci"),
        "test_gain_p05": share("gain_p05"),
    }


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = [
        "| scenario | gate | accepted steps | ships a change | true regression (> 1 pt) "
        "| true gain (> 1 pt) | mean true change | test loss one-sided p ≤ 0.05 "
        "| test loss beyond CI | test gain one-sided p ≤ 0.05 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    for scenario, by_gate in results.items():
        for name, s in by_gate.items():
            lines.append(
                f"| {scenario} | {name} | {pct(s['accepted_step_rate'])} "
                f"| {pct(s['shipped_changed'])} | {pct(s['true_regression'])} "
                f"| {pct(s['true_gain'])} | {100 * s['mean_true_change']:+.2f} pts "
                f"| {pct(s['test_loss_p05'])} | {pct(s['test_loss_beyond_ci'])} "
                f"| {pct(s['test_gain_p05'])} |"
            )
    return "\n".join(lines)


# ---- the pooled val (issue 52): false accepts against placebo candidates -----------------


@dataclass(frozen=True)
class PlaceboCase:
    """A parent and a placebo candidate: the same true accuracy (effect 0), a new prompt's
    churn flipping some answers; the gate sees `n_val` val items and, pooled, `n_pool` more."""

    base_acc: float
    n_val: int = 30
    n_pool: int = 30
    item_sd: float = 1.5
    churn: float = 1.0


PLACEBO_CASES = (
    PlaceboCase(base_acc=0.05),  # chain_sum's start: about 1 of 30 val items solved
    PlaceboCase(base_acc=0.05, n_pool=60),
    PlaceboCase(base_acc=0.35),
    PlaceboCase(base_acc=0.35, n_pool=60),
)


def placebo_false_accepts(
    case: PlaceboCase, cfg: GateConfig, runs: int, seed: int = 0
) -> dict[str, float]:
    """Share of placebo candidates the gate accepts as a new best on val alone and on the
    pooled val (`gate.pooled_gate`), on the same simulated items and outcomes. Pure: the
    package's own gate, seeded draws."""
    rng = random.Random(seed)
    centre = math.log(case.base_acc / (1 - case.base_acc))
    n = case.n_val + case.n_pool
    alone = pooled = 0
    for _ in range(runs):
        logits = [rng.gauss(centre, case.item_sd) for _ in range(n)]

        def outcomes(xs: list[float] = logits) -> list[float]:
            noisy = (sigmoid(x + rng.gauss(0, case.churn)) for x in xs)
            return [1.0 if rng.random() < p else 0.0 for p in noisy]

        parent, placebo = outcomes(), outcomes()
        val = (val_of(placebo, case.n_val), val_of(parent, case.n_val))
        pool = tuple(
            {f"p{i}": o[case.n_val + i] for i in range(case.n_pool)} for o in (placebo, parent)
        )
        alone += gate(val[0], val[1], val[1], cfg).decision == "accept_new_best"
        verdict = pooled_gate((val[0], val[1], val[1]), (pool[0], pool[1], pool[1]), cfg)
        pooled += verdict.result.decision == "accept_new_best"
    return {"val_alone": alone / runs, "pooled": pooled / runs}


def pooled_main(runs: int) -> None:
    t0 = time.perf_counter()
    rows = []
    for case in PLACEBO_CASES:
        for name, cfg in (
            ("default (margin1 + p<=0.2)", SKILL_GATE),
            ("strict>", GATES["strict>"]),
        ):
            rates = placebo_false_accepts(case, cfg, runs)
            rows.append({"case": asdict(case), "gate": name, **rates})
    out = {
        "command": f"python benchmarks/bench_gate_sim.py --pooled --runs {runs}",
        "runs": runs,
        "rows": rows,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "gate_sim_pooled.json"
    atomic_write_json(path, out)
    print("| base acc | val + pool | gate | false accepts, val alone | false accepts, pooled |")
    print("|---|---|---|---|---|")
    for r in rows:
        c = r["case"]
        print(
            f"| {c['base_acc']:.2f} | {c['n_val']} + {c['n_pool']} | {r['gate']} "
            f"| {100 * r['val_alone']:.1f}% | {100 * r['pooled']:.1f}% |"
        )
    print(f"\nwrote {path} ({out['wall_s']} s)")


# ---- power at the same false-accept rate (issue 65) -------------------------------------
#
# Does a decision rule exist that accepts a true +0.05 / +0.10 more often than today's gate
# while accepting placebo candidates no more often? Each rule meets the same simulated runs
# (the same seeds): the real loop's shape (each step proposes candidates from the current
# skill, the best of them on val meets the gate against the current and the best skill, an
# accept moves the current one, a new best the shipped one), placebo runs (no candidate
# changes the true accuracy) and runs where the first step's first candidate carries a true
# gain its descendants inherit. Dev data only: simulated items, no task, no test split.

Rule = Callable[[ValScores, ValScores, ValScores, Sequence[ValScores]], str]
"""(candidate, current, best, line) -> a gate decision; `line`: the val scores of the skills
accepted as current since the last new best, in order (the candidate's ancestors)."""


def gate_rule(cfg: GateConfig) -> Rule:
    """The package's gate as it decides today."""
    return lambda cand, cur, best, line: gate(cand, cur, best, cfg).decision


def tested_rule(pvalue: Callable[[ValScores, ValScores, Sequence[ValScores]], float],
                alpha: float) -> Rule:  # fmt: skip
    """Today's gate with margin 0 whose new-best test is `pvalue(candidate, best, line) <=
    alpha` instead of the sign test; ties and the current skill as today."""
    base = GateConfig(margin=0.0)

    def rule(cand: ValScores, cur: ValScores, best: ValScores, line: Sequence[ValScores]) -> str:
        result = gate(cand, cur, best, base)
        if result.decision != "accept_new_best" or pvalue(cand, best, line) <= alpha + 1e-9:
            return result.decision
        return "accept" if result.gain_vs_current >= -1e-9 else "reject"

    return rule


def _wins_losses(cand: ValScores, best: ValScores) -> tuple[int, int]:
    pairs = [(c, b) for i, c in cand.items() if c is not None and (b := best.get(i)) is not None]
    return sum(c > b for c, b in pairs), sum(c < b for c, b in pairs)


def midp_pvalue(cand: ValScores, best: ValScores, line: Sequence[ValScores] = ()) -> float:
    """The one-sided sign test's mid-p (half the probability of the observed split): less
    conservative than the exact test at the same level on few discordant items."""
    wins, losses = _wins_losses(cand, best)
    n = wins + losses
    if n == 0:
        return 1.0
    above = sum(math.comb(n, k) for k in range(wins + 1, n + 1))
    return (above + 0.5 * math.comb(n, wins)) / 2**n


def lineage_pvalue(cand: ValScores, best: ValScores, line: Sequence[ValScores] = ()) -> float:
    """Per-item evidence pooled across the steps the candidate's line survived: the candidate
    and its ancestors accepted as current since the last new best, against the best. Under the
    null every skill on an item is exchangeable, so given the K_i solves of the m + 1 skills
    on item i the best holds one of them with probability K_i / (m + 1); the p-value is the
    probability of the best solving as few items as it did (a Poisson-binomial tail). With no
    ancestor it is the exact sign test."""
    group = [*line, cand]
    items = [
        i for i, b in best.items() if b is not None and all(g.get(i) is not None for g in group)
    ]
    m = len(group)
    dist = [1.0]  # P(the best solves k of the items so far)
    for i in items:
        p = (sum(float(g[i] or 0.0) for g in group) + float(best[i] or 0.0)) / (m + 1)
        nxt = [0.0] * (len(dist) + 1)
        for k, v in enumerate(dist):
            nxt[k] += v * (1 - p)
            nxt[k + 1] += v * p
        dist = nxt
    solved = round(sum(float(best[i] or 0.0) for i in items))
    return min(1.0, sum(dist[: solved + 1]))


SKILL_DEFAULT = "optimize default: margin 1, p ≤ 0.2"
NIGHT_DEFAULT = "night default: margin 1"
RULES: dict[str, Rule] = {
    SKILL_DEFAULT: gate_rule(SKILL_GATE),
    NIGHT_DEFAULT: gate_rule(GateConfig()),
    "sign test p ≤ 0.1": gate_rule(GateConfig(margin=0.0, confidence=0.9)),
    "sign test p ≤ 0.3": gate_rule(GateConfig(margin=0.0, confidence=0.7)),
    "candidate: mid-p ≤ 0.1": tested_rule(midp_pvalue, 0.1),
    "candidate: lineage p ≤ 0.2": tested_rule(lineage_pvalue, 0.2),
}
CANDIDATES = [name for name in RULES if name.startswith("candidate:")]
SHAPES: dict[str, tuple[int, int]] = {"one look": (1, 1), "a run": (4, 3)}
"""steps, candidates per step: one candidate against its parent, or `optimize`'s shape (four
steps, an analyst proposal and two demo sets each)."""
POWER_SIZES = (8, 12, 20, 30)  # a night's val sizes and optimize's 30
POWER_GAINS = (0.0, 0.05, 0.10)
POWER_BASES = (0.2, 0.35)  # chain_sum's seed prompt solved 4-6 of 30 val items; the study above


@dataclass(frozen=True)
class PowerCase:
    """One cell: `n_val` val items, a loop `shape`, the true accuracy `gain` of the first
    step's first candidate (0: placebo) over items of `base_acc`."""

    n_val: int
    shape: str
    gain: float
    base_acc: float
    item_sd: float = 1.5
    churn: float = 1.0


def effect_for_gain(run: SimRun, gain: float) -> float:
    """The logit shift that raises this run's true accuracy by `gain` (bisection)."""
    if gain <= 0:
        return 0.0
    start = run.true_accuracy(0.0)
    lo, hi = 0.0, 8.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if run.true_accuracy(mid) - start < gain else (lo, mid)
    return hi


def power_run(case: PowerCase, rule: Rule, seed: int) -> dict[str, int]:
    """One simulated run under `rule`: whether it ships a change, whether it ships the gain,
    its gate looks and the looks that accepted a new best."""
    steps, per_step = SHAPES[case.shape]
    rng = random.Random(seed)
    sc = Scenario("power", 0.0, 0.0, case.base_acc, case.item_sd, case.churn, steps,
                  case.n_val, 0)  # fmt: skip
    run = SimRun(sc, rng)
    effect = effect_for_gain(run, case.gain)
    seed_skill = run.skill(0.0)
    current = best = seed_skill
    line: list[tuple[float, list[float]]] = []
    looks = new_best = 0
    for step in range(steps):
        shifts = [effect if step == 0 and k == 0 else 0.0 for k in range(per_step)]
        chosen = max((run.skill(current[0] + d) for d in shifts), key=lambda s: sum(s[1]))
        val = [val_of(s[1], case.n_val) for s in (chosen, current, best, *line)]
        decision = rule(val[0], val[1], val[2], val[3:])
        looks += 1
        if decision == "accept_new_best":
            current = best = chosen
            line = []
            new_best += 1
        elif decision == "accept":
            current = chosen
            line.append(chosen)
    return {"changed": int(best is not seed_skill), "gained": int(best[0] > 0),
            "looks": looks, "new_best": new_best}  # fmt: skip


def power_cell(case: PowerCase, name: str, runs: int) -> dict[str, Any]:
    """A rule on `runs` seeded runs of a case: its accept rate (placebo: shipping any change;
    a gain: shipping the gain) with a 95% Wilson interval, and per look."""
    rows = [power_run(case, RULES[name], seed) for seed in range(runs)]
    hits = sum(r["gained" if case.gain else "changed"] for r in rows)
    looks = sum(r["looks"] for r in rows)
    looked = sum(r["new_best"] for r in rows)
    return {
        **asdict(case),
        "rule": name,
        "runs": runs,
        "accepted": hits,
        "rate": hits / runs,
        "ci95": [round(x, 4) for x in wilson_interval(hits, runs)],
        "looks": looks,
        "per_look": looked / looks,
    }


def power_table(cells: Sequence[dict[str, Any]]) -> str:
    """Accept rates by val size and rule: placebo (a false accept) and the two true gains,
    one look and a run, each with its 95% interval."""
    by = {(c["base_acc"], c["n_val"], c["shape"], c["gain"], c["rule"]): c for c in cells}

    def rate(*key: Any) -> str:
        c = by.get(key)
        if c is None:
            return "-"
        lo, hi = c["ci95"]
        return f"{100 * c['rate']:.1f}% ({100 * lo:.0f}–{100 * hi:.0f})"

    header = ["base acc", "val", "rule"] + [
        f"{shape}: {'placebo' if not g else f'+{g:.2f}'}" for shape in SHAPES for g in POWER_GAINS
    ]
    body = [
        [f"{b:.2f}", n, rule, *(rate(b, n, s, g, rule) for s in SHAPES for g in POWER_GAINS)]
        for b in sorted({c["base_acc"] for c in cells})
        for n in sorted({c["n_val"] for c in cells})
        for rule in RULES
        if any((b, n, s, g, rule) in by for s in SHAPES for g in POWER_GAINS)
    ]
    return markdown_table(header, body)


def power_verdict(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each candidate rule, val size and shape, against each default: the target (no
    more placebo accepts, more accepts of both true gains) met or not, by the point rates."""
    by = {(c["base_acc"], c["n_val"], c["shape"], c["gain"], c["rule"]): c["rate"] for c in cells}
    out = []
    for b, n, shape, default, rule in itertools.product(
        sorted({c["base_acc"] for c in cells}), sorted({c["n_val"] for c in cells}), SHAPES,
        (SKILL_DEFAULT, NIGHT_DEFAULT), CANDIDATES,
    ):  # fmt: skip
        keys = [(b, n, shape, g) for g in POWER_GAINS]
        if not all((*k, r) in by for k in keys for r in (rule, default)):
            continue
        placebo = by[(*keys[0], rule)] <= by[(*keys[0], default)]
        gains = all(by[(*k, rule)] > by[(*k, default)] for k in keys[1:])
        out.append({"base_acc": b, "n_val": n, "shape": shape, "rule": rule,
                    "against": default, "meets": placebo and gains})  # fmt: skip
    return out


def power_main(runs: int, *, quick: bool) -> None:
    os.nice(10)  # a CPU-light study on a shared machine
    path = RESULTS / f"gate_power{'_quick' if quick else ''}.json"
    settings = {"runs": runs, "bases": list(POWER_BASES), "sizes": list(POWER_SIZES),
                "gains": list(POWER_GAINS), "shapes": SHAPES, "rules": list(RULES)}  # fmt: skip
    cells = resumed_units(path, json.loads(json.dumps(settings)))
    order = list(itertools.product(POWER_BASES, POWER_SIZES, SHAPES, POWER_GAINS, RULES))
    keys = ("base_acc", "n_val", "shape", "gain", "rule")
    t0 = time.perf_counter()
    for base, n, shape, gain, rule in pending_units(order, cells, keys):
        cells.append(power_cell(PowerCase(n, shape, gain, base), rule, runs))
        out = {
            "command": "python benchmarks/bench_gate_sim.py --power" + " --quick" * quick,
            "settings": settings,
            "runs": cells,
            "verdict": power_verdict(cells),
        }
        RESULTS.mkdir(exist_ok=True)
        atomic_write_json(path, out)  # after each cell: an interrupted study resumes
        done = f"{base:.2f} {n:>3} {shape:<8} +{gain:.2f} {rule}"
        print(f"{done}: {100 * cells[-1]['rate']:.1f}%", flush=True)
    print(power_table(cells))
    met = [v for v in power_verdict(cells) if v["meets"]]
    print(f"\ncandidates meeting the target: {met or 'none'} ({time.perf_counter() - t0:.0f} s)")
    if not quick:
        from common import write_tables

        write_tables()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="500 runs per cell")
    ap.add_argument("--gates", nargs="+", choices=sorted(GATES), default=list(GATES))
    ap.add_argument("--pooled", action="store_true", help="the pooled val's placebo study")
    ap.add_argument("--power", action="store_true", help="rules at the same false-accept rate")
    args = ap.parse_args()
    if args.pooled:
        pooled_main(500 if args.quick else args.runs)
        return
    if args.power:
        power_main(300 if args.quick else args.runs, quick=args.quick)
        return
    runs = 500 if args.quick else args.runs
    t0 = time.perf_counter()
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for sc in SCENARIOS:
        results[sc.name] = {}
        for name in args.gates:
            # The same seeds for every gate: each setting sees the very same runs.
            rows = [simulate(sc, GATES[name], seed) for seed in range(runs)]
            results[sc.name][name] = summarize(rows, sc.steps)
    out = {
        "command": "python benchmarks/bench_gate_sim.py" + (" --quick" if args.quick else ""),
        "scenarios": [asdict(sc) for sc in SCENARIOS],
        "gates": {name: asdict(GATES[name]) for name in args.gates},
        "results": results,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"gate_sim{'_quick' if args.quick else ''}.json"
    atomic_write_json(path, out)
    if not args.quick:
        from common import write_tables

        write_tables()  # the README's table comes from gate_sim.json
    print(table(results))
    print(f"\nwrote {path} ({out['wall_s']} s)")


if __name__ == "__main__":
    main()
