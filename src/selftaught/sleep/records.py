"""The sections of a night's report.json, typed: one frozen dataclass per section.

Every section is a `Record` (`selftaught.record`): its known keys are typed fields, keys this
version does not know (written by a newer one, or by an older one that had more) are kept in
`extra`, and the keys it was read with are remembered in order (`read_keys`), so
`Record.from_dict(d).to_dict()` equals `d` for every report.json written today or before. A
record built in code (not read) writes all of its fields, in their order (`first` ones first),
or the keys `only` names, as its section always had them; producers build their records so,
never through a dict.

Accuracy summaries (`EvalResult.summary()`, any older shape) are `Summary` records whose
`score` is the one decoded `SplitScore`; gate decisions are `GateRecord`s whose `result` is the
`GateResult`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, TypeGuard, TypeVar

from selftaught.gate import GateResult, Paired, SmallestGain
from selftaught.models.usage import Budget
from selftaught.record import Decoder, Record
from selftaught.results import SplitScore
from selftaught.skill.result import ParseStats, SkillTest, SlowUpdate
from selftaught.stops import StopRecord
from selftaught.weights.rows import TrainStats

if TYPE_CHECKING:
    from selftaught.evaluation import EvalResult
    from selftaught.weights.elite import EliteStats

_R = TypeVar("_R", bound=Record)


PhaseOutput = Record | tuple[Record, ...] | None
"""What a night's phase returns (`Phase.run`): its record, one a document (the text phase's),
or None (nothing to do); `NightResult.records` keeps them by phase name."""


def given(record: _R | None) -> TypeGuard[_R]:
    """The section is there and holds something (as a report's non-empty dict was)."""
    return record is not None and record.read_keys != ()


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
    """One accuracy summary as stored (`EvalResult.summary()`, or an older shape), key for key.
    It types none of its numbers: `score` reads them, through the one decoder
    (`SplitScore.from_dict`), so an older shape reads as today's does."""

    @classmethod
    def of(cls, result: EvalResult) -> Summary:
        """An eval's summary as every run directory stores it (`EvalResult.summary()`), key
        for key."""
        return cls.from_dict(result.summary())

    @property
    def score(self) -> SplitScore:
        return SplitScore.from_dict(self.extra)


@dataclass(frozen=True, kw_only=True)
class TagLossRecord(Record):
    """One tag the per-tag veto found lost (`gate.TagLoss.to_dict()`)."""

    tag: str = ""
    n_items: int = 0
    wins: int = 0
    losses: int = 0
    net: float = 0.0
    p_loss: float = 1.0


@dataclass(frozen=True, kw_only=True)
class GateRecord(Record):
    """A gate's decision as stored (`GateResult.to_dict()`); `result` is the GateResult."""

    decision: str = "reject"
    reason: str = ""
    candidate: float = 0.0
    current: float = 0.0
    best: float = 0.0
    gain_vs_best: float = 0.0
    gain_vs_current: float = 0.0
    pvalue: float | None = None
    n_paired: int = 0
    n_missing: int = 0
    tag_losses: tuple[TagLossRecord, ...] = ()

    decoders: ClassVar[Mapping[str, Decoder]] = {"tag_losses": many(TagLossRecord)}

    @classmethod
    def of(cls, result: GateResult) -> GateRecord:
        return cls(**_gate_fields(result))

    @property
    def result(self) -> GateResult:
        return GateResult.from_dict(self.to_dict())


def _gate_fields(result: GateResult) -> dict[str, Any]:
    """A gate result's fields, as its record types them."""
    return {
        "decision": result.decision,
        "reason": result.reason,
        "candidate": result.candidate,
        "current": result.current,
        "best": result.best,
        "gain_vs_best": result.gain_vs_best,
        "gain_vs_current": result.gain_vs_current,
        "pvalue": result.pvalue,
        "n_paired": result.n_paired,
        "n_missing": result.n_missing,
        "tag_losses": tuple(TagLossRecord.from_dict(t) for t in result.tag_losses),
    }


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
class SmallestGainRecord(Record):
    """`gate.smallest_gain`: the least gain the gate can accept on this many val tasks."""

    n_val: int = 0
    items: float | None = None
    share: float | None = None
    why: str = ""

    @classmethod
    def of(cls, gain: SmallestGain) -> SmallestGainRecord:
        return cls(n_val=gain.n_val, items=gain.items, share=gain.share, why=gain.why)


@dataclass(frozen=True, kw_only=True)
class NightPower(Record):
    """`gate.power`: the gain the night looks for (`--min-gain`, else 0.05), the val tasks the
    gate needs to accept it (`gate.val_size_for`), and how many more checked tasks of the
    traffic that takes at the night's val fraction (0: tonight's val is enough; None: never,
    with no val fraction)."""

    target_gain: float = 0.0
    needed_val: int | None = None
    more_tasks: int | None = None
    val_fraction: float = 0.0


@dataclass(frozen=True, kw_only=True)
class GateMode(Record):
    """report.json `gate`: the gate's settings this night."""

    mode: str = "on"
    no_val: bool = False  # `--no-val`: nothing held out, the gate off (the daily-use night)
    metric: str = "hard"
    margin: float = 0.0
    confidence: float | None = None
    smallest_gain: SmallestGainRecord | None = None
    tag_alpha: float | None = None  # the per-tag (per-kind) veto: its sign test's level
    tag_margin: float | None = None  # and its margin in net items
    power: NightPower | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "smallest_gain": SmallestGainRecord.from_dict,
        "power": NightPower.from_dict,
    }


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
    prompts: Mapping[str, str] | None = None  # `--prompts DIR`: each override's digest

    decoders: ClassVar[Mapping[str, Decoder]] = {"documents": strings}


