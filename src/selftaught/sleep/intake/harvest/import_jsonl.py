"""`selftaught sleep import FILE`: interactions from a JSONL file, in one of three formats,
detected per line:

- ours (what `selftaught sleep log --export` writes): `messages`, `reply`, and optionally `id`,
  `project`, `timestamp`, `model`, `reference`, `feedback`, `tags`, `meta`, `private`, ...
- OpenAI chat: `messages`, whose final assistant turn (if any) is the reply (its `tool_calls`
  the reply's tool calls); optional `reference`, `tools` and `tool_choice` (the request's).
  Tool turns stay in the messages: assistant turns with `tool_calls`, then `role: "tool"`
  results with their `tool_call_id`; a line with `tools` is replayed as an episode whose
  fixtures are those results (`selftaught.sleep.night.replay`);
- OpenAI evals: `input` (a chat list or a string) and `ideal` (a string or a list) as the
  reference; no reply.

The whole file is parsed and checked first; a bad line raises naming file and line, and then
nothing is stored. The rows go in with one transaction. A line with an `id` keeps it, others
get a dedupe key from their content, so importing the same file twice adds nothing.

A file's requests, replies and references are data; what it says about trust is not taken as
given unless the operator vouches for the file (`trust_fields`, `sleep import --trust-fields`,
e.g. an export of their own log). Without it: `reviewed` is false, `skill_version` none, the
`source` is "import", the `client` is `import:<file name>` (one client for the night's share
cap), feedback is an end user's (untrusted, given by that client), and `meta.upstream` is
dropped (a night never takes its model from a row, `cycle.logged_upstream`); what the file
claimed is kept in `meta["import_claims"]` for the operator to read. `private` and `shadow_of`
are kept: they only hold a row back.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftaught.errors import InputError
from selftaught.runs import iter_jsonl
from selftaught.sleep.intake.log import (
    IMPORTED_CLIENT,
    TRUSTED_WORDS,
    Feedback,
    Interaction,
    TaskLog,
    parse_time,
)
from selftaught.sleep.paths import DEFAULT_PROJECT, check_project

_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
_OURS = {
    "id", "project", "source", "timestamp", "model", "messages", "reply", "latency_s",
    "prompt_tokens", "completion_tokens", "error", "error_status", "reference", "feedback",
    "tags", "meta", "skill_version", "private", "reviewed", "dedupe_key", "redactions",
    "tools", "tool_choice", "tool_calls", "shadow_of", "client", "session_id",
}  # fmt: skip


class ImportFormatError(InputError):
    """A line that is not an interaction in a known format; the message names file and line."""


@dataclass
class ImportResult:
    path: str
    read: int  # interactions in the file
    inserted: int  # new rows
    formats: dict[str, int]  # lines per detected format

    @property
    def duplicates(self) -> int:
        return self.read - self.inserted


def parse_file(
    path: str | Path, project: str | None = None, trust_fields: bool = False
) -> list[tuple[str, Interaction]]:
    """Every line of the file as (format, Interaction); raises on the first bad line.
    `trust_fields`: take the file's trust fields as given (see the module doc)."""
    path = Path(path)
    if project is not None:
        check_project(project)
    if not path.is_file():
        raise ImportFormatError(f"{path}: no such file")
    out: list[tuple[str, Interaction]] = []
    for lineno, row in iter_jsonl(path, ImportFormatError):
        where = f"{path}:{lineno}"
        try:
            fmt, it = parse_row(row, project, trust_fields)
        except (ValueError, TypeError) as err:
            raise ImportFormatError(f"{where}: {err}") from err
        if not trust_fields:
            it = _distrusted(it, f"{IMPORTED_CLIENT}{path.name}")
        elif fmt != "selftaught":  # an export of ours keeps its rows' own provenance
            it = _vouched(it)
        out.append((fmt, it))
    if not out:
        raise ImportFormatError(f"{path}: the file holds no interactions")
    return out


