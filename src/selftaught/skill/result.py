"""What a skill optimization run returns: `SkillRunResult`, a `RunResult` that also carries
the run's summary (the dict `summary.json` holds)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from selftaught.results import RunResult, Score

# keys RunResult.to_dict adds that the skill summary does not hold
_RESULT_ONLY = ("kind", "method", "base_score", "shipped_score", "seconds")


@dataclass
class SkillRunResult(RunResult):
    """A skill (or memory) run: the shipped document, val before / after, the test
    comparison when test was scored, gate decisions, analyst parse rate, usage. The base and
    shipped scores are on test when the run scored it, else on val.

    `result.summary` is the summary dict; `result["key"]` reads it too (as when `train()`
    returned the dict)."""

    kind: ClassVar[str] = "skill"

    summary: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        s = self.summary
        if self.run_dir is None and s.get("run_dir"):
            self.run_dir = Path(s["run_dir"])
        self.method = self.method or str(s.get("document") or "skill")
        self.task = self.task or str(s.get("task") or "")
        test = s.get("test") or {}
        if test.get("initial") and test.get("best"):
            base, shipped, split = test["initial"], test["best"], "test"
        else:
            base, shipped, split = s.get("val_initial"), s.get("val_best"), "val"
        if self.base_score is None and base:
            self.base_score = Score.from_summary(base, split)
        if self.shipped_score is None and shipped:
            self.shipped_score = Score.from_summary(shipped, split)
        self.stopped_by = self.stopped_by or s.get("stopped_by")
        self.usage = self.usage or dict(s.get("usage") or {})
        self.seconds = self.seconds or float(s.get("elapsed_s") or 0.0)

    # ---- the summary's main fields, typed -------------------------------------------------
    @property
    def best_skill(self) -> str:
        return str(self.summary.get("best_skill", ""))

    @property
    def best_version(self) -> str:
        return str(self.summary.get("best_version", ""))

    @property
    def val_initial(self) -> Score | None:
        d = self.summary.get("val_initial")
        return Score.from_summary(d, "val") if d else None

    @property
    def val_best(self) -> Score | None:
        d = self.summary.get("val_best")
        return Score.from_summary(d, "val") if d else None

    @property
    def test(self) -> dict[str, Any] | None:
        return self.summary.get("test")

    @property
    def decisions(self) -> dict[str, int]:
        return dict(self.summary.get("decisions") or {})

    # ---- the dict it used to be -------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self.summary[key]

    def __contains__(self, key: object) -> bool:
        return key in self.summary

    def get(self, key: str, default: Any = None) -> Any:
        return self.summary.get(key, default)

    def texts(self) -> dict[str, str]:
        return {f"best_{self.method}.md": self.best_skill}

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary, **super().to_dict()}

    @classmethod
    def _fields_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        summary = {k: v for k, v in d.items() if k not in _RESULT_ONLY}
        return {**super()._fields_from_dict(d), "summary": summary}
