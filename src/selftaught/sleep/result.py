"""A night's result: what one night did for one project, typed section by section.

`NightResult` is the night's report.json as fields of the same names (each section a frozen
record from `records.py`); `from_report` reads any version's report.json, `report_dict()`
writes it back key for key. `NightDraft` is the night being built: its phases fill it in,
and its end makes it a `NightResult`, once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from selftaught.models.usage import Usage
from selftaught.record import Decoder, plain
from selftaught.results import RunResult, SplitScore
from selftaught.skill.result import SlowUpdate
from selftaught.sleep.records import (
    AdoptedAdapter,
    BudgetRecord,
    DreamRecord,
    GateMode,
    KindRecord,
    LateDuplicate,
    MiningRecord,
    ModelSpecs,
    PhaseOutput,
    PhaseRecord,
    ProofreadRecord,
    ProposalRecord,
    RecallRecord,
    SkillRecord,
    SkillSetRecord,
    SourceFileRecord,
    SplitCounts,
    TaskRecord,
    TrainingRecord,
    WeakRecord,
    WeightsRecord,
    WindowRecord,
    each,
    many,
    strings,
)
from selftaught.stops import StopReason, stop_dict

NIGHT_KIND = "sleep-night"  # report.json's "kind"
TASKS_FILE = "tasks.jsonl"  # in the night's folder: its tasks, one `TaskRecord` a line
EVIDENCE_FILE = "evidence.jsonl"  # in the night's folder: every model call
ROWS_READ_FILE = "rows_read.txt"  # in the night's folder: the ids of the rows it read, one a line
EXIT_FAILED = ("backend_failed", "failed")


@dataclass(frozen=True, kw_only=True)
class NightResult(RunResult):
    """What one night did for one project, and where it is: its report.json as typed fields
    of the same names, each section a frozen record (`records.py`); `report_dict()` is that
    file, key for key, also for a report an older version wrote. A `RunResult` whose scores
    are val before / after the proposal (nothing shipped: both the start).

    Frozen: the night's phases fill a `NightDraft`, which its end makes a `NightResult`, once;
    a night that changes after (adopted, marked interrupted) is a new one
    (`dataclasses.replace`), written back with `staging.write_night`."""

    kind: ClassVar[str] = "night"

    project: str
    night_dir: Path | None
    night: str = ""
    status: str = ""
    reason: str | None = None
    pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    models: ModelSpecs | None = None
    gate: GateMode | None = None
    training: TrainingRecord | None = None
    budget: BudgetRecord | None = None
    notes: tuple[str, ...] = ()
    window: WindowRecord | None = None
    consumed_until: float | None = None
    base_version: int | None = None
    mining: MiningRecord | None = None
    recall: RecallRecord | None = None
    splits: SplitCounts | None = None
    duplicates: tuple[LateDuplicate, ...] = ()  # dropped late as the same item as a held-out one
    phases: Mapping[str, PhaseRecord] = field(default_factory=dict)
    phase_seconds: Mapping[str, float] = field(default_factory=dict)  # mine, text, weights, ...
    proposal: ProposalRecord | None = None
    proofread: ProofreadRecord | None = None
    replay: str | None = None  # how val tasks were replayed: episode, reply or agent
    weights: WeightsRecord | None = None
    adapter: AdoptedAdapter | None = None
    weak: WeakRecord | None = None  # weak labels (`weak.weak_label`), when sampled
    dream: DreamRecord | None = None  # synthetic tasks (`dream.dream`), when dreamed
    evidence_calls: int | None = None
    adopted_version: int | None = None
    adopted_at: float | None = None
    skills: tuple[SkillRecord, ...] = ()  # a many-skills night's skills
    skill_set: SkillSetRecord | None = None
    start_document: SourceFileRecord | None = None
    kinds: tuple[KindRecord, ...] = ()  # each kind of request the night measured (`kinds.py`)
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys of a report written by a newer version (kept, written back as they came)."""
    report_keys: tuple[str, ...] | None = None
    """The keys of the report.json it was read from, in order (None: built in code)."""
    records: Mapping[str, PhaseOutput] = field(default_factory=dict, compare=False, repr=False)
    """Each phase's record by its name, as the night that ran returned them (a phase of your
    own's too: `NightTrainer(phases=...)`); the built-in ones are also the sections above.
    Not in report.json: a night read back has none."""

    def __post_init__(self) -> None:
        """The `RunResult` fields that follow from the night's sections."""
        super().__post_init__()
        before, after = _night_scores(self)
        self._derive(
            run_dir=self.run_dir or self.night_dir,
            method=self.method or "night",
            task=self.task or self.project,
            base_score=self.base_score or before,
            shipped_score=self.shipped_score or after,
        )
        if self.stopped_by is None and self.failed:
            self._derive(stopped_by=StopReason.read(self.reason))
        if not self.seconds and self.ended_at and self.started_at:
            self._derive(seconds=float(self.ended_at) - float(self.started_at))

    @classmethod
    def from_report(
        cls, project: str, night_dir: Path | None, report: Mapping[str, Any]
    ) -> NightResult:
        """The night a report.json describes (any version's)."""
        typed: dict[str, Any] = {}
        for name in REPORT_FIELDS:
            if name in report and name != "usage":
                value, decode = report[name], _DECODE.get(name)
                typed[name] = decode(value) if decode is not None and value is not None else value
        extra = {k: v for k, v in report.items() if k not in (*REPORT_FIELDS, *_HEAD)}
        if isinstance(report.get("stopped_by"), str):  # an older night's stop, in words: kept
            extra["stopped_by"] = report["stopped_by"]
        return cls(
            project=project,
            night_dir=night_dir,
            usage=dict(report.get("usage") or {}),
            extra=extra,
            report_keys=tuple(report),
            **typed,
        )

    def _report_value(self, name: str, read: bool) -> Any:
        value = getattr(self, name)
        if name == "stopped_by":  # a failed night's is its reason, already written
            derived = self.failed and value == StopReason.read(self.reason)
            return stop_dict(value) if read or not derived else None
        return plain(value)

    def report_dict(self) -> dict[str, Any]:
        """The night as its report.json holds it: the keys it was read with, in their order
        (a night built in code: its set fields), then fields set since."""
        read = self.report_keys is not None
        order = self.report_keys if self.report_keys is not None else (*_HEAD, *REPORT_FIELDS)
        out: dict[str, Any] = {}
        for name in order:
            if name == "kind":
                out[name] = NIGHT_KIND
            elif name == "project":
                out[name] = self.project
            elif name in self.extra:
                out[name] = self.extra[name]
            elif name in REPORT_FIELDS:
                value = self._report_value(name, read)
                if read or name in _ALWAYS or value not in _EMPTY:
                    out[name] = value
        for name in REPORT_FIELDS:  # set since the report was read
            if name not in out and (value := self._report_value(name, False)) not in _EMPTY:
                out[name] = value
        return {**out, **{k: v for k, v in self.extra.items() if k not in out}}

    def texts(self) -> dict[str, str]:
        folder = self.night_dir / "proposal" if self.night_dir else None
        if self.status != "staged" or folder is None:
            return {}
        names = ("skill.md", "memory.md")
        return {f"proposal_{n}": (folder / n).read_text() for n in names if (folder / n).exists()}

    def to_dict(self) -> dict[str, Any]:
        night_dir = str(self.night_dir) if self.night_dir else None
        return {
            **super().to_dict(),
            "project": self.project,
            "night_dir": night_dir,
            "report": self.report_dict(),
        }

    @classmethod
    def _fields_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        night_dir = Path(d["night_dir"]) if d.get("night_dir") else None
        night = cls.from_report(d["project"], night_dir, d.get("report") or {})
        report = {f.name: getattr(night, f.name) for f in fields(cls) if f.name in _OWN}
        return {**super()._fields_from_dict(d), **report}

    def tasks(self) -> tuple[TaskRecord, ...]:
        """The night's tasks as its tasks.jsonl lists them, each with its trust provenance:
        the interactions it came from (`sources`), their `origins` and `clients`, and
        `no_demo` (why it may not be a demonstration). () when the night wrote no such file
        (it mined nothing, or the night is not on disk)."""
        path = self.night_dir / TASKS_FILE if self.night_dir is not None else None
        if path is None or not path.is_file():
            return ()
        lines = path.read_text(encoding="utf-8").splitlines()
        return tuple(TaskRecord.from_dict(json.loads(line)) for line in lines if line.strip())

    @property
    def evidence_path(self) -> Path | None:
        """The night's evidence log: every model call it made (role, messages, reply), one
        JSON line each, redacted (`evidence.EvidenceLog`); None when it has none on disk."""
        path = self.night_dir / EVIDENCE_FILE if self.night_dir is not None else None
        return path if path is not None and path.is_file() else None

    @property
    def failed(self) -> bool:
        return self.status in EXIT_FAILED

    @property
    def slow(self) -> SlowUpdate | None:
        """The skill phase's slow update (`skill.slow`), typed; None when off or not run."""
        phase = self.phases.get("skill")
        return phase.slow.update if phase is not None and phase.slow is not None else None


