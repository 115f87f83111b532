"""Labels real traffic already has: the user's next turn, and the same question asked again.

A night reads its window as threads (`selftaught.sleep.intake.threads`). Each reply of a thread
with a signal becomes a row to mine of its own, holding **the conversation up to the request
whose reply was judged**, never the feedback turn or what came after it:

- the user's next turn, read by `followup.read_followup` (correction → a reference and a
  thumbs-down; rejection → a thumbs-down; a restated rule → a comment whose rules check the
  task; acceptance → a thumbs-up), and by the miner model where those rules read a rejection
  without its value, or nothing (`followup_model.py`, when the night has a miner);
- a **re-ask**: the same request (a near-duplicate prompt) from the same end user (the app's
  `user` field where it sends one, else the client) within `MineConfig.reask_window_s`, in another
  conversation or as the next turn, marks the earlier reply failed (a thumbs-down).

A signal is feedback by one rule with the explicit kind (`Feedback`, field by field): its
giver is the row's client, and it is trusted only when that client's words are the operator's
(`words_trusted`: the operator's own rows and harvested agent transcripts, a client the proxy
was told to trust, `--trusted-clients`, or a file imported with `--trust-fields`). An end
user's signal is evidence: its correction checks the task (never a demonstration, adapter
sample or memory text), its words reach the analyst quoted. A value the row's explicit
feedback already set is kept; the signal fills the fields it left empty.

A reply whose request ends with the user's verdict on the earlier reply (a correction, a
rejection or a restated rule: "No, it's 17 km", "that's wrong", "just the number") is not a
task (`is_redo`): the earlier request is the task, the user's words (and any answer they gave)
sit in this one's prompt, and a task of each would put one question on both sides of the split.
It stays a row to read, evidence for the miner (a retry the user then accepted).

The operator may reject a signal before a night uses it (`sleep feedback ID --reject-signal`),
recorded in the project's `signals_rejected.json`.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from selftaught.duplicates import ItemKey, item_key, same_item
from selftaught.errors import InputError
from selftaught.redact import redact_for_model
from selftaught.runs import atomic_write_json
from selftaught.sleep.intake.log import (
    OPERATOR,
    TRUSTED_WORDS,
    USER_FIELDS,
    Feedback,
    Interaction,
    LogFilter,
    TaskLog,
)
from selftaught.sleep.intake.threads import Thread, Turn, build_threads, message_text
from selftaught.sleep.night.followup import Followup, read_followup
from selftaught.sleep.night.followup_model import FollowupAsk, ModelReader, wants_model
from selftaught.sleep.night.mine import (
    BARE_VERDICT,
    REFERENCE_REPLY,
    MineConfig,
    client_label,
)
from selftaught.sleep.paths import private_project_dir, project_dir
from selftaught.sleep.records import ConversationRecord, FollowupModelRecord

SignalKind = Literal[
    "correction", "rejection", "rule", "acceptance", "reask", "solved", "ended_red"
]  # the last two: the agent's own test runs (`agent_outcome.py`, source "agent")
REJECTED_FILE = "signals_rejected.json"

REDO = "redo"
REDONE = (
    "asks again after the user's verdict on the earlier reply (a correction, rejection or "
    "restated rule): that earlier request is the task, and the user's words (any answer "
    "they gave) sit in this one's prompt"
)
REDO_AFTER = ("correction", "rejection", "rule")


@dataclass(frozen=True)
class Signal:
    """A verdict on one reply, read from the conversation. `words` are the user's (redacted)."""

    id: str
    kind: SignalKind
    words: str
    thread: str
    turn: int
    row_id: str | None
    giver: str
    trusted: bool
    at: float
    reference: str | None = None
    rules: tuple[str, ...] = ()
    source: str = "conversation"
    read_by: str | None = None  # the model that read the words (None: the rules)

    @property
    def thumb(self) -> Literal["up", "down"] | None:
        if self.kind in ("acceptance", "solved"):
            return "up"
        return None if self.kind == "rule" else "down"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def words_trusted(it: Interaction) -> bool:
    """Whether what `it`'s client says counts as the operator's words."""
    return client_label(it) == OPERATOR or (
        isinstance(it.meta, dict) and it.meta.get(TRUSTED_WORDS) is True
    )


def end_user(it: Interaction) -> str:
    """Who asked: the app's own `user` field (chat completions `user`, Messages
    `metadata.user_id`) within the client, else the client."""
    request = it.meta.get("request") if isinstance(it.meta, dict) else None
    user = None
    if isinstance(request, dict):
        user = request.get("user")
        meta = request.get("metadata")
        if user is None and isinstance(meta, dict):
            user = meta.get("user_id")
    label = client_label(it)
    return f"{label}/{user}" if isinstance(user, str) and user else label


