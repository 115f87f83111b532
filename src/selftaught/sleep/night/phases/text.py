"""The text phases: the skill, then the memory, consolidated with `SkillTrainer` on the night's
train tasks and gated on its val (`consolidate.py`), both charged to the night's one ledger;
or, with many skills, one skill per kind of request (`skills.py`)."""

from __future__ import annotations

from selftaught.sleep.night.consolidate import (
    consolidate,
)
from selftaught.sleep.night.phases.context import NightContext, Phase
from selftaught.sleep.records import (
    PhaseRecord,
    SkillSetRecord,
)


class TextPhase(Phase):
    """Consolidate the skill with the memory held fixed, then the memory with the new skill
    held fixed (reflect → merge → select → apply → gate); every call goes to the evidence
    log. Its record: each document's phase, as report.json `phases` holds it."""

    name = "text"
    seconds = "text"
    after = "after the text phase"

    def run(self, ctx: NightContext) -> tuple[PhaseRecord, ...]:
        config, models, night = ctx.config, ctx.models, ctx.night
        assert ctx.task is not None, "the text phase trains on the split phase's task"
        result = consolidate(
            config.training,
            config.documents,
            config.progress,
            ctx.task,
            models.target,
            models.optimizer,
            models.judge,
            ctx.adopted,
            ctx.night_dir,
            ctx.evidence,
            ctx.console,
            modes=config.demo_modes,
            ledger=ctx.ledger,
            deadline=ctx.deadline,
        )
        ctx.text = result
        night.note(*result.notes)
        night.drop_duplicates(*result.duplicates)
        return tuple(result.phases.values())


class SkillsPhase(Phase):
    """Many skills (`--skills`): one skill per kind of request, each trained, gated and staged
    on its own (its text, its memory, its adapter), in place of the text, proofread, weight
    and stage phases. Its record: the night's `skill_set`."""

    name = "skills"
    seconds = "skills"

    def run(self, ctx: NightContext) -> SkillSetRecord | None:
        from selftaught.sleep.night.skills import learn_skills

        tasks, night = ctx.tasks, ctx.night
        assert tasks is not None and tasks.kinds is not None and ctx.task is not None
        learn_skills(night, ctx.task, ctx.config, ctx.models, ctx.night_dir, ctx.evidence,
                     ctx.ledger, ctx.console, ctx.home, tasks.kinds, tasks.splits,
                     ctx.deadline)  # fmt: skip
        return night.skill_set
