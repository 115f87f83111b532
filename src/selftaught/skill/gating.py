"""Gate: the step's finalists on the whole val split, the best of them against the parent (as
current) and the best skill (`selftaught.gate`), and what the decision moves: current, best,
the pool, and the rejected-edit buffer the analyst is shown."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from selftaught.gate import Costs, GateResult, PooledVerdict, ValScores, gate, pooled_gate
from selftaught.rollout import Rollout
from selftaught.runs import RunDir, atomic_write_text
from selftaught.skill.candidates import Candidate
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.document import Edit
from selftaught.skill.propose import Proposal, why_empty
from selftaught.skill.scoring import SkillScorer
from selftaught.skill.screen import screen, wants_screening
from selftaught.skill.state import RunState, SkillVersion


@dataclass
class Verdict:
    """The gate's decision on a step's chosen candidate (None when there was none)."""

    result: GateResult
    candidate: SkillVersion | None = None
    val_rollouts: list[Rollout] = field(default_factory=list)
    cached: bool = False
    chosen: Candidate | None = None
    pooled: PooledVerdict | None = None  # with `pooled_val`: the pool's part and the power


def _total(scores: ValScores) -> float:
    return sum(v or 0 for v in scores.values())


def _rejected(reason: str) -> Verdict:
    return Verdict(GateResult("reject", reason, 0.0, 0.0, 0.0, 0.0, 0.0))


async def choose(
    config: SkillOptConfig,
    scorer: SkillScorer,
    st: RunState,
    step: int,
    parent: SkillVersion,
    candidates: list[Candidate],
    proposals: list[Proposal],
    set_stage: Callable[[str], None],
) -> Verdict:
    """Successive halving, then the gate: with more candidates than `screen_keep`, all
    are scored on a seeded val subset first and the best go on to full val (a candidate
    below its parent there goes no further); the best on full val meets the gate
    against the parent (as current) and the best skill."""
    assert st.best is not None
    if not candidates:
        return _rejected(f"empty patch: {why_empty(proposals)}")
    finalists = candidates
    if wants_screening(config, candidates, len(scorer.val_set)):
        set_stage(f"screen {len(candidates)}")
        finalists = await screen(config, scorer, step, parent, candidates)
        if not finalists:
            top = max(c.screen or 0.0 for c in candidates)
            return _rejected(
                f"screening: none of {len(candidates)} candidates matched its parent "
                f"on {config.screen_size} val items (best {top:.2f})"
            )
    set_stage("val")
    for c in finalists:
        val = await scorer.val(c.skill)
        c.rollouts += val.rollouts
        c.cached = c.cached and val.all_cached
        c.full = True
    chosen = max(finalists, key=lambda c: _total(scorer.val_metric(c.skill.hash)))
    trio = (chosen.skill, parent, st.best)
    scores = (
        scorer.val_metric(chosen.skill.hash),
        scorer.val_metric(parent.hash),
        scorer.val_metric(st.best.hash),
    )
    costs = _costs(config, scorer, chosen.skill.hash, st.best.hash)
    if not scorer.pool_set:
        result = gate(*scores, config.gate, tags=scorer.val_tags, costs=costs)
        return Verdict(result, chosen.skill, chosen.rollouts, chosen.cached, chosen)
    # the pool is scored only for a candidate the val alone does not reject
    unscored: ValScores = dict.fromkeys(ex.id for ex in scorer.pool_set)
    pool: list[ValScores] = [unscored] * 3
    if gate(*scores, config.gate, tags=scorer.val_tags).decision != "reject":
        set_stage("pooled val")
        for skill in trio:  # cached per item: the parent and the best were scored before
            await scorer.pool(skill)
        pool = [scorer.pool_metric(s.hash) for s in trio]
    pooled = pooled_gate(
        scores, (pool[0], pool[1], pool[2]), config.gate, tags=scorer.val_tags, costs=costs
    )
    return Verdict(pooled.result, chosen.skill, chosen.rollouts, chosen.cached, chosen, pooled)


def _costs(config: SkillOptConfig, scorer: SkillScorer, candidate: str, best: str) -> Costs | None:
    """What the candidate and the best spend per val item in the objective's cost (None: the
    objective is the score alone)."""
    cost = config.gate.cost
    if cost is None:
        return None
    new, old = scorer.val_cost(candidate), scorer.val_cost(best)
    return (new.value(cost) if new else None, old.value(cost) if old else None)


def edit_fates(candidates: list[Candidate], verdict: Verdict) -> tuple[list[Edit], list[Edit]]:
    """(edits of the rule candidate the gate passed, edits of rule candidates it did not):
    what the rejected buffer and the edit ledger record."""
    passed = verdict.candidate is not None and verdict.result.decision != "reject"
    accepted: list[Edit] = []
    lost: list[Edit] = []
    for c in candidates:
        if c.proposal is not None:
            won = passed and c.skill is verdict.candidate
            (accepted if won else lost).extend(c.proposal.update.applied)
    return accepted, lost


def apply_verdict(
    config: SkillOptConfig,
    run: RunDir,
    document: str,
    st: RunState,
    candidates: list[Candidate],
    verdict: Verdict,
) -> None:
    """Move current / best; edits of rule candidates that did not pass go to the rejected
    buffer (the analyst sees them next time); what passed joins the pool."""
    candidate, decision = verdict.candidate, verdict.result.decision
    passed = candidate is not None and decision != "reject"
    _, lost = edit_fates(candidates, verdict)
    size = config.rejected_buffer_size
    st.rejected = (st.rejected + [e.to_dict() for e in lost])[-size:] if size else []
    if not passed:
        return
    assert candidate is not None
    st.current = candidate
    st.pool.append(candidate.version)
    atomic_write_text(run.path(f"current_{document}.md"), candidate.text)
    if decision == "accept_new_best":
        st.best = candidate
        atomic_write_text(run.path(f"best_{document}.md"), candidate.text)