@dataclass(frozen=True, kw_only=True)
class BudgetRecord(Record):
    """report.json `budget`: the night's budget (`Budget` as a dict)."""

    calls: int | None = None
    tokens: int | None = None
    usd: float | None = None
    roles: tuple[str, ...] | None = None  # the roles it counts (None: every role)

    decoders: ClassVar[Mapping[str, Decoder]] = {"roles": strings}

    @classmethod
    def of(cls, budget: Budget) -> BudgetRecord:
        roles = None if budget.roles is None else tuple(budget.roles)
        return cls(calls=budget.calls, tokens=budget.tokens, usd=budget.usd, roles=roles)


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
class ModelCallsRecord(Record):
    """What each role of the miner reports of its calls, counted alike by status (and
    `parse_rate`: `miner.parse_rate`): the counts `FollowupModelRecord` and `MinerRecord`
    share. A record built in code writes the field naming the model first, then these counts,
    then its own fields, as report.json has always had them."""

    candidates: int = 0  # what the role could ask about
    asked: int = 0
    answered: int = 0  # replies that parsed (repaired ones included)
    repaired: int = 0
    parse_failures: int = 0
    backend_errors: int = 0


@dataclass(frozen=True, kw_only=True)
class FollowupModelRecord(ModelCallsRecord):
    """`mining.conversation.model`: what the miner read in the next turns the rules could not
    (`followup_model.settle_answers`; `candidates`: next turns the rules read nothing or a
    bare rejection in); read from `{}` when it read none."""

    first: ClassVar[tuple[str, ...]] = ("model",)

    model: str = ""
    outcomes: Mapping[str, int] = field(default_factory=dict)  # correction, downgraded, none, ...
    invalid_parts: int = 0  # rules outside the vocabulary, dropped
    skipped: Mapping[str, int] = field(default_factory=dict)  # why -> turns never asked
    first_error: str | None = None
    parse_rate: float | None = None


@dataclass(frozen=True, kw_only=True)
class ConversationRecord(Record):
    """`mining.conversation`: what the threads held (`signals.read_threads`)."""

    threads: int = 0
    linked_threads: int = 0  # of two or more rows or replies
    turns: int = 0  # replies in them
    signals: Mapping[str, int] = field(default_factory=dict)  # by kind
    trusted: int = 0
    untrusted: int = 0
    rejected_by_operator: int = 0
    redo_turns: int = 0  # replies to the user's verdict on an earlier reply: evidence, not tasks
    model: FollowupModelRecord | None = None  # the miner's reading of next turns (`{}`: none)

    decoders: ClassVar[Mapping[str, Decoder]] = {"model": FollowupModelRecord.from_dict}


@dataclass(frozen=True, kw_only=True)
class MinerExample(Record):
    """One of the miner's first decisions (`MinerRecord.examples`)."""

    row: str = ""
    check: str | None = None
    outcome: str = ""


@dataclass(frozen=True, kw_only=True)
class MinerRecord(ModelCallsRecord):
    """`mining.miner`: what the miner wrote and what was kept (`miner.Miner.resolve`;
    `candidates`: rows with a verdict and no strong check, or none at all); read from `{}`
    when no miner ran (`ran` is False)."""

    first: ClassVar[tuple[str, ...]] = ("miner",)

    miner: str = ""  # the miner's spec (or name): every measurement names its miner
    cannot_check: int = 0
    kept: int = 0
    refused: Mapping[str, int] = field(default_factory=dict)  # why -> checks
    skipped: Mapping[str, int] = field(default_factory=dict)  # why -> rows never shown
    invalid_parts: int = 0  # parts of a check outside the vocabulary, dropped
    kept_parts: Mapping[str, int] = field(default_factory=dict)  # answer:number, rule:json, ...
    first_error: str | None = None  # the first backend error, for the night's notes
    examples: tuple[MinerExample, ...] = ()  # the first decisions
    parse_rate: float | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {"examples": many(MinerExample)}

    @property
    def ran(self) -> bool:
        """Whether a miner ran (an empty section: none did)."""
        return self.read_keys is None or bool(self.read_keys)


