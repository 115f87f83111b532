"""The stage phase: the night's status, why, and its proposal: the best skill and memory (and
the winning adapter) staged when the gate accepted one, else why nothing was proposed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from selftaught.policy import Policy
from selftaught.record import Record
from selftaught.sleep.adoption import staging
from selftaught.sleep.night import summary
from selftaught.sleep.night.config import NightConfig
from selftaught.sleep.night.consolidate import (
    Consolidation,
    backend_failure,
    paired_val,
)
from selftaught.sleep.night.evidence import EvidenceLog
from selftaught.sleep.night.kinds import (
    kind_records,
)
from selftaught.sleep.night.mine import (
    MinedTask,
)
from selftaught.sleep.night.phases.context import NightContext, Phase
from selftaught.sleep.night.split import (
    train_only_use,
)
from selftaught.sleep.night.weight_night import (
    WeightChoice,
    discard_adapters,
    stage_adapter,
)
from selftaught.sleep.paths import (
    Adopted,
)
from selftaught.sleep.records import (
    PairedRecord,
    ProofreadRecord,
    ProposalRecord,
    Summary,
    TrainOnlyUse,
)
from selftaught.sleep.result import NightDraft


class StagePhase(Phase):
    """Stage what the gate accepted (with `ctx.choice`: what it chose among text, weights and
    both), say whether the staged text used weak or synthetic tasks, and measure each kind
    of request before and after. Its record: the verdict (status, reason, proposal)."""

    name = "stage"

    def run(self, ctx: NightContext) -> StageRecord | None:
        night, text = ctx.night, ctx.text
        if text is None or ctx.tasks is None:
            return None  # no text phase ran
        verdict = _outcome(night, ctx.night_dir, ctx.adopted, text, ctx.evidence, ctx.config,
                           ctx.choice, ctx.models.target_spec)  # fmt: skip
        _train_only_use(night, ctx.night_dir, ctx.tasks.splits)
        if ctx.tasks.kinds is not None:
            night.kinds = kind_records(ctx.tasks.kinds, *_val_by_item(night, text, ctx.adopted))
        return verdict


@dataclass(frozen=True)
class StageRecord(Record):
    """How a night that consolidated ends: its status, why, and the proposal it staged (in
    memory: report.json holds them as its `status`, `reason` and `proposal`)."""

    status: str
    reason: str
    proposal: ProposalRecord | None = None


def _outcome(
    night: NightDraft,
    night_dir: Path,
    adopted: Adopted,
    result: Consolidation,
    evidence: EvidenceLog,
    config: NightConfig,
    choice: WeightChoice | None = None,
    base_spec: str = "",
) -> StageRecord:
    """Status, reason and proposal of a night whose consolidation ran (with `choice`: the
    gate's pick among text, weights and both decides)."""
    night.phases = dict(result.phases)
    night.usage = result.ledger.to_dict()
    failure = backend_failure(result, evidence, config.training.gate.max_missing)
    if failure is not None:
        verdict = StageRecord("backend_failed", failure)
        night.status, night.reason = verdict.status, verdict.reason
        return verdict
    if choice is not None:
        night.weights = choice.record()
        verdict = _weights_outcome(night_dir, adopted, result, config, choice, base_spec,
                                   night.proofread)  # fmt: skip
    else:
        verdict = _text_outcome(night_dir, adopted, result, config, night.proofread, night.notes)
    night.status, night.reason, night.proposal = verdict.status, verdict.reason, verdict.proposal
    return verdict


def _text_outcome(
    night_dir: Path,
    adopted: Adopted,
    result: Consolidation,
    config: NightConfig,
    proofread: ProofreadRecord | None,
    notes: Sequence[str],
) -> StageRecord:
    """Stage the night's text when it changed; else why nothing was proposed."""
    changed = result.skill.strip() != adopted.skill.strip() or (
        result.memory.strip() != adopted.memory.strip()
    )
    ran = [p for p in result.phases.values() if p.ran]
    if not changed:
        reason = summary.why_nothing(night_dir, result.phases)
        dropped = proofread.dropped if proofread is not None else ()
        if dropped:
            reason = (
                f"nothing to propose: leave-one-out dropped every line the night proposed "
                f"({len(dropped)}: each earned nothing on val, or held a block marker)"
            )
        prefix = "weights: "  # the notes `weight_candidates` wrote
        weight_notes = [n.removeprefix(prefix) for n in notes if n.startswith(prefix)]
        if not result.phases and weight_notes:  # a weights-only night: why no adapter
            reason = "nothing to propose: " + "; ".join(weight_notes)
        return StageRecord("no_proposal", reason)
    changes = staging.write_proposal(night_dir, adopted, result.skill, result.memory)
    first, last = ran[0], ran[-1]
    before, after = first.val_initial, result.val_final or last.val_best
    assert before is not None and after is not None, "a phase that ran has its val"
    proposal = ProposalRecord(
        skill_changed=changes["skill"],
        memory_changed=changes["memory"],
        lines=proofread.kept if proofread is not None else (),
        val_before=before,
        val_after=after,
        paired=PairedRecord.of(paired_val(result, adopted, result.skill, result.memory)),
        test=last.test,
    )
    gate = "gate off: accepted without a check" if config.training.gate.accept_all else "gate"
    what = " and ".join(k for k in ("skill", "memory") if changes[k])
    reason = f"a new {what} was proposed ({gate}): {_val_change(before, after)}"
    return StageRecord("staged", reason, proposal)


def _val_change(before: Summary, after: Summary) -> str:
    return f"val {before.score.hard:.3f} → {after.score.hard:.3f}"


def _weights_outcome(
    night_dir: Path,
    adopted: Adopted,
    result: Consolidation,
    config: NightConfig,
    choice: WeightChoice,
    base_spec: str,
    proofread: ProofreadRecord | None,
) -> StageRecord:
    """Stage what the gate chose among text, weights and both (the adapter in `adapter/`)."""
    if choice.winner == "current":
        discard_adapters(night_dir)
        return StageRecord("no_proposal", f"the gate kept the adopted version: {choice.why}")
    text = choice.with_text
    skill, memory = (result.skill, result.memory) if text else (adopted.skill, adopted.memory)
    changes = staging.write_proposal(night_dir, adopted, skill, memory)
    ran = [p for p in result.phases.values() if p.ran]
    before, after = choice.candidates["current"], choice.candidates[choice.winner]
    if choice.adapter is not None:
        adapter = stage_adapter(choice, night_dir, base_spec)
    else:
        adapter = None
        discard_adapters(night_dir)
    proposal = ProposalRecord(
        skill_changed=changes["skill"],
        memory_changed=changes["memory"],
        lines=proofread.kept if proofread is not None and text else (),
        val_before=before,
        val_after=after,
        paired=PairedRecord.of(choice.paired()),
        test=ran[-1].test if choice.winner == "text" and ran else None,
        candidate=choice.winner,
        adapter=adapter,
    )
    gate = "gate off: accepted without a check" if config.training.gate.accept_all else "gate"
    reason = f"the {gate} chose {choice.winner}: {_val_change(before, after)}"
    return StageRecord("staged", reason, proposal)


def _val_by_item(
    night: NightDraft, result: Consolidation, adopted: Adopted
) -> tuple[dict[str, float | None] | None, dict[str, float | None] | None]:
    """Each val task's hard score before the night (the adopted text) and after it (the staged
    text; nothing staged: the adopted one), from the scores the phases kept; None where not
    measured (no text phase ran; the gate chose an adapter, measured on its own)."""
    caches = list(result.val_scores.values())
    if not caches:
        return None, None
    scores = caches[0].merged(*caches[1:])
    before = _hard(scores.get(Policy(adopted.skill, adopted.memory).skill_hash()))
    proposal = night.proposal if night.status == "staged" else None
    if proposal is None:
        return before, before
    if proposal.candidate not in (None, "text"):
        return before, None
    return before, _hard(scores.get(Policy(result.skill, result.memory).skill_hash()))


def _hard(items: Mapping[str, Sequence[float] | None]) -> dict[str, float | None] | None:
    return {i: None if v is None else float(v[0]) for i, v in items.items()} or None


def _train_only_use(night: NightDraft, night_dir: Path, splits: dict[str, list[MinedTask]]) -> None:
    """Whether what the night staged used its weak or synthetic tasks (`split.train_only_use`)."""
    staged = night_dir / "proposal" / "skill.md"
    skill = staged.read_text() if staged.is_file() else None
    used = train_only_use(splits, skill, night.proposal)
    empty = TrainOnlyUse.from_dict({})  # nothing staged: read back as `{}`, as written
    if night.weak is not None:
        night.weak = dataclasses.replace(night.weak, shipped=used.get("weak", empty))
    if night.dream is not None:
        night.dream = dataclasses.replace(night.dream, shipped=used.get("synthetic", empty))
