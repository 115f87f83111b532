"""An agent session's logged turns as one episode.

Claude Code and Codex send the whole conversation so far with each model call, so the proxy
logs one row per call of a session: the first (the user's request → a tool call), then each
step after it (the same messages plus the call and its result → the next call or the final
answer). The last row of that chain holds the whole episode: the request, every tool call
with the result the agent really received, the final answer. So:

- `collapse_sessions` keeps, of each session's proxy rows, only those that are not a step of
  a later one (a row is a step of another when its messages are a prefix of the other's and
  the other goes on with an assistant turn), and gives the kept row the feedback of the
  steps it absorbed (its own value of each field first, then the newest step's; untrusted
  if any value came from untrusted feedback) and their ids (`meta["session_steps"]`). Rows
  of a session that are not steps of its chain (a side request, a subagent) stay rows of
  their own. The night calls it where it gathers rows; the episode is then mined as any
  tool-using row is (`sleep.night.replay`).
- `last_turn` finds the row feedback on a session attaches to: the newest answered row of
  the session in the project (of one client, when it is named).

A session id is scoped by the client that sent it: another client's rows carrying the same id
are another session (collapsed apart, never a step of it, never where its feedback lands).
- `task_turns` is what of an agent session's row is the user's task (`is_agent_session`: a
  coding agent's row, logged by the proxy on the Messages / Responses wire with the agent's
  session id, or harvested from its transcripts): the conversation without the harness's
  own context. The system / developer messages (the agent's prompt, and the injected
  selftaught block) go, and so does what the harness writes into user turns: Claude Code's
  `<system-reminder>` blocks (CLAUDE.md among them), Codex's `# AGENTS.md instructions` with
  their `<INSTRUCTIONS>`, `<environment_context>` and `<user_instructions>`. The agent
  supplies all of that again when it runs; the tools it offered stay in the row.

Only proxy rows are collapsed: a harvested transcript already holds one row per request.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from selftaught.errors import InputError
from selftaught.sleep.adoption.inject import strip_injected_messages
from selftaught.sleep.intake.log import USER_FIELDS, Feedback, Interaction, LogFilter, TaskLog

SESSION_SOURCE = "proxy"
AGENT_WIRES = ("messages", "responses")  # meta["wire"] of a Claude Code / Codex request
AGENT_TRANSCRIPTS = ("claude-code", "codex")  # sources of harvested agent transcripts
HARNESS_ROLES = ("system", "developer")
# What Claude Code and Codex write into a user turn around the user's words (read off the
# requests of Claude Code 2.1.328 and Codex 0.169.0).
_HARNESS_TEXT = re.compile(
    r"<(system-reminder|environment_context|user_instructions|INSTRUCTIONS)\b[^>]*>.*?</\1>"
    r"|^# AGENTS\.md instructions for [^\n]*$",
    re.DOTALL | re.MULTILINE,
)
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LOOKUP_PAGE = 500
LOOKUP_MAX_ROWS = 100_000  # `last_turn` looks this far back at most


def check_session_id(session_id: str) -> str:
    """A session id names a file: letters, digits, '.', '_', '-' only (no path, no glob)."""
    if not isinstance(session_id, str) or not _SESSION_ID.match(session_id):
        shown = repr(session_id) if len(repr(session_id)) <= 80 else repr(session_id)[:77] + "..."
        raise InputError(f"invalid session id {shown}: letters, digits, '.', '_' or '-' only")
    return session_id


def _key(message: Any) -> str:
    return json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)


class _Conversation:
    """A row's messages as the client sent them, each as a comparable key."""

    def __init__(self, it: Interaction):
        self.messages = strip_injected_messages(it.messages)
        self.keys = [_key(m) for m in self.messages]

    def continued_by(self, other: _Conversation) -> bool:
        """`other` is this conversation followed by an assistant turn (and what came after)."""
        n = len(self.keys)
        if len(other.keys) <= n or other.keys[:n] != self.keys:
            return False
        nxt = other.messages[n]
        return isinstance(nxt, dict) and nxt.get("role") == "assistant"


def _chained(rows: list[Interaction]) -> tuple[list[Interaction], dict[str, list[Interaction]]]:
    """(the rows no other row continues, each kept row's absorbed steps, oldest first)."""
    convs = {it.id: _Conversation(it) for it in rows}
    longest_first = sorted(rows, key=lambda it: len(convs[it.id].keys), reverse=True)
    parent: dict[str, str] = {}
    for it in rows:
        for other in longest_first:
            if other.id != it.id and convs[it.id].continued_by(convs[other.id]):
                parent[it.id] = other.id
                break
    kept = [it for it in rows if it.id not in parent]
    steps: dict[str, list[Interaction]] = {it.id: [] for it in kept}
    for it in rows:
        top = it.id
        while top in parent:  # a step of a step belongs to the chain's last row
            top = parent[top]
        if top != it.id:
            steps[top].append(it)
    for chain in steps.values():
        chain.sort(key=lambda s: s.created_at)
    return kept, steps