@dataclass(frozen=True, kw_only=True)
class AgentRunsRecord(Record):
    """`mining.agent`: what coding agents' own test runs said
    (`agent_outcome.read_outcomes`, then `WorkspaceMiner.counted`)."""

    rows: int = 0  # agent rows read
    with_runs: int = 0  # that ran tests or a build
    runs: Mapping[str, int] = field(default_factory=dict)  # by status
    signals: Mapping[str, int] = field(default_factory=dict)  # solved / ended_red
    rejected_by_operator: int = 0
    workspace_tasks: int = 0
    not_workspace: Mapping[str, int] = field(default_factory=dict)  # solved, a plain task: why
    notes: tuple[str, ...] = ()  # the first few reasons in full

    decoders: ClassVar[Mapping[str, Decoder]] = {"notes": strings}


@dataclass(frozen=True, kw_only=True)
class MiningRecord(Record):
    """report.json `mining`: what `phases.mine.mine` made of tonight's rows, and the privacy
    filter's count."""

    read: int = 0
    tasks: int = 0
    merged: int = 0
    by_check: Mapping[str, int] = field(default_factory=dict)
    negative: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)
    withheld_private: int = 0
    conversation: ConversationRecord | None = None
    miner: MinerRecord | None = None
    agent: AgentRunsRecord | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "conversation": ConversationRecord.from_dict,
        "miner": MinerRecord.from_dict,
        "agent": AgentRunsRecord.from_dict,
    }


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
class LateDuplicate(Record):
    """report.json `duplicates[]`: what a night dropped, after mining merged its requests,
    for being the same item (`selftaught.duplicates`) as a held-out task: a recalled task at
    the split, a training item of the weight phase, an adopted demonstration. Dropped, never
    learned from, and the night goes on."""

    item: str = ""  # the task (or demonstration) dropped
    held_out: str = ""  # the task it is the same item as
    split: str = ""  # that task's split
    phase: str = ""  # where it was found: split, weights, demos

    def line(self) -> str:
        return f"{self.item} ({self.phase}): the same item as {self.split} task {self.held_out}"


@dataclass(frozen=True, kw_only=True)
class VsAdoptedRecord(GateRecord):
    """`demo_modes.vs_adopted`: the winning demo mode gated against the adopted skill."""

    mode: str = ""

    first: ClassVar[tuple[str, ...]] = ("mode",)

    @classmethod
    def vs(cls, mode: str, result: GateResult) -> VsAdoptedRecord:
        return cls(mode=mode, **_gate_fields(result))


@dataclass(frozen=True, kw_only=True)
class DemoShape(Record):
    """How one demo mode's skill holds its demos (`demo_modes.shapes[mode]`)."""

    demos: int = 0
    retrieve: int | None = None  # demos retrieved per request (None: static)


@dataclass(frozen=True, kw_only=True)
class DemoModesRecord(Record):
    """A phase's `demo_modes`: none / static / retrieved demos, gated on val."""

    winner: str | None = None
    incumbent: str | None = None
    pool: int = 0  # clean train demos to choose from
    leaks_refused: int = 0  # near-copies of val / test inputs left out of the pool
    sources: Mapping[str, int] = field(default_factory=dict)  # pool demos by source
    candidates: Mapping[str, Summary] = field(default_factory=dict)
    shapes: Mapping[str, DemoShape] = field(default_factory=dict)  # an older night: none
    gates: Mapping[str, GateRecord] = field(default_factory=dict)
    vs_adopted: VsAdoptedRecord | None = None
    notes: tuple[str, ...] = ()

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "candidates": each(Summary),
        "shapes": each(DemoShape),
        "gates": each(GateRecord),
        "vs_adopted": VsAdoptedRecord.from_dict,
        "notes": strings,
    }


@dataclass(frozen=True, kw_only=True)
class AnalystRecord(Record):
    """A phase's `analyst`: how the analyst's replies parsed (`ParseStats.to_dict()`)."""

    calls: int = 0
    ok: int = 0
    repaired: int = 0
    invalid_json: int = 0
    backend_error: int = 0
    parse_rate: float | None = None

    @classmethod
    def of(cls, stats: ParseStats) -> AnalystRecord:
        return cls(calls=stats.calls, ok=stats.ok, repaired=stats.repaired,
                   invalid_json=stats.invalid_json, backend_error=stats.backend_error,
                   parse_rate=stats.rate())  # fmt: skip

    @property
    def stats(self) -> ParseStats:
        return ParseStats.from_dict(self.to_dict())


@dataclass(frozen=True, kw_only=True)
class RuleTrialRecord(Record):
    """One rule's leave-one-out in a slow update (`RuleTrial.to_dict()`)."""

    rule: str = ""
    verdict: str = "untried"
    why: str = ""


def _merges(items: Sequence[Sequence[Any]]) -> tuple[tuple[str, str, str], ...]:
    return tuple((str(a), str(b), str(c)) for a, b, c in items)


