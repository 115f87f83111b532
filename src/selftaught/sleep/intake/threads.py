"""Threads: the logged rows of one conversation, linked, and the replies in it.

A chat app resends the whole history with each request, so the conversation a user had is
spread over several rows: the first (a question → a reply), then each later one (the same
messages, that reply, the user's next turn → the next reply). A row *continues* another when
its messages begin with the other's messages followed by the other's reply (its text and its
tool calls, a call compared by its tool's name and its arguments as JSON), both from the same
client in the same project. A thread is a chain of such rows; its last row (the head) holds the
whole conversation, and every reply in it is one `Turn`: the messages up to the request, the
reply, and the user's next turn when there is one (what a night reads as feedback on that
reply: `selftaught.sleep.night.signals`).

A tool-using app resends its history within one request too: each step of an episode is a row
(the request → a tool call; the request, that call and its result → the next call or the
final answer), each continuing the one before. So an episode and the user's turn after its
final answer are one thread: the turn's reply is the final answer, its `steps` the calls and
results between the request and that answer, its `step_rows` the rows that logged those calls
(a night folds them into one episode task: `selftaught.sleep.night.replay`). Calls still under
way when the thread ends (no final answer logged yet) are the thread's `open_steps`.

A conversation can also sit inside one row: an imported chat, or a request whose history holds
an earlier reply and the user's answer to it. Its replies are turns of the same kind, logged by
no row of their own (`Turn.row_id` is None).

Coding agents' sessions (collapsed by `sessions.collapse_sessions`, linked by the agent's
session id) are threads of one row here: `how` says "session" for those, "single" for a
one-off request.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from selftaught.models.base import Message
from selftaught.sleep.adoption.inject import strip_injected_messages
from selftaught.sleep.intake.log import Interaction
from selftaught.sleep.intake.sessions import is_agent_session

ThreadKind = Literal["history", "session", "single"]


def message_text(content: Any) -> str | None:
    """A message's text (a string, or a list of text parts); None when it holds something other
    than text (an image...)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                return None
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    return None if content is not None else ""


# ---- tool calls compared as JSON ---------------------------------------------------------


