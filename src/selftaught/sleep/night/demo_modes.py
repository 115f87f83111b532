"""How the night's skill shows its demonstrations: a three-way candidate on the same gate.

After the skill phase, its best rules R are tried on the same val tasks three ways:

- ``none``       R alone;
- ``static``     R with a fixed demo block (the skill phase's, or the first `demos_max` of the
                 night's demo pool when it kept none);
- ``retrieved``  R with the whole pool of clean train demos, of which each request gets its
                 `retrieve_k` most similar (BM25, `selftaught.retrieval`).

The skill phase's own choice is the incumbent; a challenger replaces it only when the gate
accepts it as a new best against it (gate off: the best val mean wins), and then it must
also pass the gate against the adopted skill. Every val replay is charged to the night's
ledger and cached by skill hash in the skill phase's score cache (handed over in memory, and
saved in its `val_cache.json`). The pool holds train demos
only (the skill phase's leak check refused near-copies of val / test inputs), so retrieval
for a val task never draws on itself or another held-out task.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from selftaught.demos import Demo, join_skill, split_skill
from selftaught.errors import ConfigError
from selftaught.evaluation import EvalResult, ScoreCache, answer_dtype, ascore
from selftaught.gate import GateResult, Tags, ValScores, example_tags, gate
from selftaught.models.base import ChatModel, GenerationParams, run_sync
from selftaught.models.usage import BudgetExhausted
from selftaught.policy import Policy
from selftaught.retrieval import EXTRA_HINT, available
from selftaught.rollout import RolloutConfig
from selftaught.runs import read_json
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.demo_search import DemoPool
from selftaught.sleep.night.split import NightTask
from selftaught.sleep.records import (
    DemoModesRecord,
    DemoShape,
    GateRecord,
    Summary,
    VsAdoptedRecord,
)

MODES = ("none", "static", "retrieved")
RETRIEVAL_CHOICES = ("auto", "on", "off")


@dataclass
class DemoModeConfig:
    retrieval: str = "auto"
    """auto (try retrieval when bm25s is installed) | on (require it) | off."""
    retrieve_k: int = 4
    """Demos retrieved per request."""

    def __post_init__(self) -> None:
        if self.retrieval not in RETRIEVAL_CHOICES:
            raise ConfigError(
                f"retrieval must be one of {', '.join(RETRIEVAL_CHOICES)}, got {self.retrieval!r}"
            )
        if self.retrieve_k < 1:
            raise ConfigError(f"retrieve_k must be >= 1, got {self.retrieve_k}")
        if self.retrieval == "on" and not available():
            from selftaught.retrieval import RetrievalUnavailable

            raise RetrievalUnavailable(f"--retrieval on needs the bm25s library: {EXTRA_HINT}")


@dataclass(frozen=True)
class ModeResult:
    """The three-way comparison: the skill to go on with, and what the report says of it."""

    skill: str
    record: DemoModesRecord


def _shape(skill: str) -> DemoShape:
    demos = split_skill(skill)
    return DemoShape(demos=len(demos.demos), retrieve=demos.retrieve)


def _static_demos(pool: list[Demo], k: int) -> tuple[Demo, ...]:
    """The pool's first `k`: the user's corrections and the model's own replies before a
    teacher's verified replies, and those before plain references (as the skill phase ranks
    them)."""
    order = {"correction": 0, "bootstrap": 1, "teacher": 2, "reference": 3}
    return tuple(sorted(pool, key=lambda d: order.get(d.source, 4))[:k])


class ValScorer:
    """Val results of skills (the memory held fixed unless given) through
    `selftaught.evaluation`, cached per item by policy hash in the cache handed over (the
    skill phase's here; the night's merged one when it proofreads a proposal)."""

    def __init__(
        self,
        training: SkillOptConfig,
        task: NightTask,
        target: ChatModel,
        memory: str,
        cache: ScoreCache,
    ):
        self.training, self.task, self.target, self.memory = training, task, target, memory
        self.cache = cache
        self.rollout = RolloutConfig(
            concurrency=training.concurrency,
            timeout_s=training.timeout_s,
            params=GenerationParams(
                max_tokens=training.max_tokens, temperature=training.temperature
            ),
            progress=False,
            description="val (demo modes)",
        )

    def score(self, skill: str, memory: str | None = None) -> EvalResult:
        policy = Policy(skill=skill, memory=self.memory if memory is None else memory)
        val = self.task.examples("val")
        job = ascore(
            self.task, self.target, policy, val, split="val", rollout=self.rollout, cache=self.cache
        )
        return run_sync(job)

    def metric(self, result: EvalResult) -> ValScores:
        return result.val_scores(self.training.gate)


def candidates(
    best: str, pool: list[Demo], training: SkillOptConfig, cfg: DemoModeConfig, retrieval_ok: bool
) -> tuple[dict[str, str], str]:
    """(mode -> skill text, the incumbent mode) built from the skill phase's `best`."""
    parts = split_skill(best)
    placement = parts.placement if parts.demos else training.demo_placement
    out = {"none": parts.rules}
    static = parts.demos if parts.demos and not parts.retrieve else ()
    if not static and pool and training.demos_max:
        static = _static_demos(pool, training.demos_max)
    if static:
        out["static"] = join_skill(parts.rules, static, placement)
    if pool and retrieval_ok:
        out["retrieved"] = join_skill(parts.rules, pool, placement, cfg.retrieve_k)
    incumbent = next((m for m, text in out.items() if text.strip() == best.strip()), "")
    if not incumbent:  # the phase's best is none of the three (e.g. a pool of other k)
        out["incumbent"] = best
        incumbent = "incumbent"
    return out, incumbent