def signal_id(thread: Thread, turn: Turn) -> str:
    key = f"{turn.row_id or thread.id}#{turn.index}"
    return "s-" + hashlib.sha256(key.encode()).hexdigest()[:12]


# ---- the operator's rejections ------------------------------------------------------------


def rejected_signals(project: str, home: Path | None = None) -> set[str]:
    path = project_dir(project, home) / REJECTED_FILE
    if not path.is_file():
        return set()
    return set(json.loads(path.read_text()).get("rejected", []))


def review_signals(
    project: str, home: Path | None, ids: Iterable[str], accept: bool = False
) -> int:
    """Record that the operator rejects these signals (or, `accept`, takes a rejection back);
    how many changed."""
    before = rejected_signals(project, home)
    after = before - set(ids) if accept else before | set(ids)
    path = private_project_dir(project, home) / REJECTED_FILE
    atomic_write_json(path, {"rejected": sorted(after)})
    return len(before ^ after)


def signals_on_row(log: TaskLog, interaction: str) -> tuple[str, list[str]]:
    """(its project, the ids of the signals read on a logged row: on its reply, or on a reply
    inside it); InputError when none was."""
    it = log.get(log.resolve_id(interaction))
    config = MineConfig()
    window = config.reask_window_s + 86400  # the rows of its thread and of its re-asks
    flt = LogFilter(project=it.project, since=it.created_at - window, until=it.created_at + window)
    _, found, _ = read_threads(log.query(flt), config)
    ids = [s.id for s in found if s.row_id == it.id or s.thread == it.id]
    if not ids:
        raise InputError(f"no signal was read on interaction {it.id} (`sleep log --signals`)")
    return it.project, ids


# ---- reading the threads ----------------------------------------------------------------


def _last_user_text(turn: Turn) -> str:
    for msg in reversed(turn.request):
        if isinstance(msg, dict) and msg.get("role") == "user":
            return message_text(msg.get("content")) or ""
    return ""


def _signal(thread: Thread, turn: Turn, read: Followup | None, kind: SignalKind) -> Signal:
    head = thread.head
    return Signal(
        id=signal_id(thread, turn),
        kind=kind,
        words=redact_for_model(read.words if read else (turn.followup or "")),
        thread=thread.id,
        turn=turn.index,
        row_id=turn.row_id,
        giver=client_label(head),
        trusted=words_trusted(head),
        at=turn.followup_at or turn.at,
        reference=None if read is None else read.reference,
        rules=() if read is None else tuple(r.kind for r in read.rules),
        source="conversation" if kind != "reask" else "reask",
        read_by=None if read is None else read.by,
    )


def _feedback(explicit: Feedback, signal: Signal, read: Followup | None) -> Feedback:
    """`explicit` with the fields it left empty filled from `signal` (field by field trust)."""
    said: dict[str, object] = {"thumb": signal.thumb, "reference": signal.reference}
    if read is not None and read.rules:  # the words state a rule: a comment, as given
        said["comment"] = signal.words
    fb = Feedback(**{f.name: getattr(explicit, f.name) for f in fields(explicit)})
    untrusted = {name for name in USER_FIELDS if getattr(fb, name) is not None} - {
        name for name in USER_FIELDS if fb.trusted_for(name)
    }
    for name, value in said.items():
        if value is not None and getattr(fb, name) is None:
            setattr(fb, name, value)
            if not signal.trusted:
                untrusted.add(name)
    fb.untrusted_fields = tuple(n for n in USER_FIELDS if n in untrusted)
    fb.trusted = not untrusted
    if fb.giver is None:
        fb.giver = signal.giver
    return fb


def merge_signal(explicit: Feedback, signal: Signal) -> Feedback:
    """`explicit` with the fields it left empty filled from `signal` (its thumb, its
    reference), by the one rule every signal follows."""
    return _feedback(explicit, signal, None)


def _turn_row(thread: Thread, turn: Turn, rows: dict[str, Interaction]) -> Interaction:
    """The row to mine for `turn`: its own logged row cut to the request (and an episode's
    steps), or the head's."""
    base = rows.get(turn.row_id or "", thread.head)
    own = turn.row_id is not None
    meta = {k: v for k, v in base.meta.items() if own or k != "tool_calls"}
    return replace(
        base,
        id=base.id if own else f"{thread.id}#{turn.index}",
        messages=[*turn.request, *turn.steps],
        reply=turn.reply,
        created_at=turn.at,
        dedupe_key=base.dedupe_key if own else None,
        feedback=base.feedback if own else Feedback(),
        tool_calls=base.tool_calls if own else None,  # the head's reply may be a call
        meta={**meta, "thread": thread.id, "turn": turn.index},
    )


