"""What a skill optimization run returns: `SkillRunResult`, a `RunResult` with the run's
summary as typed fields. `to_dict()` is what `summary.json` holds (the summary's readable keys
plus `RunResult`'s); `from_dict` reads it back, an older run's summary too."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from selftaught.demos import DemoDict
from selftaught.evaluation import EvalResult, ItemCost
from selftaught.gate import Paired
from selftaught.models.usage import Budget, Usage
from selftaught.results import RunResult
from selftaught.stops import stop_dict

if TYPE_CHECKING:
    from selftaught.skill.reflect import AnalystCall


@dataclass
class ParseStats:
    """How the analyst's replies parsed: ok, repaired, invalid JSON, or a backend error."""

    calls: int = 0
    ok: int = 0
    repaired: int = 0
    invalid_json: int = 0
    backend_error: int = 0

    def add(self, call: AnalystCall) -> None:
        self.calls += 1
        setattr(self, call.status, getattr(self, call.status) + 1)

    def rate(self) -> float | None:
        """Share of answered calls whose reply parsed (repaired ones included)."""
        answered = self.calls - self.backend_error
        return (self.ok + self.repaired) / answered if answered else None

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "parse_rate": self.rate()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ParseStats:
        return cls(**{f.name: int(d.get(f.name) or 0) for f in fields(cls)})


@dataclass
class SkillTest:
    """The initial and the best skill on the test split, paired item by item."""

    initial: EvalResult
    best: EvalResult
    versions: dict[str, str]
    paired: Paired
    gain: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "initial": self.initial.summary(),
            "best": self.best.summary(),
            "versions": dict(self.versions),
            "paired": self.paired.to_dict(),
            "gain": self.gain,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SkillTest:
        p = d.get("paired") or {}
        return cls(
            initial=EvalResult.from_summary(d["initial"]),
            best=EvalResult.from_summary(d["best"]),
            versions=dict(d.get("versions") or {}),
            paired=Paired(
                int(p.get("wins", 0)),
                int(p.get("losses", 0)),
                int(p.get("ties", 0)),
                float(p.get("sign_test_p", 1.0)),
            ),
            gain=float(d.get("gain", 0.0)),
        )


@dataclass(frozen=True)
class RuleTrial:
    """One rule's leave-one-out: dropped (it earned nothing), kept, or untried."""

    rule: str
    verdict: Literal["dropped", "kept", "untried"]
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RuleTrial:
        return cls(str(d["rule"]), d["verdict"], str(d.get("why") or ""))


@dataclass(frozen=True)
class SlowUpdate:
    """What a run's slow update did: whether it was due, each rule's trial, the merges, the
    gate's decision on the rewrite and whether it shipped (became the best skill)."""

    due: bool
    reason: str
    runs: int = 0  # runs of this document the ledger records, this one included
    every: int = 0
    trials: tuple[RuleTrial, ...] = ()
    merged: tuple[tuple[str, str, str], ...] = ()  # (op, target, content) applied
    decision: str | None = None  # the gate's, on the rewrite
    val_before: float | None = None  # hard val mean of the current skill
    val_after: float | None = None  # of the rewrite
    chars_before: int = 0
    chars_after: int = 0
    version: str | None = None  # the rewrite's saved version
    shipped: bool = False

    @property
    def dropped(self) -> list[str]:
        return [t.rule for t in self.trials if t.verdict == "dropped"]

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "trials": [t.to_dict() for t in self.trials],
            "merged": [list(m) for m in self.merged],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SlowUpdate:
        return cls(
            due=bool(d["due"]),
            reason=str(d.get("reason") or ""),
            runs=int(d.get("runs") or 0),
            every=int(d.get("every") or 0),
            trials=tuple(RuleTrial.from_dict(t) for t in d.get("trials") or ()),
            merged=tuple((str(a), str(b), str(c)) for a, b, c in d.get("merged") or ()),
            decision=d.get("decision"),
            val_before=d.get("val_before"),
            val_after=d.get("val_after"),
            chars_before=int(d.get("chars_before") or 0),
            chars_after=int(d.get("chars_after") or 0),
            version=d.get("version"),
            shipped=bool(d.get("shipped")),
        )


def _eval(d: dict[str, Any] | None) -> EvalResult | None:
    return EvalResult.from_summary(d) if d else None


@dataclass(frozen=True)
class FrontPoint:
    """One skill scored on the whole val split: its mean val metric, what it spent per val
    item (None: not measured, e.g. every reply read from the response cache), and whether it
    is on the front (no other skill scores at least as well for fewer tokens)."""

    version: str
    val: float
    cost: ItemCost | None
    on_front: bool = False
    shipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "val": round(self.val, 6),
            "cost": self.cost.to_dict() if self.cost else None,
            "on_front": self.on_front,
            "shipped": self.shipped,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FrontPoint:
        c = d.get("cost")
        cost = None
        if c:
            usd = c.get("usd")
            cost = ItemCost(int(c["items"]), float(c["prompt_tokens"]),
                            float(c["completion_tokens"]), float(c["latency_s"]),
                            None if usd is None else float(usd))  # fmt: skip
        return cls(str(d["version"]), float(d["val"]), cost, bool(d.get("on_front")),
                   bool(d.get("shipped")))  # fmt: skip


