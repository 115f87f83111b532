"""The sections of a night's report.json, typed: one frozen dataclass per section.

Every section is a `Record`: its known keys are typed fields, keys this version does not know
(written by a newer one, or by an older one that had more) are kept in `extra`, and the keys
it was read with are remembered in order (`read_keys`), so `Record.from_dict(d).to_dict()`
equals `d` for every report.json written today or before. A record built in code (not read)
writes all of its fields.

Accuracy summaries (`EvalResult.summary()`, any older shape) are `Summary` records whose
`score` is the one decoded `Score`; gate decisions are `GateRecord`s whose `result` is the
`GateResult`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from selftaught.gate import GateResult
from selftaught.results import Score
from selftaught.stops import StopReason

_R = TypeVar("_R", bound="Record")
Decoder = Callable[[Any], Any]
_OWN = ("extra", "read_keys")


def plain(value: Any) -> Any:
    """`value` as JSON holds it: records as their dicts, tuples as lists."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class Record:
    """A report section: typed fields, the keys it does not type, the keys it was read with."""

    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """Keys this version does not type, written back as they came."""
    read_keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)
    """The keys of the dict it was read from, in order (None: built in code)."""

    decoders: ClassVar[Mapping[str, Decoder]] = {}
    """Field name → how its JSON value becomes the typed one (a None stays None)."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name not in _OWN)

    @classmethod
    def from_dict(cls: type[_R], d: Mapping[str, Any]) -> _R:
        names = set(cls.names())
        known: dict[str, Any] = {}
        for key, value in d.items():
            if key in names:
                decode = cls.decoders.get(key)
                known[key] = decode(value) if decode is not None and value is not None else value
        extra = {k: v for k, v in d.items() if k not in names}
        return cls(**known, extra=extra, read_keys=tuple(d))

    def to_dict(self) -> dict[str, Any]:
        names = self.names()
        order = (*names, *self.extra) if self.read_keys is None else self.read_keys
        return {k: plain(self.extra[k] if k in self.extra else getattr(self, k)) for k in order}


def each(record: type[_R]) -> Decoder:
    """A decoder for a {name: record} mapping."""
    return lambda d: {k: record.from_dict(v) for k, v in d.items()}


def many(record: type[_R]) -> Decoder:
    """A decoder for a list of records."""
    return lambda items: tuple(record.from_dict(v) for v in items)


def strings(items: Sequence[Any]) -> tuple[str, ...]:
    return tuple(str(v) for v in items)


def pair(items: Sequence[Any]) -> tuple[float, float]:
    return float(items[0]), float(items[1])


# ---- shared pieces --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Summary(Record):
    """One accuracy summary (`EvalResult.summary()` or an older shape); `score` decodes it."""

    split: str | None = None
    n: int = 0
    hard: float = 0.0
    soft: float = 0.0
    hard_ci: tuple[float, float] | None = None
    soft_ci: tuple[float, float] | None = None
    solved: int | None = None
    n_errors: int | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {"hard_ci": pair, "soft_ci": pair}

    @property
    def score(self) -> Score:
        return Score.from_dict(self.to_dict())


@dataclass(frozen=True, kw_only=True)
class GateRecord(Record):
    """A gate's decision as stored (`GateResult.to_dict()`); `result` is the GateResult."""

    decision: str = "reject"
    reason: str = ""
    candidate: float = 0.0
    current: float = 0.0
    best: float = 0.0
    pvalue: float | None = None

    @property
    def result(self) -> GateResult:
        return GateResult.from_dict(self.to_dict())


@dataclass(frozen=True, kw_only=True)
class StopRecord(Record):
    """A stop as stored (`StopReason.to_dict()`)."""

    kind: str = "other"
    limit: str = ""
    at: str = ""
    text: str = ""

    @property
    def reason(self) -> StopReason | None:
        return StopReason.read(self.to_dict())


# ---- the sections ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelSpecs(Record):
    """report.json `models`: the spec of each role and the target's name."""

    target: str | None = None
    optimizer: str | None = None
    judge: str | None = None
    target_name: str | None = None
    miner: str | None = None


@dataclass(frozen=True, kw_only=True)
class SmallestGain(Record):
    """`gate.smallest_gain`: the least gain the gate can accept on this many val tasks."""

    n_val: int = 0
    items: float | None = None
    share: float | None = None
    why: str = ""


