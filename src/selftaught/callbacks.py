"""Callbacks, TRL style: subclass `TrainerCallback`, override the events you need, pass
`callbacks=[...]` to any trainer (`SkillTrainer`, `RestTrainer`, `RLTrainer`) or to
`run_night`. Every method is a no-op by default.

Events:
    on_start(run)                        the run begins (or resumes)
    on_evaluate(run, step, split, scores, label)   a split was scored (the start point at
                                         step 0, a candidate, the final test)
    on_gate(run, step, decision, reason, details)  the gate decided on a candidate
    on_step(run, step, metrics)          a step / round / logged RL step completed
    on_end(run, result)                  the run returned its `RunResult`

A run fires on_start, then per step its candidate's on_evaluate, on_gate and on_step (a
GRPO run: TRL's logged steps, then the trained model's on_evaluate and on_gate), then the
test evaluations and on_end.

A resumed run fires events only for the work it does now. An exception raised by a callback
stops the run: a tracker that cannot write should not fail silently."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from selftaught.results import RunResult, SplitScore


@dataclass
class RunInfo:
    """What every event is told about the run: its method (`skill`, `memory`, `rest`,
    `sft`, `grpo`, `gspo`, `night`), task, directory and settings."""

    method: str
    task: str
    run_dir: Path | None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.run_dir.name if self.run_dir is not None else f"{self.method}-{self.task}"


class TrainerCallback:
    """Base class of run callbacks; override the events you need."""

    def on_start(self, run: RunInfo) -> None:
        pass

    def on_evaluate(
        self, run: RunInfo, *, step: int, split: str, scores: SplitScore, label: str = ""
    ) -> None:
        """`label` tells apart what was scored (`base`, `candidate`, `initial`, `best`, ...)."""

    def on_step(self, run: RunInfo, *, step: int, metrics: dict[str, Any]) -> None:
        """`metrics` holds numbers (and a few strings) describing the step."""

    def on_gate(
        self, run: RunInfo, *, step: int, decision: str, reason: str, details: dict[str, Any]
    ) -> None:
        """`decision` is the gate's: `accept_new_best`, `accept` or `reject` (a night:
        its status, e.g. `staged` or `no_proposal`)."""

    def on_end(self, run: RunInfo, result: RunResult) -> None:
        pass


class CallbackList:
    """Calls each event on every callback, in the order given."""

    def __init__(self, callbacks: Iterable[TrainerCallback] = ()):
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            if not isinstance(cb, TrainerCallback):
                raise TypeError(
                    f"callbacks must be TrainerCallback instances, got {type(cb).__name__}"
                )

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def start(self, run: RunInfo) -> None:
        for cb in self.callbacks:
            cb.on_start(run)

    def evaluate(
        self, run: RunInfo, *, step: int, split: str, scores: SplitScore, label: str = ""
    ) -> None:
        for cb in self.callbacks:
            cb.on_evaluate(run, step=step, split=split, scores=scores, label=label)

    def step(self, run: RunInfo, *, step: int, metrics: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_step(run, step=step, metrics=metrics)

    def gate(
        self, run: RunInfo, *, step: int, decision: str, reason: str, details: dict[str, Any]
    ) -> None:
        for cb in self.callbacks:
            cb.on_gate(run, step=step, decision=decision, reason=reason, details=details)

    def end(self, run: RunInfo, result: RunResult) -> None:
        for cb in self.callbacks:
            cb.on_end(run, result)
