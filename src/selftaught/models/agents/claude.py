"""Claude Code as the model: `claude -p --output-format stream-json --verbose`, the prompt on
stdin, the skill in the workspace's `CLAUDE.md`.

Why CLAUDE.md and not `.claude/skills/<name>/SKILL.md`: Claude Code puts CLAUDE.md in every
request, as a system prompt is in every chat request; a SKILL.md shows only its name and
description until the model chooses to open it, so whether the skill was read at all would
depend on the model, and the optimizer would be scoring that choice instead of the skill.

stream-json rather than json: the final `result` event is the same object `--output-format
json` prints (the reply in `.result`), and the events before it are the tool calls and their
results, which become the trajectory."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from selftaught.models.agents.base import (
    AgentBrief,
    AgentRun,
    CliAgent,
    TrajectoryBuilder,
    content_text,
    copy_user_file,
    json_events,
    status_error,
)
from selftaught.models.agents.login import Login, claude_login
from selftaught.models.agents.process import ProcessResult
from selftaught.models.agents.settings import CLAUDE_CODE
from selftaught.models.errors import FatalBackendError, TransientBackendError

# Set unless the user set them: no telemetry or update checks, and few retries of its own
# (a failed request comes back soon, to be retried by our policy in a clean workspace).
CLAUDE_DEFAULTS = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_MAX_RETRIES": "2",
}


# Claude Code's sandbox for its Bash tool (Linux: bubblewrap and socat): the commands it runs
# write only in the workspace and reach no network; a missing sandbox fails the run instead of
# running unsandboxed. Its file tools (Edit, Write) stay in the workspace by its permissions.
CLAUDE_SANDBOX = {
    "sandbox": {
        "enabled": True,
        "failIfUnavailable": True,
        "autoAllowBashIfSandboxed": True,
        "allowUnsandboxedCommands": False,
    }
}


def user_claude_config() -> Path:
    return Path(os.environ.get("CLAUDE_CONFIG_DIR") or Path.home() / ".claude")


class ClaudeCodeAgent(CliAgent):
    kind = "claude-code"
    cli = CLAUDE_CODE
    instruction_file = "CLAUDE.md"

    def command(self, brief: AgentBrief, workspace: Path) -> tuple[list[str], str | None]:
        assert self.program is not None
        argv = [
            self.program,
            "--print",
            "--output-format",
            "stream-json",
            "--verbose",
            # tools in the list run without asking; any other is refused, never prompted for
            "--permission-mode",
            "dontAsk",
            "--allowedTools",
            self.settings.claude_tools,
            "--no-session-persistence",
        ]
        if self.settings.claude_sandbox:
            argv += ["--settings", json.dumps(CLAUDE_SANDBOX)]
        if self.model:
            argv += ["--model", self.model]
        return argv, brief.prompt  # on stdin: no argv length limit, no '-' parsed as a flag

    def home_env(self, home: Path, env: Mapping[str, str]) -> dict[str, str]:
        config = self.login_dir(home)
        config.mkdir(exist_ok=True)
        copy_user_file(user_claude_config() / "settings.json", config / "settings.json")
        out = {k: v for k, v in CLAUDE_DEFAULTS.items() if k not in env}
        out["CLAUDE_CONFIG_DIR"] = str(config)
        # its own temporary folder: Claude Code keeps its sandbox's settings file in
        # $TMPDIR/claude-<uid>/ under a name shared by every run, and a run that ends deletes
        # it under the others (measured: 1-2 of 12 concurrent runs' Bash calls failed with
        # "bwrap: Can't find source path /tmp/claude-0/claude-settings-....json")
        tmp = home / "tmp"
        tmp.mkdir(exist_ok=True)
        out["TMPDIR"] = str(tmp)
        return out

    def user_login(self) -> Login:
        return claude_login(user_claude_config())

    def login_dir(self, home: Path) -> Path:
        return home / ".claude"

    def parse(self, result: ProcessResult) -> AgentRun:
        events = json_events(result.lines)
        final = next((e for e in reversed(events) if e.get("type") == "result"), None)
        if final is None:
            said = result.stderr_tail() or "no output"
            if result.returncode not in (0, None):
                raise FatalBackendError(
                    self.backend, f"Claude Code exited with status {result.returncode}: {said}"
                )
            raise TransientBackendError(self.backend, f"Claude Code gave no result ({said})")
        if final.get("is_error") and not str(final.get("subtype", "")).startswith("error_max"):
            errors = "; ".join(str(e) for e in final.get("errors") or [])
            words = str(final.get("result") or errors or final.get("subtype") or "unknown error")
            if final.get("startup_failure_reason"):  # it refused to start: retrying will not help
                raise FatalBackendError(self.backend, f"Claude Code did not start: {words}")
            raise status_error(self.backend, final.get("api_error_status"), words)
        return _run(events, final)


def _run(events: list[dict[str, Any]], final: dict[str, Any]) -> AgentRun:
    steps = TrajectoryBuilder()
    for event in events:
        if event.get("parent_tool_use_id"):  # a subagent's own steps: its result is enough
            continue
        message = event.get("message")
        if not isinstance(message, dict):  # a system event's words (a denied tool), no turn
            continue
        blocks = message.get("content")
        blocks = blocks if isinstance(blocks, list) else []
        for block in blocks:
            kind = block.get("type")
            if event.get("type") == "assistant" and kind == "text":
                steps.say(str(block.get("text", "")))
            elif event.get("type") == "assistant" and kind == "tool_use":
                steps.call(
                    str(block.get("id", "")),
                    str(block.get("name", "")),
                    json.dumps(block.get("input", {}), ensure_ascii=False),
                )
            elif event.get("type") == "user" and kind == "tool_result":
                steps.result(
                    str(block.get("tool_use_id", "")),
                    content_text(block.get("content")),
                    error=bool(block.get("is_error")),
                )
    capped = str(final.get("subtype", "")).startswith("error_max")
    text = str(final.get("result") or "")
    usage = final.get("usage") or {}
    prompt = sum(
        int(usage.get(k) or 0)
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    info: dict[str, Any] = {
        k: final[k]
        for k in ("session_id", "num_turns", "total_cost_usd", "duration_ms")
        if k in final
    }
    if final.get("permission_denials"):
        info["permission_denials"] = len(final["permission_denials"])
    if capped:
        info["stopped"] = final.get("subtype")
    return AgentRun(
        text=text,
        trajectory=steps.finish(text),
        prompt_tokens=prompt,
        completion_tokens=int(usage.get("output_tokens") or 0),
        finish_reason="length" if capped else "stop",
        tool_errors=steps.tool_errors,
        info=info,
    )