@dataclass(frozen=True, kw_only=True)
class SlowRecord(Record):
    """A phase's `slow`: the slow update at its end (`SlowUpdate.to_dict()`)."""

    due: bool = False
    reason: str = ""
    runs: int = 0
    every: int = 0
    trials: tuple[RuleTrialRecord, ...] = ()
    merged: tuple[tuple[str, str, str], ...] = ()  # (op, target, content) applied
    decision: str | None = None
    val_before: float | None = None
    val_after: float | None = None
    chars_before: int = 0
    chars_after: int = 0
    version: str | None = None
    shipped: bool = False

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "trials": many(RuleTrialRecord),
        "merged": _merges,
    }

    @classmethod
    def of(cls, update: SlowUpdate) -> SlowRecord:
        trials = tuple(RuleTrialRecord(rule=t.rule, verdict=t.verdict, why=t.why)
                       for t in update.trials)  # fmt: skip
        return cls(due=update.due, reason=update.reason, runs=update.runs, every=update.every,
                   trials=trials, merged=update.merged, decision=update.decision,
                   val_before=update.val_before, val_after=update.val_after,
                   chars_before=update.chars_before, chars_after=update.chars_after,
                   version=update.version, shipped=update.shipped)  # fmt: skip

    @property
    def update(self) -> SlowUpdate:
        return SlowUpdate.from_dict(self.to_dict())


@dataclass(frozen=True, kw_only=True)
class PairedRecord(Record):
    """`proposal.paired`: the proposal against the adopted version per val task
    (`gate.Paired.to_dict()`)."""

    wins: int = 0
    losses: int = 0
    ties: int = 0
    sign_test_p: float = 1.0

    @classmethod
    def of(cls, paired: Paired) -> PairedRecord:
        """The record of a paired count, as `Paired.to_dict()` writes it (p to 6 places)."""
        return cls(wins=paired.wins, losses=paired.losses, ties=paired.ties,
                   sign_test_p=round(paired.sign_test_p, 6))  # fmt: skip

    @property
    def paired(self) -> Paired:
        return Paired(self.wins, self.losses, self.ties, self.sign_test_p)


@dataclass(frozen=True, kw_only=True)
class SkillTestRecord(Record):
    """A phase's `test` (`SkillTest.to_dict()`): the initial and the best skill on the test
    split, paired item by item."""

    initial: Summary | None = None
    best: Summary | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    paired: PairedRecord | None = None
    gain: float = 0.0

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "initial": Summary.from_dict,
        "best": Summary.from_dict,
        "paired": PairedRecord.from_dict,
    }

    @classmethod
    def of(cls, test: SkillTest) -> SkillTestRecord:
        return cls(initial=Summary.of(test.initial), best=Summary.of(test.best),
                   versions=dict(test.versions), paired=PairedRecord.of(test.paired),
                   gain=test.gain)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class PhaseRecord(Record):
    """One document's phase (`phases.skill`, `phases.memory`): an optimize run's outcome."""

    document: str = ""
    ran: bool = False
    run_dir: str | None = None
    changed: bool = False
    steps: int = 0
    total_steps: int = 0
    best_version: str | None = None  # the run's best skill version, "v0003"
    val_initial: Summary | None = None
    val_best: Summary | None = None
    decisions: Mapping[str, int] = field(default_factory=dict)
    analyst: AnalystRecord | None = None
    stopped_by: StopRecord | None = None
    test: SkillTestRecord | None = None
    slow: SlowRecord | None = None
    seconds: float | None = None
    demo_modes: DemoModesRecord | None = None
    error: str | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "val_initial": Summary.from_dict,
        "val_best": Summary.from_dict,
        "analyst": AnalystRecord.from_dict,
        "stopped_by": StopRecord.from_dict,
        "test": SkillTestRecord.from_dict,
        "slow": SlowRecord.from_dict,
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
class ReplayStats(Record):
    """`weights.data.replays`: the elite filter on the target's replays (`EliteStats`)."""

    samples: int = 0
    prompts: int = 0
    kept: int = 0
    prompts_kept: int = 0
    below_threshold: int = 0
    duplicates: int = 0
    over_cap: int = 0
    truncated_kept: int = 0
    errors: int = 0

    @classmethod
    def of(cls, elite: EliteStats, samples: int, errors: int) -> ReplayStats:
        """The filter's counts, with the replays it was given and those that failed."""
        return cls(samples=samples, prompts=elite.prompts, kept=elite.kept,
                   prompts_kept=elite.prompts_kept, below_threshold=elite.below_threshold,
                   duplicates=elite.duplicates, over_cap=elite.over_cap,
                   truncated_kept=elite.truncated_kept, errors=errors)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class WeightDataRecord(Record):
    """`weights.data` (and the staged adapter's): what the adapters trained on, train only."""

    corrections: int = 0
    elite: int = 0
    sft_samples: int = 0
    preference_pairs: int = 0
    replays: ReplayStats | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {"replays": ReplayStats.from_dict}