def _step_row(thread: Thread, row: Interaction, redo: bool) -> Interaction:
    """A row that logged one of an episode's tool calls, as it is: the night folds it into the
    episode's task (`replay.conversations`), or leaves it out with a retry's."""
    meta = {**row.meta, "thread": thread.id}
    return replace(row, meta={**meta, REDO: REDONE} if redo else meta)


_Verdict = tuple[Signal, Followup | None] | None


@dataclass
class _Read:
    """The rows to mine and the signals, as the threads are read; the turns whose signal the
    operator rejected, and the retries (`redo_turns`)."""

    rows: list[Interaction] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)
    emitted: set[str] = field(default_factory=set)  # a branch shares its first turns
    rejected: int = 0
    redo_turns: int = 0


_Reads = dict[tuple[str, int], Followup | None]


def _followups(
    threads: list[Thread], config: MineConfig, reader: ModelReader | None
) -> tuple[_Reads, FollowupModelRecord]:
    """What the next turn said of each reply (None: nothing): the rules' reading, then the
    model's where the rules read a bare rejection, or nothing (`MinerConfig.followup_reading`;
    one question per distinct turn: branches of a conversation share their first turns); and
    what the model read (`{}`: it was not asked)."""
    if not config.conversation:
        return {}, FollowupModelRecord.empty()
    reads: _Reads = {
        (thread.id, turn.index): read_followup(turn.followup, turn.reply)
        for thread in threads
        for turn in thread.turns
    }
    if reader is None:
        return reads, FollowupModelRecord.empty()
    asks: dict[tuple[str, str, str], FollowupAsk] = {}
    keys: dict[tuple[str, int], tuple[str, str, str]] = {}
    for thread in threads:
        private = any(it.private and not it.reviewed for it in thread.rows)
        for turn in thread.turns:
            ruled = reads[(thread.id, turn.index)]
            if not wants_model(turn.followup, ruled, reader.reading):
                continue
            ask = FollowupAsk(
                _last_user_text(turn), turn.reply, turn.followup or "", ruled, private
            )
            key = (ask.request, ask.reply, ask.followup)
            keys[(thread.id, turn.index)] = key
            if key not in asks or private:  # a private copy of the turn decides
                asks[key] = ask
    got, model = reader.read(list(asks.values()))
    read = dict(zip(asks, got, strict=True))
    for where, key in keys.items():
        reads[where] = read[key]
    return reads, model


def read_threads(
    rows: list[Interaction],
    config: MineConfig,
    rejected: set[str] | None = None,
    reader: ModelReader | None = None,
) -> tuple[list[Interaction], list[Signal], ConversationRecord]:
    """The rows to mine (one per reply of a conversation thread, the others as they are), the
    signals read, and what the threads held. `reader`: the miner reading the next turns the
    rules could not (`followup_model.py`); None: the rules alone."""
    rejected = rejected or set()
    threads = build_threads(rows)
    by_id = {it.id: it for it in rows}
    out = _Read()
    reads, model = _followups(threads, config, reader)
    verdicts: dict[tuple[str, int], _Verdict] = {}
    for thread in threads:
        for turn in thread.turns:
            read = reads.get((thread.id, turn.index))
            verdicts[(thread.id, turn.index)] = (
                None if read is None else (_signal(thread, turn, read, read.kind), read)
            )
    if config.reask_window_s > 0:
        _reasks(threads, config, verdicts)
    for thread in threads:
        if not thread.turns:
            out.rows.extend(thread.rows)
            continue
        _mine_rows(thread, by_id, verdicts, rejected, out)
    return (
        out.rows,
        out.signals,
        ConversationRecord(
            threads=len(threads),
            linked_threads=sum(thread.linked for thread in threads),
            turns=sum(len(thread.turns) for thread in threads),
            signals=dict(Counter(s.kind for s in out.signals)),
            trusted=sum(s.trusted for s in out.signals),
            untrusted=sum(not s.trusted for s in out.signals),
            rejected_by_operator=out.rejected,
            redo_turns=out.redo_turns,
            model=model,
        ),
    )


