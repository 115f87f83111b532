"""The weight phase (only with `weights` other than "off" and a local target): a LoRA adapter
trained on the train tasks, and the same gate picking text, weights or both on the same val
tasks (`weight_night.py`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console

from selftaught.sleep.night.config import NightConfig, NightModels
from selftaught.sleep.night.consolidate import (
    Consolidation,
    backend_failure,
)
from selftaught.sleep.night.evidence import EvidenceLog
from selftaught.sleep.night.phases.context import NightContext, Phase, Splits
from selftaught.sleep.night.split import (
    NightTask,
)
from selftaught.sleep.night.weight_night import (
    NightText,
    WeightChoice,
    adapter_trainer,
    weight_candidates,
)
from selftaught.sleep.paths import (
    Adopted,
)
from selftaught.sleep.records import (
    LateDuplicate,
    WeightsRecord,
)
from selftaught.sleep.result import NightDraft


class WeightsPhase(Phase):
    """Train the night's adapters and let the gate choose (`ctx.choice`); past the night's
    --max-minutes none is trained. Its record: report.json `weights`."""

    name = "weights"
    seconds = "weights"

    def run(self, ctx: NightContext) -> WeightsRecord | None:
        if ctx.late and ctx.config.weights != "off":
            ctx.night.note("weights not trained: the night's --max-minutes had passed")
            return None
        if ctx.late or ctx.text is None or ctx.task is None or ctx.tasks is None:
            return None
        ctx.choice = _weights(ctx.night, ctx.config, ctx.models, ctx.task, ctx.tasks,
                              ctx.adopted, ctx.text, ctx.night_dir, ctx.evidence,
                              ctx.console)  # fmt: skip
        return ctx.choice.record() if ctx.choice is not None else None


def _weights(
    night: NightDraft,
    config: NightConfig,
    models: NightModels,
    task: NightTask,
    mined: Splits,
    adopted: Adopted,
    result: Consolidation,
    night_dir: Path,
    evidence: EvidenceLog,
    console: Console,
) -> WeightChoice | None:
    """The weight candidates and the gate's choice; None: the night stays text-only."""
    if config.weights == "off":
        return None
    if backend_failure(result, evidence, config.training.gate.max_missing) is not None:
        return None
    trainer = adapter_trainer(
        models.adapter_trainer,
        models.target_spec,
        config.weight_training,
        models.target,
        config.training.seed,
    )
    if trainer is None:
        night.note(
            f"weights not trained: the target {models.target_spec!r} is not a local model "
            "(`local` or `local:PATH`); the night stayed text-only"
        )
        return None
    if night.training is not None:
        night.training = dataclasses.replace(night.training, weights=config.weights)
    dropped: list[LateDuplicate] = []
    choice, notes = weight_candidates(
        config.weights,
        config.weight_training,
        config.training,
        task,
        mined.splits["train"],
        models.target,
        trainer,
        NightText(adopted, result.skill, result.memory),
        night_dir,
        evidence,
        result.ledger,
        console,
        dropped,
    )
    night.note(*notes)
    night.drop_duplicates(*dropped)
    return choice


# ---- one project ----------------------------------------------------------------------------