@dataclass(frozen=True, kw_only=True)
class TrainedRecord(TrainStats):
    """One adapter's training (`weights.trained.sft`, `.dpo`, `proposal.adapter.training`):
    what its trainer reported (`TrainStats`, key for key: its keys are the method's and the
    trainer's), the seconds it took and the adopted adapter it went on from."""

    seconds: float | None = None
    continued_from: str | None = None  # the adopted adapter it continued, if any


@dataclass(frozen=True, kw_only=True)
class AdapterRecord(Record):
    """`proposal.adapter`: the staged adapter, how it was trained and its val."""

    dir: str = "adapter"
    method: str = ""
    base_model: str | None = None
    base_model_path: str | None = None
    files: tuple[str, ...] = ()
    train_items: tuple[str, ...] = ()
    data: WeightDataRecord | None = None
    training: TrainedRecord | None = None
    val: Summary | None = None
    with_text: bool = False

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "files": strings,
        "train_items": strings,
        "data": WeightDataRecord.from_dict,
        "training": TrainedRecord.from_dict,
        "val": Summary.from_dict,
    }


@dataclass(frozen=True, kw_only=True)
class ProposalRecord(Record):
    """report.json `proposal`: what was staged, val before / after, the paired comparison."""

    skill_changed: bool = False
    memory_changed: bool = False
    lines: tuple[SourcedLine, ...] = ()
    val_before: Summary | None = None
    val_after: Summary | None = None
    paired: PairedRecord | None = None
    test: SkillTestRecord | None = None
    candidate: str | None = None
    adapter: AdapterRecord | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "lines": many(SourcedLine),
        "val_before": Summary.from_dict,
        "val_after": Summary.from_dict,
        "paired": PairedRecord.from_dict,
        "test": SkillTestRecord.from_dict,
        "adapter": AdapterRecord.from_dict,
    }


@dataclass(frozen=True, kw_only=True)
class WeightsRecord(Record):
    """report.json `weights`: every candidate's val, the gate's decisions, the winner."""

    winner: str = "current"
    why: str = ""
    candidates: Mapping[str, Summary] = field(default_factory=dict)
    gates: Mapping[str, GateRecord] = field(default_factory=dict)
    data: WeightDataRecord | None = None
    trained: Mapping[str, TrainedRecord] = field(default_factory=dict)
    train_items: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: Mapping[str, float] = field(default_factory=dict)

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "candidates": each(Summary),
        "gates": each(GateRecord),
        "data": WeightDataRecord.from_dict,
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
    """A user's file the night started from, as read (`start_document`, `skills[].source`), and
    the repository it was read in (`root`, resolved then to `root_real`)."""

    path: str = ""
    kind: str = ""
    sha256: str = ""
    root: str = ""
    root_real: str = ""


@dataclass(frozen=True, kw_only=True)
class SkillRecord(Record):
    """One skill a many-skills night trained (`skills[]`, `night/skills.py`)."""

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
    memory_changed: bool = False  # its memory was trained tonight and the gate kept it
    candidate: str | None = None  # what its weight gate chose: text, sft, sft+text, ...
    adapter: AdapterRecord | None = None  # its staged adapter (`skills/<name>/adapter/`)
    weights: WeightsRecord | None = None  # its weight gate: every candidate on its own val

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "train_ids": strings,
        "val_ids": strings,
        "tasks": strings,
        "own_val": ValPairRecord.from_dict,
        "whole_val": ValPairRecord.from_dict,
        "source": SourceFileRecord.from_dict,
        "adapter": AdapterRecord.from_dict,
        "weights": WeightsRecord.from_dict,
    }


@dataclass(frozen=True, kw_only=True)
class SkillSetRecord(Record):
    """report.json `skill_set`: how the night's tasks were shared among skills."""

    clusters: int = 0
    staged: int = 0
    unrouted_train: int = 0
    unrouted_val: int = 0


@dataclass(frozen=True, kw_only=True)
class KindRecord(Record):
    """report.json `kinds[]`: one kind of request the night measured (`kinds.py`): tonight's
    traffic of it, its recalled tasks, its val before / after the night and on its recalled
    val tasks alone (retention), and the skill that serves it."""

    id: str = ""
    terms: tuple[str, ...] = ()  # its heaviest words: what it is about
    new: bool = False  # first seen tonight
    traffic: int = 0  # interactions read tonight that became its tasks
    mined: int = 0  # its tasks mined tonight (0: a quiet kind)
    splits: Mapping[str, int] = field(default_factory=dict)  # its tasks tonight, recalled too
    recalled: Mapping[str, int] = field(default_factory=dict)  # its recalled tasks, by split
    signals: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """What the conversation said of tonight's replies of this kind: signal kind -> trusted
    (the operator's words) / untrusted (an end user's) -> count."""
    val: ValPairRecord | None = None  # its val tasks, before and after the night
    recalled_val: ValPairRecord | None = None  # its recalled val tasks alone: retention
    skill: str | None = None  # the skill serving it (None: the project's one skill)
    skill_status: str = ""  # staged / rejected / kept (not trained tonight) / shared
    reason: str | None = None

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "terms": strings,
        "val": ValPairRecord.from_dict,
        "recalled_val": ValPairRecord.from_dict,
    }

    @property
    def quiet(self) -> bool:
        """No traffic of this kind tonight: only its recalled tasks were there."""
        return self.mined == 0