def _mine_rows(
    thread: Thread,
    by_id: dict[str, Interaction],
    verdicts: dict[tuple[str, int], _Verdict],
    rejected: set[str],
    out: _Read,
) -> None:
    judged = False  # the user gave a verdict on the previous reply: this request repeats it
    turns = list(thread.turns)
    for k, turn in enumerate(turns):
        v = verdicts.get((thread.id, turn.index))
        if v is not None and v[0].id in rejected:
            out.rejected += 1
            v = None
        row = _turn_row(thread, turn, by_id)
        redo, judged = judged, v is not None and v[0].kind in REDO_AFTER
        _steps(thread, turn.step_rows, by_id, redo, out)
        if row.id in out.emitted:
            continue
        out.emitted.add(row.id)
        if redo:  # evidence for the miner (a retry the user accepted), never a task
            out.redo_turns += 1
            row = replace(row, meta={**row.meta, REDO: REDONE})
        if v is not None:
            row = _judged(row, v, turns[k + 1].reply if k + 1 < len(turns) else None, out)
        out.rows.append(row)
    _steps(thread, thread.open_steps, by_id, judged, out)
    _steps(thread, [r.id for r in thread.rows], by_id, False, out)  # any other row, as it is


def _steps(
    thread: Thread, ids: Iterable[str], by_id: dict[str, Interaction], redo: bool, out: _Read
) -> None:
    for step in ids:
        if step not in out.emitted:
            out.emitted.add(step)
            out.rows.append(_step_row(thread, by_id[step], redo))


def _judged(
    row: Interaction, v: tuple[Signal, Followup | None], drawn: str | None, out: _Read
) -> Interaction:
    """`row` with the signal read on its reply: its feedback filled, the signal recorded.
    `drawn`: the thread's next reply (the one a correction drew)."""
    signal, read = v
    out.signals.append(signal)
    meta = {**row.meta, "signals": [signal.to_dict()]}
    if signal.kind == "correction" and drawn is not None and row.feedback.reference is None:
        meta[REFERENCE_REPLY] = drawn  # the reply its own reference drew
    feedback = _feedback(row.feedback, signal, read)
    if _bare(row.feedback, feedback, signal):
        meta[BARE_VERDICT] = signal.kind
    return replace(row, feedback=feedback, meta=meta)


def _bare(explicit: Feedback, merged: Feedback, signal: Signal) -> bool:
    """The row's only verdict is `signal`, a re-ask or a rejection without the right value
    (`mine.BARE_VERDICT`)."""
    said = explicit.thumb is not None or explicit.score is not None
    return signal.kind in ("reask", "rejection") and not said and merged.reference is None


def is_redo(it: Interaction) -> bool:
    """A reply to the user's verdict on an earlier reply of its thread (`REDONE`)."""
    return isinstance(it.meta, dict) and it.meta.get(REDO) is not None


def _reasks(
    threads: list[Thread],
    config: MineConfig,
    verdicts: dict[tuple[str, int], _Verdict],
) -> None:
    """Mark a reply failed when its end user asked the same request again in time (the same
    item, `selftaught.duplicates`: only asks of equal numbers can be, compared within (user,
    numbers); another instance of one template is another request). A
    turn whose request is the user's verdict on the earlier reply (a retry) asks nothing new:
    two corrections in the same words ("No, it's 7 km") are not a re-ask."""
    buckets: dict[tuple[str, tuple[str, ...]], list[_Ask]] = {}
    for thread in threads:
        judged = False
        for turn in thread.turns:
            v = verdicts.get((thread.id, turn.index))
            retry, judged = judged, v is not None and v[0].kind in REDO_AFTER
            text = _last_user_text(turn)
            if retry or not text.strip():
                continue
            ask = _Ask(turn.at, text, item_key(text), thread, turn)
            buckets.setdefault((end_user(thread.head), ask.key.numbers), []).append(ask)
    for asks in buckets.values():
        asks.sort(key=lambda a: a.at)
        for i, ask in enumerate(asks):
            if verdicts.get((ask.thread.id, ask.turn.index)) is not None:
                continue
            for later in asks[i + 1 :]:
                if later.at - ask.at > config.reask_window_s:
                    break
                if later.turn is not ask.turn and same_item(
                    ask.key, later.key, config.near_duplicate
                ):
                    signal = _signal(ask.thread, ask.turn, None, "reask")
                    words = redact_for_model(later.text)
                    verdicts[(ask.thread.id, ask.turn.index)] = (replace(signal, words=words), None)
                    break


@dataclass(frozen=True)
class _Ask:
    at: float
    text: str
    key: ItemKey
    thread: Thread
    turn: Turn
