"""Stops: why a run ended before its last step, and the two stops a user sets on any run.

`Stops` is the one config block `optimize`, `train` and `sleep run` share (`--max-minutes`,
`--patience`): a wall-clock limit and a number of steps / rounds / nights without an accepted
candidate. A run checks them only at a safe point (after a step, a round, a phase), so it
always ends cleanly with the best so far, saved and resumable like any run end. `StopReason`
says which stop fired (the budget's too): the typed `stopped_by` of every `RunResult`.

    deadline = Deadline.start(stops.max_minutes)   # this invocation's wall clock
    ...
    if deadline.passed():
        st.stopped_by = StopReason.max_minutes(stops.max_minutes, "after step 4")
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from selftaught.errors import ConfigError
from selftaught.record import Record

STOP_KINDS = ("max_minutes", "patience", "budget", "other")


def now() -> float:
    """The clock deadlines read (tests replace it with a fake one)."""
    return time.monotonic()


@dataclass
class Stops:
    """When a run stops early, at its first safe point (a step, a round, a phase), shipping
    the best so far; both off by default."""

    max_minutes: float | None = None
    """Wall-clock limit of this invocation, in minutes: the run ends at the first safe point
    after it (after a step of optimize, a round or an optimizer step of train, a phase of a
    night), keeping the best so far; re-running the same command resumes with a new limit."""
    patience: int | None = None
    """Stop after this many steps (optimize), rounds (train --method rest) or nights (sleep
    run: the schedule pauses) in a row without a candidate the gate accepted."""

    def __post_init__(self) -> None:
        m = self.max_minutes
        if m is not None and not (isinstance(m, int | float) and math.isfinite(m) and m > 0):
            raise ConfigError(f"max_minutes must be > 0 (or unset), got {m!r}")
        if self.patience is not None and self.patience < 1:
            raise ConfigError(f"patience must be >= 1 (or unset), got {self.patience}")


@dataclass(frozen=True)
class StopReason:
    """Which stop ended a run early: its kind (`max_minutes`, `patience`, `budget`, `other`),
    the limit in words ("30 min", "3 steps without an accepted candidate", "200 of 200 calls
    used") and where it fired ("after step 4", "during step 3", "after the skill phase")."""

    kind: str
    limit: str
    at: str = ""

    def __post_init__(self) -> None:
        if self.kind not in STOP_KINDS:
            raise ConfigError(f"stop kind must be one of {', '.join(STOP_KINDS)}: {self.kind!r}")

    def __str__(self) -> str:
        name = {"max_minutes": "max-minutes", "other": ""}.get(self.kind, self.kind)
        head = f"{name} ({self.limit})" if name else self.limit
        return f"{head} {self.at}".strip()

    @classmethod
    def max_minutes(cls, minutes: float, at: str) -> StopReason:
        return cls("max_minutes", f"{minutes:g} min", at)

    @classmethod
    def patience(cls, k: int, unit: str, at: str) -> StopReason:
        unit = unit.removesuffix("s") if k == 1 else unit
        return cls("patience", f"{k} {unit} without an accepted candidate", at)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "limit": self.limit, "at": self.at, "text": str(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StopReason:
        return cls(str(d.get("kind") or "other"), str(d.get("limit") or ""), str(d.get("at") or ""))

    @classmethod
    def read(cls, value: Any) -> StopReason | None:
        """A stop as any run wrote it: this object, its dict, or the plain text older runs
        wrote ("budget (5 of 5 calls used) during step 1")."""
        if value is None or isinstance(value, StopReason):
            return value
        if isinstance(value, dict):
            return cls.from_dict(value)
        text = str(value)
        if text.startswith("budget (") and ")" in text:
            limit, _, at = text[len("budget (") :].partition(")")
            return cls("budget", limit, at.strip())
        return cls("other", text)


@dataclass(frozen=True, kw_only=True)
class StopRecord(Record):
    """A stop as stored (`StopReason.to_dict()`)."""

    kind: str = "other"
    limit: str = ""
    at: str = ""
    text: str = ""

    @classmethod
    def of(cls, reason: StopReason) -> StopRecord:
        return cls(kind=reason.kind, limit=reason.limit, at=reason.at, text=str(reason))

    @classmethod
    def read(cls, value: Any) -> StopRecord:
        """A stop as a run stored it: its dict, key for key, or the text an older version
        wrote (as its dict: `StopReason.read`)."""
        if isinstance(value, dict):
            return cls.from_dict(value)
        reason = StopReason.read(value)
        return cls.of(reason) if reason is not None else cls.empty()

    @property
    def reason(self) -> StopReason | None:
        return StopReason.read(self.to_dict())


def stop_dict(value: Any) -> dict[str, Any] | None:
    """JSON form of a stop given as a StopReason, its dict or older text (None: none)."""
    reason = StopReason.read(value)
    return reason.to_dict() if reason is not None else None


def stop_text(value: Any) -> str:
    """A stop in words, whichever form it was written in ("" for none)."""
    reason = StopReason.read(value)
    return str(reason) if reason is not None else ""


@dataclass(frozen=True)
class Deadline:
    """The wall-clock limit of one invocation, started when the run starts (None: none)."""

    minutes: float | None
    started: float

    @classmethod
    def start(cls, minutes: float | None) -> Deadline:
        return cls(minutes, now())

    @property
    def limited(self) -> bool:
        return self.minutes is not None

    def remaining_s(self) -> float | None:
        if self.minutes is None:
            return None
        return self.minutes * 60.0 - (now() - self.started)

    def passed(self) -> bool:
        left = self.remaining_s()
        return left is not None and left <= 0

    def remaining_minutes(self, floor: float = 1e-6) -> float | None:
        """What is left as a `max_minutes` for a nested run (at least `floor`: a nested run
        then stops at its first safe point)."""
        left = self.remaining_s()
        return None if left is None else max(floor, left / 60.0)


UNLIMITED = Deadline(None, 0.0)


def patience_reached(stops: Stops, without_accept: int) -> bool:
    """Whether `without_accept` steps / rounds / nights in a row exhaust the patience."""
    return stops.patience is not None and without_accept >= stops.patience


def accepted(decision: str | None) -> bool:
    """A gate decision that took the candidate (`accept` or `accept_new_best`)."""
    return decision in ("accept", "accept_new_best")