@dataclass(frozen=True, kw_only=True)
class AdoptedAdapter(Record):
    """report.json `adapter`: the adopted adapter the night's target served with."""

    version: str | None = None  # as `Adopted.version` names it (text)
    dir: str | None = None


# ---- train-only tasks: weak labels and dreams -----------------------------------------------

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
"""A value as JSON holds it (a task's reference: a string, a number, a list of them, ...)."""


@dataclass(frozen=True, kw_only=True)
class TrainOnlyUse(Record):
    """`weak.shipped`, `dream.shipped`: what the staged proposal took from these train-only
    tasks (`split.train_only_use`); read from `{}` when nothing was staged."""

    demos: tuple[str, ...] = ()  # the staged skill's demos made from them
    lines: int = 0  # kept lines that name them
    adapter_tasks: int = 0  # of them in the staged adapter's train set

    decoders: ClassVar[Mapping[str, Decoder]] = {"demos": strings}


@dataclass(frozen=True, kw_only=True)
class WeakTaskRow(Record):
    """One sampled request of `weak.tasks`: the samples' vote and what became of it."""

    id: str = ""
    answer: str | None = None
    agreement: float = 0.0
    answers: Mapping[str, int] = field(default_factory=dict)  # answer key → count
    outcome: str = ""


@dataclass(frozen=True, kw_only=True)
class WeakRecord(Record):
    """report.json `weak`: what self-consistency labelled tonight (`weak.weak_label`)."""

    k: int = 0
    agree: float = 0.0
    candidates: int = 0  # requests mining dropped with nothing to check them by
    sampled: int = 0  # of them, sampled k times (max_candidates, newest first)
    labelled: int = 0  # an answer reached the agreement share
    disagreed: int = 0  # the samples gave answers, none reached the share
    no_answer: int = 0  # no sample gave a short answer
    refuted: int = 0  # the agreed answer is the one the user rejected
    already_checked: int = 0  # a checked task asks the same: not added
    verified: Mapping[str, int] = field(default_factory=dict)
    """Tonight's weak labels scored against a real reference of the same request (tonight's
    or recalled): right / wrong."""
    verified_later: Mapping[str, int] = field(default_factory=dict)
    """Past nights' weak labels scored against a real reference that arrived since."""
    waiting: int = 0  # past weak labels with no real reference yet
    left_out: int = 0  # near-duplicates of a val or test task
    over_cap: int = 0  # beyond `share` of the checked train tasks
    trained: int = 0  # weak tasks in tonight's train split
    mean_agreement: float | None = None  # over the labelled
    failed_samples: int = 0
    tasks: tuple[WeakTaskRow, ...] = ()  # one row per sampled request
    notes: tuple[str, ...] = ()
    shipped: TrainOnlyUse | None = None  # `{}` until the stage phase says what was used
    accuracy: float | None = None
    """How often a weak label was right, where a real reference came (tonight or since)."""

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "tasks": many(WeakTaskRow),
        "notes": strings,
        "shipped": TrainOnlyUse.from_dict,
    }


@dataclass(frozen=True, kw_only=True)
class DreamTaskRow(Record):
    """One synthetic task of `dream.tasks`: what it was made from and how, and its split."""

    id: str = ""
    from_task: str = ""  # JSON `from`: the train task it varies
    how: str = ""
    reference: JsonValue = None
    prompt_head: str = ""
    split: str | None = None
    no_demo: bool = False
    notes: tuple[str, ...] = ()

    decoders: ClassVar[Mapping[str, Decoder]] = {"notes": strings}
    renamed: ClassVar[Mapping[str, str]] = {"from": "from_task"}


@dataclass(frozen=True, kw_only=True)
class DreamRecord(Record):
    """report.json `dream`: the synthetic variants made tonight (`dream.dream`)."""

    n: int = 0
    share: float = 0.0
    cap: int = 0  # synthetic tasks allowed tonight
    sources: int = 0  # checked train tasks looked at
    made: Mapping[str, int] = field(default_factory=dict)  # by how
    refused: Mapping[str, int] = field(default_factory=dict)  # paraphrases refused, by why
    failed_calls: int = 0  # analyst calls that failed
    duplicates: int = 0  # a variant that is a task the night already has
    left_out: int = 0  # near-duplicates of a val or test task
    capped: bool = False  # stopped at the cap
    trained: int = 0  # synthetic tasks in tonight's train split
    tasks: tuple[DreamTaskRow, ...] = ()
    notes: tuple[str, ...] = ()
    shipped: TrainOnlyUse | None = None  # `{}` until the stage phase says what was used

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "tasks": many(DreamTaskRow),
        "notes": strings,
        "shipped": TrainOnlyUse.from_dict,
    }