def decide_mode(
    metrics: dict[str, ValScores],
    incumbent: str,
    training: SkillOptConfig,
    tags: Tags | None = None,
) -> tuple[str, dict[str, GateRecord]]:
    """The winning mode and each challenger's gate result against the incumbent (`tags`: the
    val tasks' tags, for the gate's per-tag veto)."""
    g = training.gate
    inc = metrics[incumbent]
    gates: dict[str, GateResult] = {
        m: gate(s, inc, inc, g, tags=tags) for m, s in metrics.items() if m != incumbent
    }
    if g.accept_all:  # gate off: the best val mean, the incumbent on ties
        mean = {m: gate(s, inc, inc, g).candidate for m, s in metrics.items()}
        top = max(mean.values())
        winner = incumbent if mean[incumbent] >= top else max(mean, key=lambda m: mean[m])
    else:
        passed = [m for m, r in gates.items() if r.decision == "accept_new_best"]
        winner = max(passed, key=lambda m: gates[m].gain_vs_best) if passed else incumbent
    return winner, {m: GateRecord.of(r) for m, r in gates.items()}


def choose_demo_mode(
    training: SkillOptConfig,
    cfg: DemoModeConfig,
    task: NightTask,
    target: ChatModel,
    run_dir: Path,
    best: str,
    adopted_skill: str,
    memory: str,
    phase_started_from_adopted: bool,
    cache: ScoreCache | None = None,
) -> ModeResult:
    """Compare none / static / retrieved on val and return the skill to go on with. `cache`:
    the skill phase's val scores (default: read from its `val_cache.json` in `run_dir`)."""
    raw = read_json(run_dir / "demo_pool.json") if (run_dir / "demo_pool.json").exists() else {}
    found = DemoPool.from_dict(raw) if raw else DemoPool()
    pool = list(found.demos.values())
    retrieval_ok = cfg.retrieval != "off" and available()
    texts, incumbent = candidates(best, pool, training, cfg, retrieval_ok)
    comparison = DemoModesRecord(
        winner=incumbent,
        incumbent=incumbent,
        pool=len(pool),
        leaks_refused=len(found.leaks),
        sources=dict(Counter(d.source for d in pool)),
        notes=tuple(_pool_notes(cfg, pool, retrieval_ok)),
    )
    if cache is None:
        cache = ScoreCache.load(run_dir / "val_cache.json", answer_dtype(target))
    scorer = ValScorer(training, task, target, memory, cache)
    scored: dict[str, EvalResult] = {}
    try:
        for mode, text in texts.items():
            scored[mode] = scorer.score(text)
    except BudgetExhausted as err:
        said = f"demo modes not compared: the budget ran out ({err})"
        return ModeResult(best, replace(comparison, notes=(*comparison.notes, said)))
    summaries = {mode: Summary.of(scored[mode]) for mode in texts}
    shapes = {mode: _shape(text) for mode, text in texts.items()}
    metrics = {m: scorer.metric(r) for m, r in scored.items()}
    tags = example_tags(task.examples("val"))  # each kind's (the veto: on in nights)
    winner, gates = decide_mode(metrics, incumbent, training, tags)
    vs_adopted = None
    if winner != incumbent or not phase_started_from_adopted:
        adopted = scorer.score(adopted_skill)
        base = scorer.metric(adopted)
        check = gate(metrics[winner], base, base, training.gate, tags=tags)
        vs_adopted = VsAdoptedRecord.vs(winner, check)
        summaries["adopted"] = Summary.of(adopted)
        shapes["adopted"] = _shape(adopted_skill)
        if check.decision != "accept_new_best":
            winner = incumbent if phase_started_from_adopted else "adopted"
    skill = adopted_skill if winner == "adopted" else texts[winner]
    return ModeResult(
        skill,
        replace(comparison, winner=winner, candidates=summaries, shapes=shapes, gates=gates,
                vs_adopted=vs_adopted),
    )  # fmt: skip


def _pool_notes(cfg: DemoModeConfig, pool: list[Demo], retrieval_ok: bool) -> list[str]:
    notes = []
    if cfg.retrieval == "auto" and pool and not retrieval_ok:
        notes.append(f"retrieval not tried: {EXTRA_HINT}")
    if not pool:
        notes.append("no clean train demonstration was found: only `none` was possible")
    return notes
