"""What a skill run carries from step to step (plain data; `persist` writes and reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from selftaught.skill.demo_search import DemoPool
from selftaught.skill.grounding import TrainSummary
from selftaught.skill.result import ParseStats
from selftaught.stops import StopReason


@dataclass
class SkillVersion:
    """One saved version of the trained document: `vNNNN[-J]`, its text and policy hash."""

    version: str
    text: str
    hash: str


@dataclass
class RunState:
    """The run between steps: the last completed step, the current and best versions, the
    rejected-edit buffer, the pool of versions that passed the gate and the demo pool."""

    step: int = -1  # last completed step; -1: not even the baseline
    current: SkillVersion | None = None
    best: SkillVersion | None = None
    rejected: list[dict[str, Any]] = field(default_factory=list)
    parse: ParseStats = field(default_factory=ParseStats)
    elapsed_s: float = 0.0
    last_row: dict[str, Any] | None = None
    finished: bool = False
    stopped_by: StopReason | None = None  # why the run ended before its last step
    without_accept: int = 0  # steps in a row the gate accepted nothing (`--patience`)
    pool: list[str] = field(default_factory=list)  # versions that passed the gate
    demo_pool: DemoPool = field(default_factory=DemoPool)
    train_summary: TrainSummary | None = None  # `grounded_proposals`: written once per run
    edit_budget: int | None = None  # the adaptive schedule's next budget (None: its first)
