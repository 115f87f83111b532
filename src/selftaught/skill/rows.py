"""The rows a skill run appends to history.jsonl, typed: one `BaselineRow` (step 0) and one
`StepRow` per optimization step. `to_dict` writes the JSON keys the report reads; `row_from_dict`
reads a row back (a row written before a key existed gets its default)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class BaselineRow:
    """Step 0: the initial skill scored on the whole val split."""

    step: int
    skill_version: str
    skill_hash: str
    val: dict[str, Any]  # EvalResult.summary()
    usage: dict[str, Any]
    time_s: float
    stage: str = field(default="baseline", init=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StepRow:
    """One optimization step: the train batch, the edits, the candidates, the gate."""

    step: int
    epoch: int
    batch: dict[str, Any]  # EvalResult.summary() of the step's train rollouts
    budget: int
    edits: dict[str, Any]
    parent_version: str
    candidates: list[dict[str, Any]]
    demos: dict[str, Any]
    analyst: dict[str, Any]
    gate: dict[str, Any]  # GateResult.to_dict()
    val: dict[str, Any] | None  # EvalResult.summary() of the gated candidate (None: none)
    val_cached: bool
    skill_version: str | None
    pool: list[str]
    current_version: str
    best_version: str
    usage: dict[str, Any]  # calls and tokens of this step, per role
    step_time_s: float
    time_s: float
    stopped_by: dict[str, Any] | None = None  # StopReason.to_dict(): the run ended here
    stage: str = field(default="step", init=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


HistoryRow = BaselineRow | StepRow

_DEFAULTS: dict[str, Any] = {
    "candidates": [],
    "demos": {},
    "analyst": {},
    "gate": {},
    "edits": {},
    "pool": [],
    "usage": {},
    "val_cached": False,
}


def row_from_dict(d: dict[str, Any]) -> HistoryRow:
    """A history row back from its JSON (`stage` says which kind)."""
    cls: type[BaselineRow] | type[StepRow] = (
        BaselineRow if d.get("stage") == "baseline" else StepRow
    )
    kwargs: dict[str, Any] = {
        f.name: d.get(f.name, _DEFAULTS.get(f.name)) for f in fields(cls) if f.init
    }
    return cls(**kwargs)