def parse_row(
    row: dict[str, Any], project: str | None = None, trust_fields: bool = False
) -> tuple[str, Interaction]:
    """One line as (format name, Interaction), its trust fields as the file gives them (the
    caller distrusts them: `_distrusted`); raises ValueError saying what is wrong."""
    if "reply" in row:
        fmt, it = "selftaught", _ours(row, trust_fields)
    elif "messages" in row:
        fmt, it = "openai-chat", _chat(row)
    elif "input" in row:
        fmt, it = "openai-evals", _evals(row)
    else:
        raise InputError(
            "unknown format: expected `messages` (OpenAI chat), `input` + `ideal` (OpenAI "
            "evals) or `messages` + `reply` (selftaught export)"
        )
    if project is not None:
        it.project = project
    check_project(it.project)
    if it.dedupe_key is None and "id" not in row:
        canonical = json.dumps(row, sort_keys=True, ensure_ascii=False)
        digest = hashlib.sha256(f"{it.project}\x00{canonical}".encode()).hexdigest()[:32]
        it.dedupe_key = f"import:{digest}"
    return fmt, it


def _messages(value: Any, field: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise InputError(f"`{field}` must be a non-empty list of chat messages")
    for i, msg in enumerate(value):
        if not isinstance(msg, dict) or msg.get("role") not in _ROLES:
            raise InputError(f"{field}[{i}] needs a `role` in {sorted(_ROLES)}, got {msg!r:.80}")
        content = msg.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise InputError(f"{field}[{i}].content must be a string or a list of parts")
        if msg.get("tool_calls") is not None:
            _tool_calls(msg["tool_calls"], f"{field}[{i}].tool_calls")
    return value


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]] | None:
    """Tool calls in the OpenAI shape (each names its function), or None for none."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise InputError(f"`{where}` must be a list of tool calls")
    for k, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InputError(f"`{where}[{k}]` needs a `function` with a `name`, got {call!r:.80}")
    return value


def _tools(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = row.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise InputError("`tools` must be a list of tool schemas (OpenAI shape)")
    return tools


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _chat(row: dict[str, Any]) -> Interaction:
    messages = _messages(row["messages"], "messages")
    reply, calls = None, None
    if messages[-1]["role"] == "assistant":
        last, messages = messages[-1], messages[:-1]
        reply, calls = _text(last.get("content")), _tool_calls(last.get("tool_calls"), "reply")
    if not messages:
        raise InputError("`messages` holds only the assistant's reply, no prompt")
    own = ("messages", "reference", "tools", "tool_choice")
    extra = {k: v for k, v in row.items() if k not in own}
    return Interaction(
        messages=messages,
        reply=reply,
        source="import",
        reference=row.get("reference"),
        meta=extra,
        tools=_tools(row),
        tool_choice=row.get("tool_choice"),
        tool_calls=calls,
    )


def _evals(row: dict[str, Any]) -> Interaction:
    given = row["input"]
    if isinstance(given, str):
        if not given.strip():
            raise InputError("`input` must be a non-empty string or a chat list")
        messages = [{"role": "user", "content": given}]
    else:
        messages = _messages(given, "input")
    ideal = row.get("ideal")
    if ideal is not None and not isinstance(ideal, (str, list)):
        raise InputError("`ideal` must be a string or a list of strings")
    extra = {k: v for k, v in row.items() if k not in ("input", "ideal")}
    return Interaction(messages=messages, reply=None, source="import", reference=ideal, meta=extra)


def _vouched(it: Interaction) -> Interaction:
    """`it` from a chat file the operator vouches for: its users' words are the operator's (a
    correction in a chat's next turn counts as theirs)."""
    it.meta = {**(it.meta if isinstance(it.meta, dict) else {}), TRUSTED_WORDS: True}
    return it


def _distrusted(it: Interaction, client: str) -> Interaction:
    """`it` with the trust the file claimed taken off (kept in `meta["import_claims"]`)."""
    claims = {
        "reviewed": it.reviewed or None,
        "skill_version": it.skill_version,
        "client": it.client,
        "source": it.source if it.source != "import" else None,
        "upstream": it.meta.pop("upstream", None) if isinstance(it.meta, dict) else None,
        TRUSTED_WORDS: it.meta.pop(TRUSTED_WORDS, None) if isinstance(it.meta, dict) else None,
    }
    it.reviewed, it.skill_version, it.client, it.source = False, None, client, "import"
    if not it.feedback.empty():
        it.feedback.giver, it.feedback.trusted = client, False
    claimed = {k: v for k, v in claims.items() if v is not None}
    if claimed:
        it.meta = {**(it.meta if isinstance(it.meta, dict) else {}), "import_claims": claimed}
    return it


def _ours(row: dict[str, Any], trust_fields: bool = False) -> Interaction:
    unknown = set(row) - _OURS
    if unknown:
        raise InputError(
            f"unknown field(s) for the selftaught format: {', '.join(sorted(unknown))}"
        )
    reply = row["reply"]
    if reply is not None and not isinstance(reply, str):
        raise InputError("`reply` must be a string or null")
    for name in ("tags",):
        if not isinstance(row.get(name, []), list):
            raise InputError(f"`{name}` must be a list")
    if not isinstance(row.get("meta", {}), dict):
        raise InputError("`meta` must be an object")
    it = Interaction(
        messages=_messages(row.get("messages"), "messages"),
        reply=reply,
        project=row.get("project") or DEFAULT_PROJECT,
        source=row.get("source") or "import",
        model=row.get("model"),
        latency_s=row.get("latency_s"),
        prompt_tokens=row.get("prompt_tokens"),
        completion_tokens=row.get("completion_tokens"),
        error=row.get("error"),
        error_status=row.get("error_status"),
        reference=row.get("reference"),
        tags=[str(t) for t in row.get("tags", [])],
        meta=row.get("meta", {}),
        skill_version=row.get("skill_version"),
        private=bool(row.get("private", False)),  # an exported private row stays private
        reviewed=bool(row.get("reviewed", False)),
        dedupe_key=row.get("dedupe_key"),
        redactions=int(row.get("redactions") or 0),
        feedback=_exported_feedback(row.get("feedback"), trust_fields),
        tools=_tools(row),
        tool_choice=row.get("tool_choice"),
        tool_calls=_tool_calls(row.get("tool_calls"), "tool_calls"),
        shadow_of=row.get("shadow_of"),
        client=row.get("client"),
        session_id=row.get("session_id"),
    )
    if row.get("id") is not None:
        it.id = str(row["id"])
    if row.get("timestamp") is not None:
        it.created_at = parse_time(row["timestamp"])
    return it


def _exported_feedback(value: Any, trust_fields: bool = False) -> Feedback:
    """An exported row's merged feedback: its user fields and when it was given; who gave it
    and whether they were trusted only with `trust_fields` (else `_distrusted` decides)."""
    given = value if isinstance(value, dict) else {}
    created_at = given.get("created_at")
    if isinstance(value, dict):
        stamped = ("created_at", "giver", "trusted", "untrusted_fields")
        value = {k: v for k, v in value.items() if k not in stamped}
    feedback = Feedback.coerce(value) or Feedback()
    if isinstance(created_at, (int, float)) and not isinstance(created_at, bool):
        feedback.created_at = float(created_at)
    if trust_fields:
        giver = given.get("giver")
        feedback.giver = str(giver) if giver is not None else None
        feedback.trusted = given.get("trusted", True) is not False
    return feedback


def import_file(
    path: str | Path, log: TaskLog, project: str | None = None, trust_fields: bool = False
) -> ImportResult:
    """Parse the whole file, then store it in one transaction (all or nothing).
    `trust_fields`: the operator vouches for the file's trust fields (module doc)."""
    parsed = parse_file(path, project, trust_fields)
    formats: dict[str, int] = {}
    for fmt, _ in parsed:
        formats[fmt] = formats.get(fmt, 0) + 1
    inserted = log.add_many(it for _, it in parsed)
    return ImportResult(str(path), len(parsed), inserted, formats)