def arguments_value(raw: Any) -> Any:
    """A call's arguments as a JSON value: a JSON string parsed (an unparsable one stays the
    string), `None` or "" as {}."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            return raw
    return raw


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    return value


def call_key(name: str, arguments: Any) -> str:
    """Equal for two calls of the same tool whose arguments are equal as JSON (objects compared
    without regard to key order, lists in order, 3 == 3.0)."""
    value = _canonical(arguments_value(arguments))
    return json.dumps([name, value], sort_keys=True, ensure_ascii=False)


def call_parts(call: Any) -> tuple[str, Any] | None:
    """(name, arguments as JSON) of a call in the OpenAI shape or `{"name", "arguments"}`;
    None when it names no tool."""
    if not isinstance(call, dict):
        return None
    fn = call.get("function")
    fn = fn if isinstance(fn, dict) else call
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    return name, arguments_value(fn.get("arguments", fn.get("input")))


# ---- what the log holds ------------------------------------------------------------------


@dataclass
class ToolFeedback:
    calls: list[dict[str, Any]] = field(default_factory=list)  # {"name", "arguments"[, "result"]}
    answer: Any = None


def _corrected_call(value: Any) -> dict[str, Any] | None:
    parts = call_parts(value)
    if parts is None or not ({"arguments", "function", "input"} & set(value)):
        return None
    call: dict[str, Any] = {"name": parts[0], "arguments": parts[1]}
    if value.get("result") is not None:
        call["result"] = str(value["result"])
    return call


def tool_feedback(reference: Any) -> ToolFeedback | None:
    """The corrected tool call(s) (and answer) a feedback `reference` holds, or None when it is
    a plain answer (the accepted shapes: `sleep.night.replay`'s docstring). Read here, below
    the night's replay and probation, which both check a reply against one."""
    value = reference
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    if isinstance(value, dict) and ("tool_calls" in value or "answer" in value):
        raw = value.get("tool_calls") or []
        calls = [_corrected_call(c) for c in (raw if isinstance(raw, list) else [raw])]
        if any(c is None for c in calls):
            return None
        return ToolFeedback([c for c in calls if c is not None], value.get("answer"))
    if isinstance(value, dict):
        call = _corrected_call(value)
        return ToolFeedback([call]) if call else None
    if isinstance(value, list) and value:
        calls = [_corrected_call(c) for c in value]
        if all(c is not None for c in calls):
            return ToolFeedback([c for c in calls if c is not None])
    return None


def logged_tools(it: Interaction) -> list[dict[str, Any]] | None:
    """The request's tools (rows logged before the tools column hold them in meta.request)."""
    tools = it.tools
    if tools is None and isinstance(it.meta, dict) and isinstance(it.meta.get("request"), dict):
        tools = it.meta["request"].get("tools")
    return tools if isinstance(tools, list) and tools else None


def logged_tool_calls(it: Interaction) -> list[dict[str, Any]]:
    calls = it.tool_calls
    if calls is None and isinstance(it.meta, dict):
        calls = it.meta.get("tool_calls")  # rows logged before the tool_calls column
    return [c for c in calls or [] if isinstance(c, dict)]


def _calls(message: Any) -> list[Any]:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return calls if isinstance(calls, list) else []


def reply_message(it: Interaction) -> Message:
    """`it`'s reply as the assistant turn an app resends: its text and its tool calls."""
    calls = logged_tool_calls(it)
    turn: Message = {"role": "assistant", "content": it.reply}
    return {**turn, "tool_calls": calls} if calls else turn


def threadable(it: Interaction) -> bool:
    """A row of an app's conversation: answered (text or tool calls), not a coding agent's
    session step."""
    answered = it.reply is not None or bool(logged_tool_calls(it))
    return it.is_task and answered and not is_agent_session(it)


# ---- threads -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One reply of a thread and what followed it."""

    index: int
    """The reply's position in the thread's conversation (its messages, then the head's reply)."""
    request: tuple[Message, ...]
    """The conversation up to and including the user's request (injected skill stripped)."""
    reply: str
    row_id: str | None
    """The row that logged this reply; None when it is only in a later row's history."""
    at: float
    """When the reply was logged (its row's time; the head's for a reply inside a row)."""
    followup: str | None = None
    """The text of the user's next turn, when the conversation goes on with one."""
    followup_row: str | None = None
    """The row whose request first holds that next turn."""
    followup_at: float | None = None
    steps: tuple[Message, ...] = ()
    """An episode's tool calls and their results between the request and the reply."""
    step_rows: tuple[str, ...] = ()
    """The rows that logged those calls, oldest first."""


@dataclass(frozen=True)
class Thread:
    """The rows of one conversation, oldest first; the last one holds all of it."""

    rows: tuple[Interaction, ...]
    how: ThreadKind
    turns: tuple[Turn, ...]
    open_steps: tuple[str, ...] = ()
    """Rows of tool calls after the last turn with no final answer logged yet."""

    @property
    def head(self) -> Interaction:
        return self.rows[-1]

    @property
    def id(self) -> str:
        return self.head.id

    @property
    def linked(self) -> bool:
        """More than one row, or more than one reply: a conversation, not a one-off."""
        return len(self.rows) > 1 or len(self.turns) > 1


def _key(message: Any) -> str:
    """A message as the app resends it: its role, its text and its tool calls by name and
    arguments (other fields, such as `refusal`, `annotations` or a call's id and type, come
    back in different shapes)."""
    if not isinstance(message, dict):
        return json.dumps(message, sort_keys=True, default=str)
    text = message_text(message.get("content"))
    if text is None:
        text = json.dumps(message.get("content"), sort_keys=True, default=str)
    calls = [call_key(*parts) for c in _calls(message) if (parts := call_parts(c)) is not None]
    extra = json.dumps(calls, ensure_ascii=False) if calls else ""
    return f"{message.get('role')}\x00{text.strip()}\x00{extra}"


def _digest(keys: Sequence[str]) -> str:
    h = hashlib.sha256()
    for key in keys:
        h.update(key.encode("utf-8", "replace"))
        h.update(b"\x01")
    return h.hexdigest()


class _Index:
    """Rows by (project, client, digest of their messages): what a row continues."""

    def __init__(self, rows: list[Interaction]):
        self.messages = {it.id: strip_injected_messages(it.messages) for it in rows}
        self.keys = {it.id: [_key(m) for m in self.messages[it.id]] for it in rows}
        self.replies = {it.id: _key(reply_message(it)) for it in rows}
        self.by_digest: dict[tuple[str, str | None, str], list[Interaction]] = {}
        for it in sorted(rows, key=_when):
            where = (it.project, it.client, _digest(self.keys[it.id]))
            self.by_digest.setdefault(where, []).append(it)

    def logged(self, it: Interaction, upto: int, reply_key: str) -> Interaction | None:
        """The row of `it`'s project and client whose messages are `it`'s first `upto` and
        whose reply is `reply_key` (the oldest, when the request was sent twice)."""
        where = (it.project, it.client, _digest(self.keys[it.id][:upto]))
        for row in self.by_digest.get(where, []):
            if row.id != it.id and self.replies[row.id] == reply_key:
                return row
        return None

    def asked(self, head: Interaction, keys: list[str]) -> Interaction:
        """The oldest row of `head`'s project and client whose request was exactly `keys`
        (the one that carried a follow-up as its last turn); `head` when none was logged."""
        found = self.by_digest.get((head.project, head.client, _digest(keys)), [])
        return found[0] if found else head


def _turns(head: Interaction, index: _Index) -> tuple[list[Turn], list[str]]:
    """The replies of `head`'s conversation, each with the user's next turn; and the rows of
    the tool calls made since the last user request when no final answer followed them."""
    messages = index.messages[head.id]
    conversation = [*messages, reply_message(head)]
    keys = [*index.keys[head.id], index.replies[head.id]]
    turns: list[Turn] = []
    asked: int | None = None  # the user request the assistant turns since answer
    steps: list[str] = []  # the rows of the tool calls made since that request
    for i, msg in enumerate(conversation):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role == "user":
            asked, steps = i, []
            continue
        if role == "tool" and asked is not None:
            continue
        if role != "assistant" or asked is None:
            asked = None
            continue
        row = head if i == len(messages) else index.logged(head, i, keys[i])
        if _calls(msg):  # a step of an episode: its final answer is the reply
            steps += [row.id] if row is not None else []
            continue
        reply = message_text(msg.get("content"))
        if reply is not None:
            turns.append(_turn(head, index, conversation, keys, asked, i, reply, row, steps))
        asked = None
    return turns, steps if asked is not None else []


def _turn(
    head: Interaction,
    index: _Index,
    conversation: list[Any],
    keys: list[str],
    asked: int,
    i: int,
    reply: str,
    row: Interaction | None,
    steps: list[str],
) -> Turn:
    """The reply at `i` to the user's request at `asked`, with the user's next turn."""
    nxt = conversation[i + 1] if i + 1 < len(conversation) else None
    followup, by = None, None
    if isinstance(nxt, dict) and nxt.get("role") == "user":
        followup = message_text(nxt.get("content"))
        by = index.asked(head, keys[: i + 2])
    return Turn(
        index=i,
        request=tuple(conversation[: asked + 1]),
        reply=reply,
        row_id=None if row is None else row.id,
        at=head.created_at if row is None else row.created_at,
        followup=followup,
        followup_row=None if by is None else by.id,
        followup_at=None if by is None else by.created_at,
        steps=tuple(conversation[asked + 1 : i]),
        step_rows=tuple(steps),
    )


def build_threads(rows: Iterable[Interaction]) -> list[Thread]:
    """Every row in exactly one thread, threads in the order of their first row.

    A row continued by a later row of its client belongs to that row's thread. A branch (two
    rows continuing one, as after a regenerated reply) makes two threads that share their
    first turns; the shared rows belong to the older branch."""
    rows = list(rows)
    chat = [it for it in rows if threadable(it)]
    index = _Index(chat)
    continued: set[str] = set()
    for it in chat:
        for i, key in enumerate(index.keys[it.id]):
            if i > 0 and key.startswith("assistant\x00"):
                earlier = index.logged(it, i, key)
                if earlier is not None:
                    continued.add(earlier.id)
    owner: dict[str, Thread] = {}
    by_id = {it.id: it for it in chat}
    for head in sorted((it for it in chat if it.id not in continued), key=_when):
        turns, open_steps = _turns(head, index)
        ids = [t.row_id for t in turns if t.row_id is not None]
        ids += [s for t in turns for s in t.step_rows] + open_steps + [head.id]
        own = [by_id[i] for i in dict.fromkeys(ids) if i not in owner]
        how: ThreadKind = "history" if len(own) > 1 or len(turns) > 1 else "single"
        thread = Thread(tuple(sorted(own, key=_when)), how, tuple(turns), tuple(open_steps))
        for r in own:
            owner[r.id] = thread
    out: list[Thread] = []
    placed: set[int] = set()
    for it in sorted(rows, key=_when):
        found = owner.get(it.id)
        if found is None:
            found = Thread((it,), "session" if it.session_id else "single", ())
        if id(found) not in placed:
            placed.add(id(found))
            out.append(found)
    return out


def _when(it: Interaction) -> tuple[float, str]:
    return (it.created_at, it.id)
