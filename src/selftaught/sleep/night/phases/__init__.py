"""The night as a pipeline of phases over one `NightContext`, one file per phase:

    window → mine → split → text → proofread → weights → stage
    window → mine → split → skills                      (many skills)

Each phase is an object with `run(ctx)` returning its record; `NightTrainer` runs
`default_phases(config)` in `train()`, or the `phases=` it is given: add a phase of your own
(`Phase` subclass), leave one out, or put another in its place."""

from __future__ import annotations

from selftaught.sleep.night.config import NightConfig
from selftaught.sleep.night.phases.context import (
    Harvest,
    NightContext,
    NightWindow,
    Phase,
    Splits,
)
from selftaught.sleep.night.phases.mine import WORKSPACE_LEFT, MinePhase, mine
from selftaught.sleep.night.phases.proofread import ProofreadPhase
from selftaught.sleep.night.phases.split import SplitPhase
from selftaught.sleep.night.phases.stage import StagePhase, StageRecord
from selftaught.sleep.night.phases.text import SkillsPhase, TextPhase
from selftaught.sleep.night.phases.weights import WeightsPhase
from selftaught.sleep.night.phases.window import WindowPhase

__all__ = [
    "WORKSPACE_LEFT",
    "Harvest",
    "MinePhase",
    "NightContext",
    "NightWindow",
    "Phase",
    "ProofreadPhase",
    "SkillsPhase",
    "SplitPhase",
    "Splits",
    "StagePhase",
    "TextPhase",
    "StageRecord",
    "WeightsPhase",
    "WindowPhase",
    "default_phases",
    "mine",
]


def default_phases(config: NightConfig) -> list[Phase]:
    """The night's phases for `config`, in order (many skills: one skill per kind in place of
    the text, proofread, weight and stage phases)."""
    head: list[Phase] = [WindowPhase(), MinePhase(), SplitPhase()]
    if config.many_skills:
        return [*head, SkillsPhase()]
    return [*head, TextPhase(), ProofreadPhase(), WeightsPhase(), StagePhase()]