@dataclass(frozen=True, kw_only=True)
class GateMode(Record):
    """report.json `gate`: the gate's settings this night."""

    mode: str = "on"
    metric: str = "hard"
    margin: float = 0.0
    confidence: float | None = None
    smallest_gain: SmallestGain | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {"smallest_gain": SmallestGain.from_dict}


@dataclass(frozen=True, kw_only=True)
class TrainingRecord(Record):
    """report.json `training`: the skill phase's settings (and the weight mode, when on)."""

    epochs: int = 0
    batch_size: int = 0
    rollouts_k: int = 0
    concurrency: int = 0
    documents: tuple[str, ...] = ()
    preferences: bool = False
    weights: str | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {"documents": strings}


@dataclass(frozen=True, kw_only=True)
class BudgetRecord(Record):
    """report.json `budget`: the night's budget (`Budget` as a dict)."""

    calls: int | None = None
    tokens: int | None = None
    usd: float | None = None
    roles: Mapping[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class ClientWindow(Record):
    """One client's rows in the window: in it, read, left out over its share."""

    window: int = 0
    read: int = 0
    left_out: int = 0


@dataclass(frozen=True, kw_only=True)
class WindowRecord(Record):
    """report.json `window`: what the night read, and each client's share of it."""

    since: float | None = None
    until: float | None = None
    read: int = 0
    capped: str | None = None
    max_client_share: float | None = None
    allowance: int | None = None
    share: float | None = None
    clients: Mapping[str, ClientWindow] = field(default_factory=dict)

    decoders: ClassVar[Mapping[str, Decoder]] = {"clients": each(ClientWindow)}


@dataclass(frozen=True, kw_only=True)
class MiningRecord(Record):
    """report.json `mining` (`MineReport.to_dict()` and the privacy filter's count)."""

    read: int = 0
    tasks: int = 0
    merged: int = 0
    by_check: Mapping[str, int] = field(default_factory=dict)
    negative: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)
    withheld_private: int = 0
    conversation: Mapping[str, Any] | None = None
    miner: Mapping[str, Any] | None = None
    agent: Mapping[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class RecallRecord(Record):
    """report.json `recall`: the pool of past tasks and what it lent tonight."""

    pool: int = 0
    recalled: Mapping[str, int] = field(default_factory=dict)
    mined_again: int = 0
    pinned_train: int = 0
    withheld_private: int = 0
    max: int = 0
    pool_after: int | None = None


@dataclass(frozen=True, kw_only=True)
class SplitCounts(Record):
    """report.json `splits`: tasks per split."""

    train: int = 0
    val: int = 0
    test: int = 0


@dataclass(frozen=True, kw_only=True)
class DemoModesRecord(Record):
    """A phase's `demo_modes`: none / static / retrieved demos, gated on val."""

    winner: str | None = None
    incumbent: str | None = None
    candidates: Mapping[str, Summary] = field(default_factory=dict)
    gates: Mapping[str, GateRecord] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "candidates": each(Summary),
        "gates": each(GateRecord),
        "notes": strings,
    }


@dataclass(frozen=True, kw_only=True)
class PhaseRecord(Record):
    """One document's phase (`phases.skill`, `phases.memory`): an optimize run's outcome."""

    document: str = ""
    ran: bool = False
    run_dir: str | None = None
    changed: bool = False
    steps: int = 0
    total_steps: int = 0
    best_version: int | None = None
    val_initial: Summary | None = None
    val_best: Summary | None = None
    decisions: Mapping[str, int] = field(default_factory=dict)
    analyst: Mapping[str, Any] | None = None
    stopped_by: StopRecord | None = None
    test: Summary | None = None
    slow: Mapping[str, Any] | None = None
    seconds: float | None = None
    demo_modes: DemoModesRecord | None = None
    error: str | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "val_initial": Summary.from_dict,
        "val_best": Summary.from_dict,
        "stopped_by": StopRecord.from_dict,
        "test": Summary.from_dict,
        "demo_modes": DemoModesRecord.from_dict,
    }


@dataclass(frozen=True, kw_only=True)
class SourcedLine(Record):
    """A proposal line with its provenance: the tasks, interactions and clients it came from,
    and the leave-one-out verdict that kept (or dropped) it."""

    document: str = ""
    kind: str = ""
    text: str = ""
    tasks: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    clients: tuple[str, ...] = ()
    verdict: str | None = None
    why: str | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "tasks": strings,
        "sources": strings,
        "clients": strings,
    }


