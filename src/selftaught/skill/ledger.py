"""The edit ledger: the run's rejected-edit buffer kept across runs and nights.

Inside one run, edits the gate refused go to `RunState.rejected` (the analyst sees them, select
drops them). The ledger is that buffer's cross-run form: an append-only JSONL file with one
typed row (`LedgerEvent`) per event, so a project (`<home>/projects/<p>/edit_ledger.jsonl`) or
an `optimize` run dir (`edit_ledger.jsonl`, or a path several runs of one skill share) knows,
for every edit ever proposed, how often it was proposed, accepted, rejected by the gate, or
rolled back with the night that adopted it, and on which tasks.

    run          a run (or a night's phase) started: what `--slow-every` counts
    proposed     an edit the analyst proposed (after merge, before the budget)
    accepted     an edit of the candidate the gate passed
    rejected     an edit of a candidate the gate refused
    rolled_back  an edit accepted by a night whose adopted version was later rolled back
    dropped      a rule the slow update's leave-one-out dropped (it earned nothing on val)
    slow         a slow update's rewrite and the gate's decision on it

Identical edits (op, target and content, whitespace and case normalised: `Edit.key`) are one
entry of the summary (`LedgerEntry`). A row is written with one `write` under an exclusive lock
and fsynced; a torn last line (a kill mid-write) is skipped on read, and the same event
recorded twice (a resumed step) counts once.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from selftaught.choices import one_of
from selftaught.errors import InputError
from selftaught.runs import open_private_append
from selftaught.skill.document import Edit, edit_op, normalize

if TYPE_CHECKING:
    from selftaught.skill.propose import Proposal

LEDGER_FILE = "edit_ledger.jsonl"
EventKind = Literal["run", "proposed", "accepted", "rejected", "rolled_back", "dropped", "slow"]
EVENT_KINDS: tuple[EventKind, ...] = (
    "run",
    "proposed",
    "accepted",
    "rejected",
    "rolled_back",
    "dropped",
    "slow",
)


@dataclass(frozen=True)
class LedgerEvent:
    """One line of the ledger: what happened to one edit (or to a run) and where."""

    kind: EventKind
    run: str  # the run dir (a night's phase folder) the event belongs to
    step: int = 0
    document: str = "skill"
    op: str = ""
    target: str = ""
    content: str = ""
    tasks: tuple[str, ...] = ()  # train tasks whose reflection proposed the edit
    reason: str = ""
    time: float = 0.0

    def key(self) -> tuple[str, str, str]:
        return (self.op, normalize(self.target), normalize(self.content))

    def identity(self) -> tuple[Any, ...]:
        """What makes two rows the same event (a resumed step writes its rows again)."""
        return (self.kind, self.run, self.step, self.document, self.key())

    def edit(self) -> Edit:
        return Edit(edit_op(self.op), content=self.content, target=self.target)

    @classmethod
    def of_edit(
        cls,
        kind: EventKind,
        run: str,
        step: int,
        edit: Edit,
        *,
        document: str = "skill",
        tasks: Iterable[str] = (),
        reason: str = "",
    ) -> LedgerEvent:
        return cls(
            kind,
            run,
            step,
            document,
            edit.op,
            edit.target,
            edit.content,
            tuple(dict.fromkeys(tasks)),
            reason,
            time.time(),
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tasks": list(self.tasks)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LedgerEvent:
        kind = one_of(d["kind"], EVENT_KINDS)
        if kind is None:
            raise InputError(f"unknown ledger event {d['kind']!r}")
        return cls(
            kind,
            str(d["run"]),
            int(d.get("step") or 0),
            str(d.get("document") or "skill"),
            str(d.get("op") or ""),
            str(d.get("target") or ""),
            str(d.get("content") or ""),
            tuple(str(t) for t in d.get("tasks") or ()),
            str(d.get("reason") or ""),
            float(d.get("time") or 0.0),
        )


@dataclass(frozen=True)
class LedgerEntry:
    """One edit (normalised) across every run: how often each fate befell it."""

    op: str
    target: str
    content: str
    document: str = "skill"
    proposed: int = 0
    accepted: int = 0
    rejected: int = 0
    rolled_back: int = 0
    dropped: int = 0
    tasks: tuple[str, ...] = ()
    runs: tuple[str, ...] = ()
    last_time: float = 0.0

    @property
    def failures(self) -> int:
        """Gate rejections and rollbacks: what "tried and failed" counts."""
        return self.rejected + self.rolled_back

    def edit(self) -> Edit:
        return Edit(edit_op(self.op), content=self.content, target=self.target)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tasks": list(self.tasks), "runs": list(self.runs)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LedgerEntry:
        ints = ("proposed", "accepted", "rejected", "rolled_back", "dropped")
        return cls(
            str(d["op"]),
            str(d.get("target") or ""),
            str(d.get("content") or ""),
            str(d.get("document") or "skill"),
            **{k: int(d.get(k) or 0) for k in ints},
            tasks=tuple(d.get("tasks") or ()),
            runs=tuple(d.get("runs") or ()),
            last_time=float(d.get("last_time") or 0.0),
        )


@dataclass
class _Tally:
    first: LedgerEvent
    counts: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, None] = field(default_factory=dict)
    runs: dict[str, None] = field(default_factory=dict)
    last_time: float = 0.0

    def entry(self) -> LedgerEntry:
        e = self.first
        return LedgerEntry(
            e.op,
            e.target,
            e.content,
            e.document,
            proposed=self.counts.get("proposed", 0),
            accepted=self.counts.get("accepted", 0),
            rejected=self.counts.get("rejected", 0),
            rolled_back=self.counts.get("rolled_back", 0),
            dropped=self.counts.get("dropped", 0),
            tasks=tuple(self.tasks),
            runs=tuple(self.runs),
            last_time=self.last_time,
        )


class EditLedger:
    """The ledger file at `path` (created on the first append, 0600)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def append(self, events: Sequence[LedgerEvent]) -> None:
        """Append `events` in one write under an exclusive lock, then fsync."""
        if not events:
            return
        data = "".join(json.dumps(e.to_dict(), ensure_ascii=False) + "\n" for e in events)
        with open_private_append(self.path) as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def events(self) -> list[LedgerEvent]:
        """Every event, in order, each once; lines that do not parse (a torn tail) skipped."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        out: list[LedgerEvent] = []
        seen: set[tuple[Any, ...]] = set()
        for line in text.splitlines():
            try:
                event = LedgerEvent.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError):
                continue
            if event.identity() not in seen:
                seen.add(event.identity())
                out.append(event)
        return out

    def runs(self, document: str = "skill") -> list[str]:
        """The runs recorded for `document`, oldest first."""
        found = (e.run for e in self.events() if e.kind == "run" and e.document == document)
        return list(dict.fromkeys(found))

    def summary(
        self, document: str | None = None, *, exclude_run: str | None = None
    ) -> list[LedgerEntry]:
        """One entry per distinct edit (of `document`, or of all), in first-seen order."""
        tallies: dict[tuple[str, tuple[str, str, str]], _Tally] = {}
        for e in self.events():
            if e.kind in ("run", "slow") or e.run == exclude_run:
                continue
            if document is not None and e.document != document:
                continue
            t = tallies.setdefault((e.document, e.key()), _Tally(e))
            t.counts[e.kind] = t.counts.get(e.kind, 0) + 1
            t.tasks.update(dict.fromkeys(e.tasks))
            t.runs[e.run] = None
            t.last_time = max(t.last_time, e.time)
        return [t.entry() for t in tallies.values()]

    def tried_and_failed(
        self,
        document: str = "skill",
        *,
        min_failures: int = 2,
        limit: int = 10,
        exclude_run: str | None = None,
    ) -> list[LedgerEntry]:
        """Edits rejected or rolled back at least `min_failures` times (and more often than
        accepted), the most failed (then the latest) first, at most `limit`; `exclude_run`'s
        own events left out."""
        failed = [
            e
            for e in self.summary(document, exclude_run=exclude_run)
            if e.failures >= min_failures and e.failures > e.accepted and e.op != "delete"
        ]
        failed.sort(key=lambda e: (-e.failures, -e.last_time))
        return failed[:limit]

    def kept_helping(self, document: str = "skill", *, min_accepted: int = 2) -> list[LedgerEntry]:
        """Edits the gate accepted at least `min_accepted` times, most accepted first."""
        helped = [e for e in self.summary(document) if e.accepted >= min_accepted]
        return sorted(helped, key=lambda e: -e.accepted)


def edit_tasks(proposals: Sequence[Proposal]) -> dict[tuple[str, str, str], list[str]]:
    """Each edit's train tasks: those of the reflections that proposed it; an edit the merge
    rewrote gets every task its proposal's reflections read."""
    out: dict[tuple[str, str, str], list[str]] = {}
    for p in proposals:
        read = [i for c in p.calls for i in c.example_ids]
        for c in p.calls:
            for e in c.edits:
                out.setdefault(e.key(), []).extend(c.example_ids)
        for e in p.update.merged:
            if not out.get(e.key()):
                out[e.key()] = list(read)
    return out


def step_events(
    run: str,
    step: int,
    document: str,
    proposals: Sequence[Proposal],
    fates: tuple[list[Edit], list[Edit]],
    reason: str,
) -> list[LedgerEvent]:
    """A step's rows: each merged edit proposed, then the applied ones accepted or rejected."""
    tasks = edit_tasks(proposals)
    accepted, lost = fates

    def rows(kind: EventKind, edits: Iterable[Edit], why: str = "") -> list[LedgerEvent]:
        return [
            LedgerEvent.of_edit(
                kind, run, step, e, document=document, tasks=tasks.get(e.key(), ()), reason=why
            )
            for e in edits
        ]

    merged = [e for p in proposals for e in p.update.merged]
    fated = rows("accepted", accepted, reason) + rows("rejected", lost, reason)
    return rows("proposed", merged) + fated
