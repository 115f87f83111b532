"""Codex CLI sessions: `~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl` and
`~/.codex/archived_sessions/` ($CODEX_HOME instead of ~/.codex when set).

Each line is `{"timestamp", "type", "payload"}` with `type` one of "session_meta" (id, cwd,
cli_version, git), "turn_context" (model, cwd), "response_item" (what the model saw and said:
`message` with role user / assistant / developer and `input_text` / `output_text` parts,
`function_call`, `custom_tool_call`, `reasoning`, ..., and their `*_output` results, which
the row keeps as `tool_calls` and `meta["tool_results"]`) and "event_msg" (`user_message`,
`agent_message`, `task_started` / `task_complete` with a `turn_id` and `last_agent_message`,
`token_count` with cumulative usage). Messages appear twice, as an event and as a response
item; the events are what the user typed (the response items also carry injected context
such as `<environment_context>` and AGENTS.md), so they are used when present and the
response items only for old rollouts without them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from selftaught.sleep.intake.harvest.common import (
    AgentTurn,
    HarvestConfig,
    HarvestReport,
    iter_records,
    parse_timestamp,
    project_from_cwd,
    tool_call,
    turns_to_interactions,
)
from selftaught.sleep.intake.log import Interaction

_INJECTED = (
    "<environment_context",
    "<user_instructions",
    "# AGENTS.md instructions",
    "<INSTRUCTIONS",
)
_TOOL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call", "web_search_call")
_TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


def _call(payload: dict[str, Any]) -> dict[str, Any]:
    """A response item's tool call in the OpenAI shape: `arguments` of a function call, the
    `input` of a custom tool, the `action` of a shell or web search call."""
    args = payload.get("arguments")
    if args is None:
        args = payload.get("input") if "input" in payload else payload.get("action")
    call_id = payload.get("call_id") or payload.get("id")
    return tool_call(call_id, payload.get("name") or payload.get("type"), args)


def _output(output: Any) -> Any:
    """A tool output's text: Codex wraps it as JSON `{"output": ..., "metadata": ...}`."""
    if isinstance(output, str):
        try:
            inner = json.loads(output)
        except ValueError:
            return output
        if isinstance(inner, dict) and isinstance(inner.get("output"), str):
            return inner["output"]
        return output
    if isinstance(output, dict) and isinstance(output.get("content"), str):
        return output["content"]
    return output


def _exit_code(output: Any) -> int | None:
    """The exit code a legacy tool output records in its metadata (`{"output", "metadata":
    {"exit_code"}}`); newer ones say it in their text (`Process exited with code N`)."""
    if not isinstance(output, str) or not output.startswith("{"):
        return None
    try:
        inner = json.loads(output)
    except ValueError:
        return None
    meta = inner.get("metadata") if isinstance(inner, dict) else None
    code = meta.get("exit_code") if isinstance(meta, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("text")
        )
    return ""


