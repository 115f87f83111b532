"""What the transcript harvesters share: the run's config and report, the harvester protocol,
and the helpers that turn a session's turns into interactions."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from selftaught.errors import ConfigError
from selftaught.sleep.intake.log import Interaction
from selftaught.sleep.paths import DEFAULT_PROJECT


@dataclass
class HarvestConfig:
    """What one harvest run reads. `since` (epoch seconds) overrides `lookback_days`."""

    since: float | None = None
    lookback_days: float = 7.0
    max_sessions: int = 50  # newest sessions first
    max_tasks: int = 500  # interactions per run, over all sessions
    project: str | None = None  # every row in this project (default: from the session's cwd)
    context_turns: int = 2  # earlier (request, answer) pairs kept before each request
    max_text_chars: int = 20_000  # longer requests / answers are cut, marked as cut

    def __post_init__(self) -> None:
        if self.max_sessions < 1 or self.max_tasks < 1:
            raise ConfigError("max_sessions and max_tasks must be at least 1")
        if self.lookback_days <= 0:
            raise ConfigError("lookback_days must be positive")
        if self.context_turns < 0:
            raise ConfigError("context_turns must be >= 0")

    def cutoff(self) -> float:
        return self.since if self.since is not None else time.time() - self.lookback_days * 86400


@dataclass
class HarvestReport:
    source: str
    root: str
    sessions_read: int = 0
    sessions_too_old: int = 0
    found: int = 0  # interactions found in the window
    inserted: int = 0  # new rows (the rest were harvested before)
    capped: str | None = None  # which cap stopped the run, if one did
    malformed: list[str] = field(default_factory=list)  # "file:line: why"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Harvester(Protocol):
    name: str

    def default_root(self) -> Path: ...

    def session_files(self, root: Path) -> list[Path]: ...

    def read_session(
        self, path: Path, config: HarvestConfig, report: HarvestReport
    ) -> list[Interaction]: ...


def iter_records(path: Path, report: HarvestReport) -> Iterator[tuple[int, dict[str, Any]]]:
    """JSON objects of a JSONL transcript; bad lines are skipped and reported."""
    import json

    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                report.malformed.append(f"{path}:{lineno}: {type(err).__name__}")
                continue
            if isinstance(rec, dict):
                yield lineno, rec
            else:
                report.malformed.append(f"{path}:{lineno}: not a JSON object")


_NOT_PROJECT_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def project_from_cwd(cwd: str | None, override: str | None = None) -> str:
    """The project of a session: the override, else the last folder of its cwd."""
    if override:
        return override
    name = _NOT_PROJECT_CHARS.sub("-", Path(cwd).name if cwd else "").strip(".-_")[:128]
    return name or DEFAULT_PROJECT


def parse_timestamp(value: Any, default: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) / (1000.0 if value > 1e11 else 1.0)  # epoch ms or s
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return default


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... cut: {len(text) - limit} more characters]"


RESULT_CHARS = 4000  # a tool result kept in a harvested row is cut here
RESULT_TAIL_CHARS = 1500  # of which its end: a test runner's summary line comes last


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A transcript's tool call in the OpenAI shape (arguments: a JSON string; a string that
    is not JSON is kept as `{"input": text}`)."""
    import json

    if isinstance(arguments, str):
        try:
            json.loads(arguments)
            text = arguments
        except (ValueError, RecursionError):  # nested past what Python parses: not JSON here
            text = json.dumps({"input": arguments}, ensure_ascii=False)
    else:
        text = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {
        "id": str(call_id or ""),
        "type": "function",
        "function": {"name": str(name or "?"), "arguments": text},
    }


@dataclass
class AgentTurn:
    """One user request and what the agent did until the next request."""

    prompt: str
    created_at: float
    key: str  # unique within the session
    reply_parts: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    tool_errors: int = 0
    model: str | None = None
    ended_at: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    after_tool: bool = False  # the agent's last action so far was a tool call
    calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI shape, in order
    results: list[dict[str, Any]] = field(default_factory=list)  # tool_call_id, content, is_error

    def add_result(
        self, call_id: Any, content: Any, is_error: bool = False, exit_code: int | None = None
    ) -> None:
        text = content if isinstance(content, str) else _result_text(content)
        result = {"tool_call_id": str(call_id or ""), "content": clip_middle(text, RESULT_CHARS),
                  "is_error": bool(is_error)}  # fmt: skip
        if exit_code is not None:  # recorded beside the output (Codex's legacy metadata)
            result["exit_code"] = exit_code
        self.results.append(result)


def clip_middle(text: str, limit: int, tail: int = RESULT_TAIL_CHARS) -> str:
    """`text` cut to its first `limit - tail` and last `tail` characters, marked as cut."""
    if len(text) <= limit:
        return text
    head = limit - tail
    return f"{text[:head]}\n[... cut: {len(text) - limit} characters ...]\n{text[-tail:]}"


def _result_text(content: Any) -> str:
    """A tool result's text: the text blocks of a list of blocks, else its JSON."""
    import json

    if isinstance(content, list):
        texts = [str(b.get("text", "")) for b in content if isinstance(b, dict) and "text" in b]
        if texts:
            return "\n".join(texts)
    return "" if content is None else json.dumps(content, ensure_ascii=False, default=str)


def turns_to_interactions(
    turns: list[AgentTurn],
    *,
    source: str,
    session_id: str,
    project: str,
    meta: dict[str, Any],
    config: HarvestConfig,
) -> list[Interaction]:
    """Each turn as a private interaction: the last `context_turns` (request, answer) pairs,
    then the request; the agent's final answer as the reply."""
    out: list[Interaction] = []
    history: list[dict[str, str]] = []
    for index, turn in enumerate(turns):
        reply = turn.reply_parts[-1] if turn.reply_parts else None
        prompt = clip(turn.prompt, config.max_text_chars)
        context = history[-2 * config.context_turns :] if config.context_turns else []
        tools = list(dict.fromkeys(turn.tools))
        out.append(
            Interaction(
                messages=[*context, {"role": "user", "content": prompt}],
                reply=None if reply is None else clip(reply, config.max_text_chars),
                project=project,
                source=source,
                created_at=turn.created_at,
                model=turn.model,
                latency_s=None
                if turn.ended_at is None
                else max(0.0, turn.ended_at - turn.created_at),
                prompt_tokens=turn.prompt_tokens,
                completion_tokens=turn.completion_tokens,
                tags=[source],
                meta={
                    **meta,
                    "session_id": session_id,
                    "turn": index,
                    "tools": tools,
                    "tool_errors": turn.tool_errors,
                    "answered": reply is not None,
                    **({"tool_results": turn.results} if turn.results else {}),
                    **turn.extra,
                },
                private=True,
                dedupe_key=f"{source}:{session_id}:{turn.key}",
                tool_calls=list(turn.calls) or None,
                session_id=session_id,
            )
        )
        history += [{"role": "user", "content": prompt}]
        if reply is not None:
            history.append({"role": "assistant", "content": clip(reply, config.max_text_chars)})
    return out
