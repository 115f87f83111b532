"""Coding agents as models: Claude Code, Codex, or any CLI agent (`cmd:`), each call one run of
the real CLI in a fresh workspace (see `base.py`; `docs/agents-as-policy.md`)."""

from __future__ import annotations

from selftaught.models.agents.base import AgentNotInstalled, AgentOutdated, CliAgent
from selftaught.models.agents.settings import CLAUDE_CODE, CODEX, AgentSettings
from selftaught.models.errors import CALL_TIMEOUT_S, ModelSpecError, RetryPolicy

AGENT_BACKENDS = ("claude-code", "codex", "cmd")

__all__ = [
    "AGENT_BACKENDS",
    "CLAUDE_CODE",
    "CODEX",
    "AgentNotInstalled",
    "AgentOutdated",
    "AgentSettings",
    "CliAgent",
    "load_agent",
]


def load_agent(
    backend: str,
    model: str = "",
    *,
    timeout_s: float = CALL_TIMEOUT_S,
    retry: RetryPolicy | None = None,
    settings: AgentSettings | None = None,
) -> CliAgent:
    """The agent for a parsed spec: `backend` is one of AGENT_BACKENDS, `model` the model name
    (or, for cmd, the template)."""
    agent: type[CliAgent]
    if backend == "claude-code":
        from selftaught.models.agents.claude import ClaudeCodeAgent

        agent = ClaudeCodeAgent
    elif backend == "codex":
        from selftaught.models.agents.codex import CodexAgent

        agent = CodexAgent
    elif backend == "cmd":
        from selftaught.models.agents.command import CommandAgent

        agent = CommandAgent
    else:
        raise ModelSpecError(
            f"not an agent backend: {backend!r}; agents: {', '.join(AGENT_BACKENDS)}"
        )
    return agent(model, timeout_s=timeout_s, retry=retry, settings=settings)
