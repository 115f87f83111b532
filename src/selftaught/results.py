"""One typed result for every run: `RunResult`, which each trainer's result subclasses.

`SkillTrainer`, `RestTrainer`, `RLTrainer` and a sleep night all return a `RunResult`
subclass (`SkillRunResult`, `RestResult`, `RLResult`, `NightResult`): where the run lives,
the starting and the shipped score with their 95% intervals, why it stopped early (if it did)
and what it spent. Each is a frozen dataclass. `to_dict()` is JSON-ready;
`RunResult.from_dict(d)` rebuilds the subclass named by `d["kind"]`, so a result read back from
disk is the object the run returned."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

from selftaught.errors import InputError
from selftaught.models.usage import Usage
from selftaught.stats import wilson_interval
from selftaught.stops import StopReason, stop_dict

_KINDS: dict[str, type[RunResult]] = {}
_R = TypeVar("_R", bound="RunResult")


class SummaryError(InputError):
    """An accuracy summary whose numbers are not numbers (the message names the key)."""


# The accuracy summaries runs wrote before every trainer wrote `EvalResult.summary()`, each
# key mapped to the key of the one shape:
# - the skill trainer's {n, errors, solved, hard, hard_ci95, soft, soft_ci95},
# - a night's held-out scores {n, errors, hard, hard_ci95, soft, tokens} (and its
#   `val_before` / `val_after` before one shape),
# - the weight trainers' {split, n, solved, accuracy, ci, mean_soft, truncated, seconds},
# - the peers benchmark's {n, errors, solved, hard, ci95}.
# A key of the one shape wins over an old one when both are present.
LEGACY_KEYS: dict[str, str] = {
    "hard_ci95": "hard_ci",
    "soft_ci95": "soft_ci",
    "ci95": "hard_ci",
    "ci": "hard_ci",
    "errors": "n_errors",
    "accuracy": "hard",
    "mean_soft": "soft",
    "seconds": "wall_s",
}
_NUMBERS = ("n", "hard", "soft", "solved", "n_errors")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def one_shape(d: Mapping[str, Any]) -> dict[str, Any]:
    """`d` in the one summary shape (`EvalResult.summary()`'s keys): an old shape's keys are
    renamed (`LEGACY_KEYS`); a non-numeric count or score is a `SummaryError`."""
    out = {LEGACY_KEYS[k]: v for k, v in d.items() if k in LEGACY_KEYS}
    out.update({k: v for k, v in d.items() if k not in LEGACY_KEYS})
    for key in _NUMBERS:
        v = out.get(key)
        if v is not None and not _is_number(v):
            raise SummaryError(f"an accuracy summary has a non-numeric {key!r} ({v!r})")
    return out


def _interval(value: Any) -> tuple[float, float] | None:
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(map(_is_number, value)):
        return float(value[0]), float(value[1])
    return None


@dataclass(frozen=True)
class SplitScore:
    """One split's accuracy summary: hard (solved share) and soft (partial credit), each with
    its 95% interval (`hard_ci`, `soft_ci`), over `n` scored examples (one example's score is
    `tasks.base.Score`).

    The one reader of every accuracy summary a run directory holds: `from_dict` reads
    `EvalResult.summary()`, `to_dict()`, and each older shape (`LEGACY_KEYS`). A hard
    interval the summary did not store is the Wilson interval of its counts (as `evaluate`
    computes it); a soft one cannot be recomputed and is None."""

    split: str
    n: int
    hard: float
    hard_ci: tuple[float, float]
    soft: float
    soft_ci: tuple[float, float] | None  # None: an older summary stored none

    @property
    def solved(self) -> int:
        return round(self.hard * self.n)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], split: str | None = None) -> SplitScore:
        """From any accuracy summary (`split` overrides the one it names); a missing number
        reads as 0."""
        s = one_shape(d)
        n = int(s.get("n") or 0)
        hard = float(s.get("hard") or 0.0)
        hard_ci = _interval(s.get("hard_ci"))
        if hard_ci is None:
            solved = s.get("solved")
            hard_ci = wilson_interval(int(solved) if solved is not None else round(hard * n), n)
        return cls(
            split=str(split or s.get("split") or "?"),
            n=n,
            hard=hard,
            hard_ci=hard_ci,
            soft=float(s.get("soft") or 0.0),
            soft_ci=_interval(s.get("soft_ci")),
        )

    # the name the readers used before there was one decoder
    from_summary = from_dict

    @classmethod
    def read(cls, d: Any, metric: str = "hard") -> SplitScore | None:
        """The summary `d` holds, or None where there is none: `d` is not a dict (a step
        with no candidate, a run still going) or stores no `metric` value."""
        if not isinstance(d, Mapping) or one_shape(d).get(metric) is None:
            return None
        return cls.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "n": self.n,
            "hard": self.hard,
            "hard_ci": list(self.hard_ci),
            "soft": self.soft,
            "soft_ci": list(self.soft_ci) if self.soft_ci is not None else None,
        }


def _score(d: dict[str, Any] | None) -> SplitScore | None:
    return SplitScore.from_dict(d) if d else None


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What a run shipped: its directory, the start and shipped scores (on test when the run
    scored test, else on val: `SplitScore.split` says which), why it stopped early, what it spent
    (per role: calls, tokens) and how long it took. Frozen, as each subclass is: a result that
    changes after its run (an adopted night) is a new one (`dataclasses.replace`)."""

    kind: ClassVar[str] = "run"

    run_dir: Path | None = None
    method: str = ""
    task: str = ""
    base_score: SplitScore | None = None
    shipped_score: SplitScore | None = None
    stopped_by: StopReason | None = None
    """Which stop ended the run early (max-minutes, patience, the budget); None: it ran to its
    end. Text an older run wrote is read into one (`StopReason.read`)."""
    usage: Usage = field(default_factory=dict)
    """What it spent per role (`UsageLedger.to_dict()`: calls, tokens, errors, USD, ...)."""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self._derive(stopped_by=StopReason.read(self.stopped_by))

    def _derive(self, **values: Any) -> None:
        """Set fields that `__post_init__` derives from the others (the result is frozen)."""
        for name, value in values.items():
            object.__setattr__(self, name, value)

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


def __getattr__(name: str) -> Any:
    """`Score`, this class's name before `tasks.base.Score` was the only `Score`: still read
    (docs named `selftaught.results.Score.from_dict`), with a DeprecationWarning."""
    if name == "Score":
        warnings.warn(
            "selftaught.results.Score is now SplitScore (tasks.base.Score is one example's score)",
            DeprecationWarning,
            stacklevel=2,
        )
        return SplitScore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