@dataclass(frozen=True, kw_only=True)
class ProofreadRecord(Record):
    """report.json `proofread`: leave-one-out's trials, the lines kept and dropped."""

    ran: bool = False
    tried: str = ""
    trials: int = 0
    kept: tuple[SourcedLine, ...] = ()
    dropped: tuple[SourcedLine, ...] = ()
    notes: tuple[str, ...] = ()

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "kept": many(SourcedLine),
        "dropped": many(SourcedLine),
        "notes": strings,
    }


@dataclass(frozen=True, kw_only=True)
class AdapterRecord(Record):
    """`proposal.adapter`: the staged adapter, how it was trained and its val."""

    dir: str = "adapter"
    method: str = ""
    base_model: str | None = None
    base_model_path: str | None = None
    files: Any = None
    train_items: tuple[str, ...] = ()
    data: Mapping[str, Any] | None = None
    training: Mapping[str, Any] | None = None
    val: Summary | None = None
    with_text: bool = False

    decoders: ClassVar[Mapping[str, Decoder]] = {"val": Summary.from_dict, "train_items": strings}


@dataclass(frozen=True, kw_only=True)
class ProposalRecord(Record):
    """report.json `proposal`: what was staged, val before / after, the paired comparison."""

    skill_changed: bool = False
    memory_changed: bool = False
    lines: tuple[SourcedLine, ...] = ()
    val_before: Summary | None = None
    val_after: Summary | None = None
    paired: Mapping[str, Any] | None = None
    test: Summary | None = None
    candidate: str | None = None
    adapter: AdapterRecord | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "lines": many(SourcedLine),
        "val_before": Summary.from_dict,
        "val_after": Summary.from_dict,
        "test": Summary.from_dict,
        "adapter": AdapterRecord.from_dict,
    }


@dataclass(frozen=True, kw_only=True)
class TrainedRecord(Record):
    """One adapter's training (`weights.trained.sft`, `.dpo`)."""

    steps: int = 0
    loss_first: float | None = None
    loss_last: float | None = None
    seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class WeightsRecord(Record):
    """report.json `weights`: every candidate's val, the gate's decisions, the winner."""

    winner: str = "current"
    why: str = ""
    candidates: Mapping[str, Summary] = field(default_factory=dict)
    gates: Mapping[str, GateRecord] = field(default_factory=dict)
    data: Mapping[str, Any] | None = None
    trained: Mapping[str, TrainedRecord] = field(default_factory=dict)
    train_items: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: Mapping[str, float] = field(default_factory=dict)

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "candidates": each(Summary),
        "gates": each(GateRecord),
        "trained": each(TrainedRecord),
        "train_items": strings,
        "notes": strings,
    }


@dataclass(frozen=True, kw_only=True)
class ValPairRecord(Record):
    """A skill's val before / after on its tasks (`skills[].own_val`, `.whole_val`)."""

    before: float = 0.0
    after: float = 0.0
    n: int = 0


@dataclass(frozen=True, kw_only=True)
class SourceFileRecord(Record):
    """A user's file the night started from, as read (`start_document`, `skills[].source`)."""

    path: str = ""
    kind: str = ""
    sha256: str = ""


@dataclass(frozen=True, kw_only=True)
class SkillRecord(Record):
    """One skill a many-skills night trained (`skills[]`, `skill_units.StagedSkill`)."""

    name: str = ""
    description: str = ""
    status: str = ""
    reason: str = ""
    base_version: int = 0
    train_ids: tuple[str, ...] = ()
    val_ids: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    own_val: ValPairRecord | None = None
    whole_val: ValPairRecord | None = None
    adopted_version: int | None = None
    source: SourceFileRecord | None = None
    dir: str | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "train_ids": strings,
        "val_ids": strings,
        "tasks": strings,
        "own_val": ValPairRecord.from_dict,
        "whole_val": ValPairRecord.from_dict,
        "source": SourceFileRecord.from_dict,
    }


@dataclass(frozen=True, kw_only=True)
class SkillSetRecord(Record):
    """report.json `skill_set`: how the night's tasks were shared among skills."""

    clusters: int = 0
    staged: int = 0
    unrouted_train: int = 0
    unrouted_val: int = 0


@dataclass(frozen=True, kw_only=True)
class AdoptedAdapter(Record):
    """report.json `adapter`: the adopted adapter the night's target served with."""

    version: str | None = None  # as `Adopted.version` names it (text)
    dir: str | None = None
