"""One typed result for every run: `RunResult`, which each trainer's result subclasses.

`SkillTrainer`, `RestTrainer`, `RLTrainer` and a sleep night all return a `RunResult`
subclass (`SkillRunResult`, `RestResult`, `RLResult`, `NightResult`): where the run lives,
the starting and the shipped score with their 95% intervals, why it stopped early (if it did)
and what it spent. `to_dict()` is JSON-ready; `RunResult.from_dict(d)` rebuilds the subclass
named by `d["kind"]`, so a result read back from disk is the object the run returned."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

from selftaught.stops import StopReason, stop_dict

_KINDS: dict[str, type[RunResult]] = {}
_R = TypeVar("_R", bound="RunResult")


def _pair(value: Any) -> tuple[float, float]:
    lo, hi = value if value is not None else (0.0, 0.0)
    return float(lo), float(hi)


@dataclass(frozen=True)
class Score:
    """One split's score: hard (solved share) and soft (partial credit), each with its 95%
    interval (`hard_ci`, `soft_ci`: the names every summary uses), over `n` scored examples."""

    split: str
    n: int
    hard: float
    hard_ci: tuple[float, float]
    soft: float
    soft_ci: tuple[float, float]

    @classmethod
    def from_summary(cls, d: dict[str, Any], split: str | None = None) -> Score:
        """From an evaluation summary (`EvalResult.summary()`) or `to_dict()`; a result written
        before one name was kept (`hard_ci95`, `soft_ci95`) reads the same."""
        return cls(
            split=str(split or d.get("split") or "?"),
            n=int(d.get("n", 0)),
            hard=float(d.get("hard", 0.0)),
            hard_ci=_pair(d.get("hard_ci", d.get("hard_ci95"))),
            soft=float(d.get("soft", 0.0)),
            soft_ci=_pair(d.get("soft_ci", d.get("soft_ci95"))),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "n": self.n,
            "hard": self.hard,
            "hard_ci": list(self.hard_ci),
            "soft": self.soft,
            "soft_ci": list(self.soft_ci),
        }


def _score(d: dict[str, Any] | None) -> Score | None:
    return Score.from_summary(d) if d else None


@dataclass(kw_only=True)
class RunResult:
    """What a run shipped: its directory, the start and shipped scores (on test when the run
    scored test, else on val: `Score.split` says which), why it stopped early, what it spent
    (per role: calls, tokens) and how long it took."""

    kind: ClassVar[str] = "run"

    run_dir: Path | None = None
    method: str = ""
    task: str = ""
    base_score: Score | None = None
    shipped_score: Score | None = None
    stopped_by: StopReason | None = None
    """Which stop ended the run early (max-minutes, patience, the budget); None: it ran to its
    end. Text an older run wrote is read into one (`StopReason.read`)."""
    usage: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.stopped_by = StopReason.read(self.stopped_by)

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "kind" in cls.__dict__:
            _KINDS[cls.kind] = cls

    @property
    def gain(self) -> float | None:
        """Shipped minus base hard score (None when either is unknown)."""
        if self.base_score is None or self.shipped_score is None:
            return None
        return self.shipped_score.hard - self.base_score.hard

    def texts(self) -> dict[str, str]:
        """Text artifacts a tracker keeps (file name → text): the shipped skill, ..."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "run_dir": str(self.run_dir) if self.run_dir is not None else None,
            "method": self.method,
            "task": self.task,
            "base_score": self.base_score.to_dict() if self.base_score else None,
            "shipped_score": self.shipped_score.to_dict() if self.shipped_score else None,
            "stopped_by": stop_dict(self.stopped_by),
            "usage": self.usage,
            "seconds": round(self.seconds, 2),
        }

    @classmethod
    def from_dict(cls: type[_R], d: dict[str, Any]) -> _R:
        """The result `to_dict()` wrote, as the subclass its `kind` names."""
        if cls is RunResult:  # _R is RunResult here: any subclass is one
            target = _KINDS.get(str(d.get("kind")), cls)
            return cast(_R, target(**target._fields_from_dict(d)))
        return cls(**cls._fields_from_dict(d))

    @classmethod
    def _fields_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        """The constructor's keyword arguments; subclasses add their own fields."""
        run_dir = d.get("run_dir")
        return {
            "run_dir": Path(run_dir) if run_dir else None,
            "method": d.get("method", ""),
            "task": d.get("task", ""),
            "base_score": _score(d.get("base_score")),
            "shipped_score": _score(d.get("shipped_score")),
            "stopped_by": StopReason.read(d.get("stopped_by")),
            "usage": d.get("usage") or {},
            "seconds": float(d.get("seconds") or 0.0),
        }