# ---- the night's tasks (tasks.jsonl) --------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TaskSignal(Record):
    """What the conversation said of a task's logged reply: the kind, whose words, trusted."""

    kind: str = ""
    source: str | None = None
    giver: str | None = None
    trusted: bool = False
    words: str | None = None


@dataclass(frozen=True, kw_only=True)
class WeakLabel(Record):
    """A weak task's label (`state["weak"]`): the samples' agreement on it."""

    agreement: float = 0.0
    k: int = 0
    answers: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SyntheticOrigin(Record):
    """A dreamt task's origin (`state["synthetic"]`): the train task it varies, and how."""

    from_task: str = ""  # JSON `from`
    how: str = ""

    renamed: ClassVar[Mapping[str, str]] = {"from": "from_task"}


class RuleRow(TypedDict):
    """A rule among a task's checks, as `state["rules"]` holds it (`checks.Rule.to_dict`)."""

    kind: str  # max_words, json, language, ... (`checks.Rule`)
    arg: JsonValue  # a count, a language name, a unit, a pattern, a text; None for none
    said: str  # the user's own words ("" for a rule the miner wrote)


@dataclass(frozen=True, kw_only=True)
class WorkspaceCheck(Record):
    """A workspace task's check (`state["workspace"]`, `agent_outcome.py`): the agent edits the
    start folder, then the command runs there."""

    path: str = ""  # the start folder (the repository's files at the session's start)
    check: tuple[str, ...] = ()  # the command's argv
    timeout_s: float = 60.0
    session: str | None = None  # the agent session it was mined from
    commit: str | None = None  # the repository's commit at the session's start

    decoders: ClassVar[Mapping[str, Decoder]] = {"check": strings}


@dataclass(frozen=True, kw_only=True)
class MinedCheckRecord(Record):
    """A check the miner wrote (`state["mined_check"]`, `miner.with_check`): which miner, on
    which side of the thread it was tested, and the check (`miner.MinedCheck.record`)."""

    by: str = ""  # the miner's name
    tested_on: str = ""  # "both", "rejected", ... (`miner.Evidence.sides`)
    answer: Mapping[str, str] | None = None  # {"kind", "value"}: the expected answer
    rules: tuple[RuleRow, ...] = ()
    rubric: str | None = None
    why: str = ""  # the miner's own account of where the check comes from

    decoders: ClassVar[Mapping[str, Decoder]] = {"rules": tuple}


@dataclass(frozen=True, kw_only=True)
class BareVerdictMark(Record):
    """`state["bare_verdict"]`: the task's only verdict was a bare one (`mine.BARE_VERDICT`),
    checked by a two-sided check: it trains, never validates (`split.train_only`)."""

    signal: str = ""  # "reask" or "rejection"
    check: str = ""  # what checks it: "miner"