def _merged(final: Interaction, steps: list[Interaction]) -> Interaction:
    """A copy of `final` with the steps' feedback folded in and their ids recorded."""
    out = Interaction(**{f.name: getattr(final, f.name) for f in fields(final)})
    fb = Feedback(**{f.name: getattr(final.feedback, f.name) for f in fields(final.feedback)})
    untrusted = {name for name in USER_FIELDS if not fb.trusted_for(name)}
    for step in reversed(steps):  # newest step first
        for name in USER_FIELDS:
            value = getattr(step.feedback, name)
            if getattr(fb, name) is None and value is not None:
                setattr(fb, name, value)
                if not step.feedback.trusted_for(name):
                    untrusted.add(name)
    fb.untrusted_fields = tuple(name for name in USER_FIELDS if name in untrusted)
    fb.trusted = not untrusted
    out.feedback = fb
    out.meta = {**out.meta, "session_steps": [s.id for s in steps]}
    return out


def collapse_sessions(rows: Iterable[Interaction]) -> list[Interaction]:
    """`rows` with each proxy session's steps folded into its last turn (see the module
    docstring); order kept (a session's kept rows where its first kept row was)."""
    rows = list(rows)
    sessions: dict[tuple[str, str, str], list[Interaction]] = {}
    for it in rows:
        if it.session_id and it.source == SESSION_SOURCE and it.is_task:
            sessions.setdefault((it.project, it.client or "", it.session_id), []).append(it)
    replaced: dict[str, Interaction | None] = {}
    for members in sessions.values():
        if len(members) < 2:
            continue
        kept, steps = _chained(members)
        for it in members:
            replaced[it.id] = None
        for it in kept:
            replaced[it.id] = _merged(it, steps[it.id]) if steps[it.id] else it
    out = []
    for it in rows:
        now = replaced.get(it.id, it)  # None: merged into a kept member of its session
        if now is not None:
            out.append(now)
    return out


def last_turn(
    log: TaskLog, project: str, session_id: str, client: str | None = None
) -> Interaction | None:
    """The newest answered (not failed, not shadow) row of `session_id` in `project` (sent
    by `client`, when given), looked for newest first, a page at a time (at most
    `LOOKUP_MAX_ROWS` rows back)."""
    until: float | None = None
    looked = 0
    while looked < LOOKUP_MAX_ROWS:
        flt = LogFilter(project=project, errors=False, until=until, limit=LOOKUP_PAGE)
        page = log.query(flt)
        full = len(page) == LOOKUP_PAGE
        if full:  # rows at the page's oldest time may go on past it: read them all at once
            oldest = page[-1].created_at
            at = LogFilter(
                project=project, errors=False, since=oldest, until=math.nextafter(oldest, math.inf)
            )
            page = [it for it in page if it.created_at > oldest] + log.query(at)
            until = oldest
        for it in page:
            ours = client is None or it.client == client
            if it.session_id == session_id and it.shadow_of is None and ours:
                return it
        if not full:
            return None
        looked += len(page)
    return None


# ---- what of an agent's row is the user's task ----------------------------------------------


def is_agent_session(it: Interaction) -> bool:
    """A coding agent's row: a harvested Claude Code / Codex transcript, or a proxy row of the
    Messages / Responses wire that carries the agent's session id (an app calling those APIs
    without one keeps its system prompt: that is its task's)."""
    if it.source in AGENT_TRANSCRIPTS:
        return True
    wire = it.meta.get("wire") if isinstance(it.meta, dict) else None
    return it.source == SESSION_SOURCE and wire in AGENT_WIRES and bool(it.session_id)


def without_harness_text(text: str) -> str:
    """`text` without the blocks an agent's harness writes into a user turn."""
    return _HARNESS_TEXT.sub("", text).strip()


def _without_harness(content: Any) -> Any:
    if isinstance(content, str):
        return without_harness_text(content)
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                text = without_harness_text(part["text"])
                if text:
                    parts.append({**part, "text": text})
            else:
                parts.append(part)
        return parts
    return content


def task_turns(it: Interaction) -> list[Any]:
    """The messages of `it` that are the user's task: for an agent's row (`is_agent_session`),
    the conversation without the harness's system / developer messages and without what it
    wrote into user turns (a turn left empty is dropped); any other row's as logged. The
    injected selftaught block is stripped either way."""
    messages = strip_injected_messages(it.messages)
    if not is_agent_session(it):
        return messages
    out = []
    for msg in messages:
        if not isinstance(msg, dict) or msg.get("role") in HARNESS_ROLES:
            continue
        if msg.get("role") == "user":
            content = _without_harness(msg.get("content"))
            if not content:
                continue
            msg = {**msg, "content": content}
        out.append(msg)
    return out