@dataclass(kw_only=True)
class NightDraft:
    """The night being built: what its phases fill in, field by field, under the names of
    the `NightResult` fields they become (`NightContext.night`), in report.json's order
    (`REPORT_FIELDS`). `result()` makes it the frozen `NightResult`, once, when the night
    ends (and for report.json's first write, as the night starts running). The `RunResult`
    fields a night derives (val before / after, seconds, a failed night's stop) are derived
    then, from its sections.

    Its fields repeat `NightResult`'s (`test_night_built` checks they agree): a dataclass
    cannot share fields between a frozen class and a mutable one (inheriting either way is a
    TypeError), one made from the other at run time is invisible to mypy, and a draft that
    `replace`d a `NightResult` on each write would derive its scores before the night had
    them."""

    project: str
    night_dir: Path | None
    night: str = ""
    status: str = ""
    reason: str | None = None
    pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    models: ModelSpecs | None = None
    gate: GateMode | None = None
    training: TrainingRecord | None = None
    budget: BudgetRecord | None = None
    notes: tuple[str, ...] = ()
    window: WindowRecord | None = None
    consumed_until: float | None = None
    base_version: int | None = None
    mining: MiningRecord | None = None
    recall: RecallRecord | None = None
    splits: SplitCounts | None = None
    duplicates: tuple[LateDuplicate, ...] = ()
    phases: Mapping[str, PhaseRecord] = field(default_factory=dict)
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    usage: Usage = field(default_factory=dict)
    proposal: ProposalRecord | None = None
    proofread: ProofreadRecord | None = None
    replay: str | None = None
    weights: WeightsRecord | None = None
    adapter: AdoptedAdapter | None = None
    weak: WeakRecord | None = None
    dream: DreamRecord | None = None
    evidence_calls: int | None = None
    adopted_version: int | None = None
    adopted_at: float | None = None
    stopped_by: StopReason | None = None
    skills: tuple[SkillRecord, ...] = ()
    skill_set: SkillSetRecord | None = None
    start_document: SourceFileRecord | None = None
    kinds: tuple[KindRecord, ...] = ()
    records: Mapping[str, PhaseOutput] = field(default_factory=dict)

    def result(self) -> NightResult:
        """The night as it stands, as the frozen `NightResult` it returns."""
        return NightResult(**{f.name: getattr(self, f.name) for f in fields(self)})

    def note(self, *texts: str) -> None:
        """Add notes, in order (report.json `notes`)."""
        self.notes = (*self.notes, *texts)

    def drop_duplicates(self, *dropped: LateDuplicate) -> None:
        """Record items dropped late as duplicates of held-out ones (report.json
        `duplicates`)."""
        self.duplicates = (*self.duplicates, *dropped)

    def add_seconds(self, phase: str, seconds: float) -> None:
        """Add wall seconds to `phase_seconds[phase]`, rounded as the report keeps them."""
        total = self.phase_seconds.get(phase, 0.0) + seconds
        self.phase_seconds = {**self.phase_seconds, phase: round(total, 2)}

    @property
    def failed(self) -> bool:
        return self.status in EXIT_FAILED