def _default(f: Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


@dataclass(frozen=True, kw_only=True)
class TaskChecks(Record):
    """A mined task's checks and marks (`mine.MinedTask.state`): one typed field per key of
    the `tasks.base.Example.state` its scorer reads (`split.example_of`, the one place it
    becomes that dict), stored in the recall pool as that dict (`MinedTask.to_dict`) and read
    back by `from_dict` (keys this version does not type kept in `extra`).

    It writes the keys it holds, as the dict it replaces did: one made in code holds the keys
    given a value other than the default (in the fields' order), `but` adds a key at the end,
    `without` removes one, `has` tells whether it holds one; one read holds the keys it was
    read with. Every default is "not checked by this" (no key)."""

    rules: tuple[RuleRow, ...] = ()
    """The rules the request (or a trusted comment, or the miner) states; every mined task
    holds the key, often empty."""
    comment: str | None = None
    """The operator's comment on the logged reply (redacted): memory text, rules."""
    evidence: str | None = None
    """An end user's comment, quoted (`mine.quoted`): evidence for the analyst, never a rule."""
    scorer: str | None = None
    """The scorer of the task's reference (`tasks.scorers.reference_scorer`): numeric,
    quantity, normalized, ..."""
    demo_source: str | None = None
    """"correction": the reference is the operator's correction (a demonstration's reply)."""
    reference_reply: str | None = None
    """The reply the operator accepted, or the one that answered their correction
    (`mine.REFERENCE_REPLY`): a demonstration's reply."""
    rubric: str | None = None
    """The judge's rubric (a task without a reference, with a judge model)."""
    no_demo: str | None = None
    """Why the task may not be a demonstration (an end user's label, ...)."""
    trust: str | None = None
    """Whose word its label is (`trust.Trust.label`, `trust.TRUST_KEY`)."""
    tags: tuple[str, ...] = ()
    """The logged rows' tags (import `tags`, a harvest's source): the gate's per-tag veto."""
    tools: tuple[Mapping[str, JsonValue], ...] = ()
    """An episode task's tools (`replay.py`), as the client sent them."""
    tool_choice: JsonValue = None
    """An episode task's tool_choice, as the client sent it (written with `tools`, None too)."""
    fixtures: tuple[Mapping[str, JsonValue], ...] = ()
    """An episode's recorded tool results: {"name", "arguments", "result"}."""
    logged: tuple[Mapping[str, JsonValue], ...] = ()
    """An episode's logged turns after the request (assistant replies, tool results)."""
    expected_calls: tuple[Mapping[str, JsonValue], ...] = ()
    """The user's corrected tool calls: {"name", "arguments"}."""
    workspace: WorkspaceCheck | None = None
    """A workspace task's check (`agent_outcome.py`)."""
    mined_check: MinedCheckRecord | None = None
    """The check the miner wrote (`miner.py`)."""
    bare_verdict: BareVerdictMark | None = None
    """Train only: its only verdict was a bare one (`mine.BARE_VERDICT`)."""
    weak: WeakLabel | None = None
    """Train only: a weak label, the samples' agreement (`weak.py`)."""
    synthetic: SyntheticOrigin | None = None
    """Train only: a dreamt variant, of which task and how (`dream.py`)."""

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "rules": tuple,
        "tags": strings,
        "tools": tuple,
        "fixtures": tuple,
        "logged": tuple,
        "expected_calls": tuple,
        "workspace": WorkspaceCheck.from_dict,
        "mined_check": MinedCheckRecord.from_dict,
        "bare_verdict": BareVerdictMark.from_dict,
        "weak": WeakLabel.from_dict,
        "synthetic": SyntheticOrigin.from_dict,
    }

    def __post_init__(self) -> None:
        if self.read_keys is None:  # made in code: it holds the keys given a value
            names = self.names()
            given = [
                f.name
                for f in fields(self)
                if f.name in names and getattr(self, f.name) != _default(f)
            ]
            object.__setattr__(self, "read_keys", (*given, *self.extra))

    def has(self, key: str) -> bool:
        """Whether it holds `key` (as `key in state` told of the dict)."""
        return key in (self.read_keys or ())

    def without(self, *keys: str) -> TaskChecks:
        """These checks less `keys` (as `state.pop(key)` left the dict)."""
        defaults = {f.name: _default(f) for f in fields(self) if f.name in keys}
        return replace(
            self,
            **defaults,
            extra={k: v for k, v in self.extra.items() if k not in keys},
            read_keys=tuple(k for k in self.read_keys or () if k not in keys),
        )

    def keep(self, *keys: str) -> TaskChecks:
        """Only those of `keys` it holds, in `keys`' order."""
        return TaskChecks.empty().but(**{k: getattr(self, k) for k in keys if self.has(k)})

    @property
    def has_answer_check(self) -> bool:
        """A check of the final answer: a reference, a rubric or a rule (`replay.py`'s
        `has_answer_check` of the dict)."""
        return bool(self.scorer or self.rubric or self.rules)

    def train_only(self) -> dict[str, Record]:
        """The marks it holds of a task that trains and never validates, by key, in
        `split.TRAIN_ONLY`'s order: "weak", "synthetic", "bare_verdict"."""
        marks: dict[str, Record | None] = {
            "weak": self.weak,
            "synthetic": self.synthetic,
            "bare_verdict": self.bare_verdict,
        }
        return {k: v for k, v in marks.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class TaskRecord(Record):
    """One row of a night's tasks.jsonl (`summary.task_row`): a task the night mined or
    recalled, with its trust provenance: the interactions it came from (`sources`), their
    origins and `clients`, `no_demo`, why it may not be a demonstration (None: it may), and
    `trust`, whose word its label is (`trust.Trust.label`; None: it has no label)."""

    id: str = ""
    split: str | None = None
    checks: str = ""
    reference: JsonValue = None
    negative_feedback: bool = False
    sources: tuple[str, ...] = ()  # interaction ids, newest first
    origins: tuple[str, ...] = ()  # proxy / api / import / claude-code ...
    clients: tuple[str, ...] = ()  # who sent them
    no_demo: str | None = None
    trust: str | None = None
    prompt_head: str = ""
    rubric: str | None = None
    notes: tuple[str, ...] = ()
    signals: tuple[TaskSignal, ...] = ()
    weak: WeakLabel | None = None
    synthetic: SyntheticOrigin | None = None
    recalled: bool = False  # lent by the recall pool, not mined tonight
    kind: str | None = None  # its kind of request (`kinds.py`)

    decoders: ClassVar[Mapping[str, Decoder]] = {
        "sources": strings,
        "origins": strings,
        "clients": strings,
        "notes": strings,
        "signals": many(TaskSignal),
        "weak": WeakLabel.from_dict,
        "synthetic": SyntheticOrigin.from_dict,
    }
