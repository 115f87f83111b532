"""The proofread phase: the proposal's riders dropped (lines holding a block marker, lines whose
removal costs nothing on val: leave-one-out, at most `leave_one_out` val evaluations), every
line left named with its tasks, interactions and clients (`night/proofread.py`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from selftaught.evaluation import ScoreCache, answer_dtype
from selftaught.models.base import ChatModel
from selftaught.models.usage import TrackedModel
from selftaught.sleep.night.config import NightConfig
from selftaught.sleep.night.consolidate import (
    Consolidation,
    backend_failure,
)
from selftaught.sleep.night.evidence import EvidenceLog, EvidenceModel
from selftaught.sleep.night.mine import (
    MinedTask,
)
from selftaught.sleep.night.phases.context import NightContext, Phase
from selftaught.sleep.night.proofread import proofread
from selftaught.sleep.night.split import (
    NightTask,
)
from selftaught.sleep.paths import (
    Adopted,
)
from selftaught.sleep.records import (
    ProofreadRecord,
    Summary,
)


class ProofreadPhase(Phase):
    """Proofread the text phase's proposal; past the night's --max-minutes the gated proposal
    is staged as the gate took it (no leave-one-out calls)."""

    name = "proofread"
    seconds = "proofread"
    after = "after proofreading"

    def run(self, ctx: NightContext) -> ProofreadRecord | None:
        if ctx.text is None or ctx.task is None or ctx.tasks is None:
            return None  # no text phase ran
        config = ctx.config
        if ctx.late:
            config = dataclasses.replace(config, leave_one_out=0)
        done = _proofread(ctx.text, ctx.adopted, ctx.task, ctx.models.target, config,
                          ctx.night_dir, ctx.evidence, ctx.tasks.splits)  # fmt: skip
        if done is not None:
            ctx.night.proofread = done
            ctx.night.note(*done.notes)
        return done


def _proofread(
    result: Consolidation,
    adopted: Adopted,
    task: NightTask,
    target: ChatModel,
    config: NightConfig,
    night_dir: Path,
    evidence: EvidenceLog,
    splits: dict[str, list[MinedTask]],
) -> ProofreadRecord | None:
    """Drop the proposal's riders and name every line's sources (`proofread.py`); the
    result's documents, val and score caches follow. None: nothing to proofread."""
    unchanged = result.skill.strip() == adopted.skill.strip() and (
        result.memory.strip() == adopted.memory.strip()
    )
    if unchanged or backend_failure(result, evidence, config.training.gate.max_missing):
        return None
    caches = list(result.val_scores.values())
    cache = caches[0].merged(*caches[1:]) if caches else ScoreCache(dtype=answer_dtype(target))
    done = proofread(
        result.skill,
        result.memory,
        adopted,
        task,
        TrackedModel(EvidenceModel(target, evidence, "target"), result.ledger, "target"),
        config.training,
        cache,
        {"skill": night_dir, "memory": night_dir / "memory"},
        config.leave_one_out,
    )
    result.val_scores["proofread"] = cache
    result.skill, result.memory = done.skill, done.memory
    if done.val is not None:
        result.val_final = Summary.of(done.val)
    return done.record({t.id: t for s in splits.values() for t in s})