ProjectNight = NightResult  # its name before the night was a trainer

REPORT_FIELDS = tuple(
    f.name for f in fields(NightDraft) if f.name not in ("project", "night_dir", "records")
)
"""report.json's keys (after "kind" and "project"), each a `NightResult` field of the same name:
the draft's fields, in its order, less where the night is and its phases' records."""
_HEAD = ("kind", "project")
# written even when empty, as the night wrote them before it was typed (old tooling reads them)
_ALWAYS = ("night", "status", "reason", "notes", "consumed_until", "phases")
_EMPTY: tuple[Any, ...] = (None, {}, [])
_DECODE: dict[str, Decoder] = {
    "models": ModelSpecs.from_dict,
    "gate": GateMode.from_dict,
    "training": TrainingRecord.from_dict,
    "budget": BudgetRecord.from_dict,
    "notes": strings,
    "window": WindowRecord.from_dict,
    "mining": MiningRecord.from_dict,
    "recall": RecallRecord.from_dict,
    "splits": SplitCounts.from_dict,
    "duplicates": many(LateDuplicate),
    "phases": each(PhaseRecord),
    "proposal": ProposalRecord.from_dict,
    "proofread": ProofreadRecord.from_dict,
    "weights": WeightsRecord.from_dict,
    "adapter": AdoptedAdapter.from_dict,
    "weak": WeakRecord.from_dict,
    "dream": DreamRecord.from_dict,
    "skills": many(SkillRecord),
    "skill_set": SkillSetRecord.from_dict,
    "start_document": SourceFileRecord.from_dict,
    "kinds": many(KindRecord),
}
_OWN = (*REPORT_FIELDS, "project", "night_dir", "extra", "report_keys")


def _night_scores(night: NightResult) -> tuple[SplitScore | None, SplitScore | None]:
    """Val before / after a staged proposal; a night that proposed nothing kept its start."""
    proposal = night.proposal
    if proposal is not None and proposal.val_before and proposal.val_after:
        before = proposal.val_before.score
        return before, proposal.val_after.score
    ran = [p.val_initial for p in night.phases.values() if p.val_initial]
    if not ran:
        return None, None
    start = ran[0].score
    return start, start