class CodexHarvester:
    name = "codex"

    def default_root(self) -> Path:
        base = os.environ.get("CODEX_HOME")
        return Path(base).expanduser() if base else Path.home() / ".codex"

    def session_files(self, root: Path) -> list[Path]:
        files: list[Path] = []
        for sub in ("sessions", "archived_sessions"):
            folder = root / sub
            if folder.is_dir():
                files += [p for p in folder.rglob("rollout-*.jsonl") if p.is_file()]
        return files

    def read_session(
        self, path: Path, config: HarvestConfig, report: HarvestReport
    ) -> list[Interaction]:
        records = [rec for _, rec in iter_records(path, report)]
        has_events = any(
            r.get("type") == "event_msg" and (r.get("payload") or {}).get("type") == "user_message"
            for r in records
        )
        session_id = path.stem
        meta: dict[str, Any] = {"file": str(path)}  # the row's meta: JSON values
        turns: list[AgentTurn] = []
        model: str | None = None
        turn_id: str | None = None
        totals = [0, 0]  # cumulative (input, output) tokens at the end of the previous turn
        last_totals: list[int] | None = None
        for rec in records:
            kind, payload = rec.get("type"), rec.get("payload") or {}
            ts = parse_timestamp(rec.get("timestamp"), path.stat().st_mtime)
            ptype = payload.get("type")
            if kind == "session_meta":
                session_id = str(payload.get("id") or session_id)
                meta.update(
                    {k: payload[k] for k in ("cwd", "cli_version", "originator") if payload.get(k)}
                )
                branch = (payload.get("git") or {}).get("branch")
                if branch:
                    meta["git_branch"] = branch
            elif kind == "turn_context":
                model = payload.get("model") or model
                meta.setdefault("cwd", payload.get("cwd"))
            elif kind == "event_msg" and ptype == "task_started":
                turn_id = payload.get("turn_id")
            elif self._is_request(kind, payload, has_events):
                text = _text(payload.get("message") if has_events else payload.get("content"))
                if text.strip() and not text.lstrip().startswith(_INJECTED):
                    totals = self._close(turns, last_totals, totals)
                    key = turn_id or f"request{len(turns)}"
                    turns.append(AgentTurn(text.strip(), ts, key, model=model))
                    turn_id = None
            elif not turns:
                continue
            elif self._is_answer(kind, payload, has_events):
                text = _text(payload.get("message") if has_events else payload.get("content"))
                if text.strip():
                    turns[-1].reply_parts.append(text.strip())
                    turns[-1].ended_at = ts
            elif kind == "event_msg" and ptype == "task_complete":
                final = payload.get("last_agent_message")
                if isinstance(final, str) and final.strip():
                    turns[-1].reply_parts.append(final.strip())
                turns[-1].ended_at = ts
            elif kind == "event_msg" and ptype == "turn_aborted":
                turns[-1].reply_parts.clear()  # no final answer: the user stopped it
                turns[-1].extra["aborted"] = True
            elif kind == "response_item" and ptype in _TOOL_ITEMS:
                turns[-1].tools.append(str(payload.get("name") or ptype))
                turns[-1].calls.append(_call(payload))
            elif kind == "response_item" and ptype in _TOOL_OUTPUTS:
                output = payload.get("output")
                turns[-1].add_result(
                    payload.get("call_id"), _output(output), exit_code=_exit_code(output)
                )
            elif kind == "event_msg" and ptype == "token_count":
                total = ((payload.get("info") or {}).get("total_token_usage")) or {}
                if total:
                    last_totals = [
                        int(total.get("input_tokens") or 0),
                        int(total.get("output_tokens") or 0),
                    ]
            if turns and model:
                turns[-1].model = turns[-1].model or model
        self._close(turns, last_totals, totals)
        return turns_to_interactions(
            turns,
            source=self.name,
            session_id=session_id,
            project=project_from_cwd(meta.get("cwd"), config.project),
            meta=meta,
            config=config,
        )

    @staticmethod
    def _is_request(kind: Any, payload: dict[str, Any], has_events: bool) -> bool:
        if has_events:
            return kind == "event_msg" and payload.get("type") == "user_message"
        return (
            kind == "response_item"
            and payload.get("type") == "message"
            and payload.get("role") == "user"
        )

    @staticmethod
    def _is_answer(kind: Any, payload: dict[str, Any], has_events: bool) -> bool:
        if has_events:
            return kind == "event_msg" and payload.get("type") == "agent_message"
        return (
            kind == "response_item"
            and payload.get("type") == "message"
            and payload.get("role") == "assistant"
        )

    @staticmethod
    def _close(turns: list[AgentTurn], last: list[int] | None, before: list[int]) -> list[int]:
        """The turn's tokens are the growth of the cumulative count during it."""
        if not turns or last is None:
            return before
        turns[-1].prompt_tokens = max(0, last[0] - before[0])
        turns[-1].completion_tokens = max(0, last[1] - before[1])
        return list(last)