def cost_front(points: list[tuple[str, float, ItemCost | None]], shipped: str) -> list[FrontPoint]:
    """Score against cost for every skill scored on val: a measured skill is on the front when
    no other measured one scores at least as well for fewer tokens per item (or better for as
    few). In version order."""
    measured = [(v, val, c) for v, val, c in points if c is not None]

    def dominated(val: float, tokens: float) -> bool:
        return any(
            (o_val >= val and c.tokens < tokens) or (o_val > val and c.tokens <= tokens)
            for _, o_val, c in measured
        )

    return [
        FrontPoint(v, val, c, c is not None and not dominated(val, c.tokens), v == shipped)
        for v, val, c in sorted(points, key=lambda p: p[0])
    ]


@dataclass(frozen=True, kw_only=True)
class SkillRunResult(RunResult):
    """A skill (or memory: `method`) run: the shipped document, val before / after, the test
    comparison when test was scored, gate decisions, analyst parse rate, usage (the final test
    apart, in `test_usage`). The base and shipped scores are on test when the run scored it,
    else on val."""

    kind: ClassVar[str] = "skill"

    steps: int = 0
    total_steps: int = 0
    best_version: str = ""
    best_skill: str = ""
    best_demos: list[DemoDict] = field(default_factory=list)
    pool: list[str] = field(default_factory=list)
    val_initial: EvalResult | None = None
    val_best: EvalResult | None = None
    decisions: dict[str, int] = field(default_factory=dict)
    analyst: ParseStats = field(default_factory=ParseStats)
    test: SkillTest | None = None
    test_usage: Usage = field(default_factory=dict)
    budget: Budget = field(default_factory=Budget)
    slow: SlowUpdate | None = None  # the slow update at the run's end (`skill.slow`), when set
    front: list[FrontPoint] = field(default_factory=list)  # score against cost, every skill

    def __post_init__(self) -> None:
        super().__post_init__()
        base: EvalResult | None
        shipped: EvalResult | None
        if self.test is not None:
            base, shipped = self.test.initial, self.test.best
        else:
            base, shipped = self.val_initial, self.val_best
        self._derive(
            method=self.method or "skill",
            base_score=self.base_score or (base.score() if base is not None else None),
            shipped_score=self.shipped_score or (shipped.score() if shipped is not None else None),
        )

    @property
    def document(self) -> str:
        """What was trained: `skill`, or `memory` (the skill held fixed)."""
        return self.method

    @property
    def llm_calls(self) -> int:
        """Calls of every role the run charged (the final test apart)."""
        return sum(int(u.get("calls", 0)) for u in self.usage.values())

    @property
    def tokens(self) -> int:
        return sum(
            int(u.get("prompt_tokens", 0)) + int(u.get("completion_tokens", 0))
            for u in self.usage.values()
        )

    def texts(self) -> dict[str, str]:
        return {f"best_{self.method}.md": self.best_skill}

    def to_dict(self) -> dict[str, Any]:
        """The summary's keys (what summary.json always held) and RunResult's."""
        return {
            "run_dir": str(self.run_dir) if self.run_dir is not None else None,
            "task": self.task,
            "document": self.document,
            "steps": self.steps,
            "total_steps": self.total_steps,
            "best_version": self.best_version,
            "best_skill": self.best_skill,
            "best_demos": self.best_demos,
            "pool": list(self.pool),
            "val_initial": self.val_initial.summary() if self.val_initial else None,
            "val_best": self.val_best.summary() if self.val_best else None,
            "decisions": dict(self.decisions),
            "analyst": self.analyst.to_dict(),
            "test": self.test.to_dict() if self.test else None,
            "usage": self.usage,
            "llm_calls": self.llm_calls,
            "tokens": self.tokens,
            "budget": asdict(self.budget),
            "stopped_by": stop_dict(self.stopped_by),
            "test_usage": self.test_usage,
            "elapsed_s": round(self.seconds, 2),
            "slow": self.slow.to_dict() if self.slow else None,
            # score against cost (a summary written before it was measured has none)
            **({"front": [p.to_dict() for p in self.front]} if self.front else {}),
            **super().to_dict(),
        }

    @classmethod
    def _fields_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        budget = dict(d.get("budget") or {})
        if budget.get("roles") is not None:
            budget["roles"] = tuple(budget["roles"])
        return {
            **super()._fields_from_dict(d),
            "method": str(d.get("method") or d.get("document") or "skill"),
            "steps": int(d.get("steps") or 0),
            "total_steps": int(d.get("total_steps") or 0),
            "best_version": str(d.get("best_version") or ""),
            "best_skill": str(d.get("best_skill") or ""),
            "best_demos": list(d.get("best_demos") or []),
            "pool": list(d.get("pool") or []),
            "val_initial": _eval(d.get("val_initial")),
            "val_best": _eval(d.get("val_best")),
            "decisions": dict(d.get("decisions") or {}),
            "analyst": ParseStats.from_dict(d.get("analyst") or {}),
            "test": SkillTest.from_dict(d["test"]) if d.get("test") else None,
            "test_usage": dict(d.get("test_usage") or {}),
            "budget": Budget(**budget),
            "seconds": float(d.get("seconds") or d.get("elapsed_s") or 0.0),
            "slow": SlowUpdate.from_dict(d["slow"]) if d.get("slow") else None,
            "front": [FrontPoint.from_dict(p) for p in d.get("front") or []],
        }
