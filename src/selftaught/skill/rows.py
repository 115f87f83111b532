"""The rows a skill run appends to history.jsonl, typed: one `BaselineRow` (step 0) and one
`StepRow` per optimization step (the weight trainers' rows are beside them, in
`weights/rows.py`). `to_dict` writes the JSON keys the report reads; `row_from_dict` reads a
row back (a row written before a key existed gets its default; an accuracy summary of an older
shape is read by the one decoder, `SplitScore.from_dict`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from selftaught.evaluation import EvalResult
from selftaught.gate import GateResult
from selftaught.results import SplitScore
from selftaught.stops import StopReason, stop_dict


@dataclass
class BaselineRow:
    """Step 0: the initial skill scored on the whole val split."""

    step: int
    skill_version: str
    skill_hash: str
    val: EvalResult | None  # None: a row that stored no summary
    usage: dict[str, Any]
    time_s: float
    stage: str = field(default="baseline", init=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "skill_version": self.skill_version,
            "skill_hash": self.skill_hash,
            "val": self.val.summary() if self.val is not None else None,
            "usage": self.usage,
            "time_s": self.time_s,
            "stage": self.stage,
        }


@dataclass
class StepRow:
    """One optimization step: the train batch, the edits, the candidates, the gate."""

    step: int
    epoch: int
    batch: EvalResult | None  # the step's train rollouts (None: a row that stored none)
    budget: int
    edits: dict[str, Any]
    parent_version: str
    candidates: list[dict[str, Any]]
    demos: dict[str, Any]
    analyst: dict[str, Any]
    gate: GateResult | None  # None: a row that recorded no decision
    val: EvalResult | None  # the gated candidate on val (None: no candidate)
    val_cached: bool
    skill_version: str | None
    pool: list[str]
    current_version: str
    best_version: str
    usage: dict[str, Any]  # calls and tokens of this step, per role
    step_time_s: float
    time_s: float
    stopped_by: StopReason | None = None  # the run ended here
    # --curriculum ordered this batch: its [easiest, hardest] difficulty (None: not ordered)
    curriculum: list[float] | None = None
    stage: str = field(default="step", init=False)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.curriculum is None:  # written only when set: older rows read back as written
            del out["curriculum"]
        return {
            **out,
            "batch": self.batch.summary() if self.batch is not None else None,
            "gate": self.gate.to_dict() if self.gate is not None else {},
            "val": self.val.summary() if self.val is not None else None,
            "stopped_by": stop_dict(self.stopped_by),
        }


HistoryRow = BaselineRow | StepRow

_DEFAULTS: dict[str, Any] = {
    "candidates": [],
    "demos": {},
    "analyst": {},
    "edits": {},
    "pool": [],
    "usage": {},
    "val_cached": False,
}


def _summary(value: Any) -> EvalResult | None:
    """A stored summary (None where the row holds none, or one without a hard score)."""
    return EvalResult.from_summary(value) if SplitScore.read(value) is not None else None


def row_from_dict(d: Mapping[str, Any]) -> HistoryRow:
    """A history row back from its JSON (`stage` says which kind)."""
    cls: type[BaselineRow] | type[StepRow] = (
        BaselineRow if d.get("stage") == "baseline" else StepRow
    )
    kwargs: dict[str, Any] = {
        f.name: d.get(f.name, _DEFAULTS.get(f.name)) for f in fields(cls) if f.init
    }
    kwargs["val"] = _summary(d.get("val"))
    if cls is StepRow:
        gate = d.get("gate")
        kwargs["batch"] = _summary(d.get("batch"))
        kwargs["gate"] = GateResult.from_dict(gate) if isinstance(gate, Mapping) and gate else None
        kwargs["stopped_by"] = StopReason.read(d.get("stopped_by"))
    return cls(**kwargs)
