"""Codex as the model: `codex exec --json -`, the prompt on stdin, the skill in the
workspace's `AGENTS.md`; the answer is the last `agent_message` item.

Codex reads its provider (base URL, wire API, the variable holding the key) from
`$CODEX_HOME/config.toml` (default `~/.codex`); each run gets a copy of that file in its own
CODEX_HOME and nothing else of it (no login, no history, no global AGENTS.md)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from selftaught.models.agents.base import (
    AgentBrief,
    AgentRun,
    CliAgent,
    TrajectoryBuilder,
    copy_user_file,
    json_events,
    status_error,
)
from selftaught.models.agents.login import Login, codex_login
from selftaught.models.agents.process import ProcessResult
from selftaught.models.agents.settings import CODEX
from selftaught.models.errors import FatalBackendError, TransientBackendError

_STATUS = re.compile(r"(?:status|HTTP)[:\s]+(\d{3})\b", re.I)
_ENV_KEY = re.compile(r"""^\s*env_key\s*=\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""", re.M)
FATAL_STATUSES = (401, 403, 404)  # Codex retries even these: stop it at the first


def user_codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")


_RECONNECTING = re.compile(r"^Reconnecting\.\.\. \d+/\d+ \((.*)\)$", re.S)


def status_of(message: str) -> int | None:
    m = _STATUS.search(message)
    return int(m.group(1)) if m else None


class CodexAgent(CliAgent):
    kind = "codex"
    cli = CODEX
    instruction_file = "AGENTS.md"

    def command(self, brief: AgentBrief, workspace: Path) -> tuple[list[str], str | None]:
        assert self.program is not None
        argv = [
            self.program,
            "exec",
            "--skip-git-repo-check",
            "--json",
            "--color",
            "never",
            "--sandbox",
            self.settings.codex_sandbox,
            "-c",
            'approval_policy="never"',
        ]
        if self.model:
            argv += ["--model", self.model]
        return [*argv, "-"], brief.prompt  # '-': the prompt is read from stdin

    def home_env(self, home: Path, env: Mapping[str, str]) -> dict[str, str]:
        codex_home = self.login_dir(home)
        codex_home.mkdir(exist_ok=True)
        copy_user_file(user_codex_home() / "config.toml", codex_home / "config.toml")
        return {"CODEX_HOME": str(codex_home)}

    def user_login(self) -> Login:
        return codex_login(user_codex_home())

    def login_dir(self, home: Path) -> Path:
        return home / ".codex"

    def secret_names(self, home: Path) -> tuple[str, ...]:
        config = user_codex_home() / "config.toml"
        try:
            return tuple(_ENV_KEY.findall(config.read_text(encoding="utf-8")))
        except OSError:
            return ()

    def watch(self, line: str) -> str | None:
        if '"error"' not in line:
            return None
        event = next(iter(json_events([line])), {})
        message = str(event.get("message", "")) if event.get("type") == "error" else ""
        if status_of(message) not in FATAL_STATUSES:
            return None
        retrying = _RECONNECTING.match(message)  # "Reconnecting... 1/5 (the error)"
        return retrying.group(1) if retrying else message

    def parse(self, result: ProcessResult) -> AgentRun:
        if result.stopped is not None:
            raise status_error(self.backend, status_of(result.stopped), result.stopped)
        events = json_events(result.lines)
        failed = next((e for e in reversed(events) if e.get("type") == "turn.failed"), None)
        if failed is not None:
            words = str((failed.get("error") or {}).get("message") or "the turn failed")
            raise status_error(self.backend, status_of(words), words)
        messages = [i for i in _items(events) if i.get("type") == "agent_message" and i.get("text")]
        if not messages:
            errors = [str(e.get("message")) for e in events if e.get("type") == "error"]
            said = errors[-1] if errors else result.stderr_tail() or "no output"
            if result.returncode not in (0, None):
                raise FatalBackendError(
                    self.backend, f"Codex exited with status {result.returncode}: {said}"
                )
            raise TransientBackendError(self.backend, f"Codex gave no answer ({said})")
        return _run(events, str(messages[-1]["text"]))


def _items(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        e["item"]
        for e in events
        if e.get("type") == "item.completed" and isinstance(e.get("item"), dict)
    ]


def _run(events: list[dict[str, Any]], answer: str) -> AgentRun:
    steps = TrajectoryBuilder()
    warnings = []
    items = _items(events)
    for n, item in enumerate(items):
        kind, call_id = item.get("type"), str(item.get("id") or f"item_{n}")
        if kind == "agent_message" and item is not items[-1]:
            steps.say(str(item.get("text", "")))
        elif kind == "command_execution":
            steps.call(call_id, "exec_command", json.dumps({"command": item.get("command")}))
            code = item.get("exit_code")
            output = str(item.get("aggregated_output") or "")
            steps.result(
                call_id,
                output + (f"\n[exit code {code}]" if code not in (0, None) else ""),
                error=code not in (0, None) or item.get("status") == "failed",
            )
        elif kind == "file_change":
            steps.call(call_id, "apply_patch", json.dumps({"changes": item.get("changes")}))
            steps.result(call_id, str(item.get("status", "")), error=item.get("status") == "failed")
        elif kind == "mcp_tool_call":
            name = f"{item.get('server')}.{item.get('tool')}"
            steps.call(call_id, name, json.dumps(item.get("arguments")))
            steps.result(
                call_id,
                json.dumps(item.get("result") or item.get("error")),
                error=item.get("status") == "failed",
            )
        elif kind == "web_search":
            steps.call(call_id, "web_search", json.dumps({"query": item.get("query")}))
            steps.result(call_id, "")
        elif kind == "error":
            warnings.append(str(item.get("message", "")))
    usage: dict[str, Any] = {}
    for e in events:
        if e.get("type") == "turn.completed":
            usage = e.get("usage") or {}
    info: dict[str, Any] = {}
    thread = next((e.get("thread_id") for e in events if e.get("type") == "thread.started"), None)
    if thread:
        info["session_id"] = thread
    if warnings:
        info["warnings"] = warnings[:5]
    return AgentRun(
        text=answer,
        trajectory=steps.finish(answer),
        prompt_tokens=int(usage.get("input_tokens") or 0),
        completion_tokens=int(usage.get("output_tokens") or 0),
        tool_errors=steps.tool_errors,
        info=info,
    )
