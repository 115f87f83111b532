"""What the night's phases share: one typed `NightContext` (the night's inputs, what each
phase hands the next, the result being built) and the `Phase` every step of the night is."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.console import Console

from selftaught.models.usage import UsageLedger
from selftaught.sleep.night.config import NightConfig, NightModels
from selftaught.sleep.night.evidence import EvidenceLog
from selftaught.sleep.paths import Adopted
from selftaught.sleep.records import PhaseOutput
from selftaught.sleep.result import NightDraft
from selftaught.stops import UNLIMITED, Deadline, StopReason

if TYPE_CHECKING:
    from selftaught.sleep.intake.log import Interaction
    from selftaught.sleep.night import recall
    from selftaught.sleep.night.consolidate import Consolidation
    from selftaught.sleep.night.kinds import NightKinds
    from selftaught.sleep.night.mine import MineConfig, MinedTask
    from selftaught.sleep.night.split import NightTask
    from selftaught.sleep.night.weak import WaitingLabel
    from selftaught.sleep.night.weight_night import WeightChoice


@dataclass(frozen=True)
class Harvest:
    """What the mine phase hands the split: tonight's tasks (`tonight`) with the recalled
    ones the target can be checked on (`combined`), the recall pool's records to write back
    after the night, the rows it read that are private, and the plain exchanges nothing
    could check (for the weak labels)."""

    tonight: list[MinedTask]
    combined: list[MinedTask]
    rest: list[recall.Recalled]
    private_ids: set[str]
    unchecked: list[Interaction]
    mining: MineConfig


@dataclass
class Splits:
    """What the split phase hands the phases after it: tonight's tasks, the night's splits
    (tonight's and recalled tasks, weak labels and dreamt variants in train), every task's
    kind, and what recall and the weak labels keep after the night."""

    tonight: list[MinedTask]
    splits: dict[str, list[MinedTask]]
    rest: list[recall.Recalled]
    private_ids: set[str]
    weak_waiting: list[WaitingLabel] | None = None
    """The project's weak-label file after the night (None: weak labels off)."""
    kinds: NightKinds | None = None
    """Every task's kind of request, and the kinds after tonight (`kinds.py`)."""


@dataclass(frozen=True)
class NightWindow:
    """What `run_night`, holding the night lock, read for one project: the night's id, the
    project's window and its rows (oldest first), and the clock of the whole night."""

    night: str
    since: float
    until: float
    rows: tuple[Interaction, ...]
    deadline: Deadline = UNLIMITED


@dataclass
class NightContext:
    """One project's night as its phases see it: the inputs (settings, models, the adopted
    version it starts from, its folder, evidence log, usage ledger and clock), what each
    phase hands the next (typed, one field each), and `night`, the result being built (a
    `NightDraft`: the night's end makes it the frozen `NightResult`)."""

    night: NightDraft
    config: NightConfig
    models: NightModels
    adopted: Adopted
    night_dir: Path
    home: Path
    console: Console
    evidence: EvidenceLog
    ledger: UsageLedger
    rows: list[Interaction]
    """The window's rows, oldest first (the window phase keeps what the night reads)."""
    since: float = 0.0
    until: float = 0.0
    deadline: Deadline = UNLIMITED
    dry_run: bool = False
    harvest: Harvest | None = None
    """The mine phase's: tonight's tasks with the recalled ones, for the split."""
    tasks: Splits | None = None
    """The split phase's: the night's splits, kinds and what recall keeps after it."""
    task: NightTask | None = None
    """The split phase's: the task the night replays its splits with."""
    text: Consolidation | None = None
    """The text phase's skill and memory (the proofread phase drops their riders)."""
    choice: WeightChoice | None = None
    """The weight phase's: the gate's pick among text, weights and both."""
    late: bool = False
    """The night's --max-minutes had passed at the last phase boundary."""
    records: dict[str, PhaseOutput] = field(default_factory=dict)
    """Each phase's record, by the phase's name, in the order they ran."""

    @property
    def project(self) -> str:
        return self.night.project

    def time_up(self, at: str) -> bool:
        """Whether the night's `--max-minutes` has passed at this phase boundary; the first
        time, the stop is recorded."""
        if not self.deadline.passed():
            return False
        night = self.night
        if night.stopped_by is None:
            assert self.config.stops.max_minutes is not None
            stop = StopReason.max_minutes(self.config.stops.max_minutes, at)
            night.stopped_by = stop
            night.note(
                f"stopped by {stop}: the phases after it were skipped; only what the gate "
                "accepted is staged"
            )
        self.late = True
        return True

    @contextmanager
    def timed(self, key: str | None) -> Iterator[None]:
        """Add the block's wall seconds to the night's `phase_seconds[key]` (what a night
        costs); None: not timed."""
        if key is None:
            with nullcontext():
                yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.night.add_seconds(key, time.perf_counter() - t0)


class Phase:
    """One step of the night: `run(ctx)` does it and returns its record (a frozen `Record`,
    one a document, or None when it had nothing to do). `name` names it in
    `NightResult.records` (and for a caller that skips or replaces it); `seconds`: the
    `phase_seconds` key its time adds to (None: not timed); `after`: the boundary its end is,
    where the night's --max-minutes is checked (None: not checked).

    A phase of your own subclasses this and goes in `NightTrainer(..., phases=[...])`, e.g.
    `[*default_phases(config), MyPhase()]`; it reads what the phases before it left in the
    context and may leave its own there for the ones after; its record subclasses `Record`
    (`selftaught.sleep.records`), as every record of a night does."""

    name: ClassVar[str] = ""
    seconds: ClassVar[str | None] = None
    after: ClassVar[str | None] = None

    def run(self, ctx: NightContext) -> PhaseOutput:
        raise NotImplementedError
