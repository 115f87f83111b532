"""Replay on the agent itself: a night whose target is a coding agent (`claude-code`, `codex`,
`cmd:`) validates the skill on that agent, not on a model standing in for it.

Each mined task's request is the agent's prompt. The agent runs its own tools, for real, in a
fresh workspace (empty, or a copy of $SELFTAUGHT_AGENT_WORKSPACE), with the skill being tried
written to its instruction file (CLAUDE.md, AGENTS.md) by the agent backend
(`selftaught.models.agents`): the gate compares the agent with the adopted skill against the
agent with the candidate, on the same val tasks. The recorded tool results and the logged tool
schemas are not used (they are a bare model's replay, `replay.py`): the agent brings its own
tools and its own harness prompt. Its final message is scored by the task's checks (reference,
rubric, rules) as any mined task's reply; its trajectory (tool calls with their results, the
files it changed) is kept in the rollout (`Rollout.agent`, `Rollout.trajectory`) and shown in
the night's report.

A CLI takes one prompt, so a conversation before the request (earlier requests of the
session, the agent's answers and its tool calls) is quoted in the prompt ahead of the request
(`agent_prompt`), not handed over as turns (which the agent backend would read as worked
examples).

A `cmd:` agent runs a command of the operator's, unsandboxed, on text end users wrote: its
template must pass `command_guard` (no placeholder where a shell or interpreter reads code) and
the night must be allowed to run it (`NightConfig.allow_cmd_replay`, `--allow-cmd-replay`);
Claude Code and Codex run in their own sandboxes.

A corrected tool call is not checked on an agent's run: it names the logged agent's tool and
arguments, which a fresh run has no reason to repeat word for word. A task checked by nothing
else is left out of the night (`for_agent`), a task with an answer check too keeps that one.
"""

from __future__ import annotations

from pathlib import Path

from selftaught.models.agents.base import CliAgent, content_text
from selftaught.models.base import ChatModel, Message
from selftaught.sleep.intake.threads import arguments_value, call_parts
from selftaught.sleep.night.agent_outcome import workspace_of
from selftaught.sleep.night.mine import MinedTask
from selftaught.sleep.night.replay import show_call
from selftaught.sleep.night.split import NightTask
from selftaught.tasks.base import SPLITS, Example, Score
from selftaught.tasks.check import run_check
from selftaught.tasks.sandbox import Sandbox, open_sandbox
from selftaught.tasks.scorers import LlmJudge
from selftaught.workspace import Workspace, WorkspaceSpec

CONTEXT_HEAD = "Earlier in this conversation (context only; the request to act on follows):"
REQUEST_HEAD = "The request:"
MAX_CONTEXT_TURN_CHARS = 1500  # of one earlier turn quoted in the prompt
NOT_CHECKABLE = (
    "left out (the target is an agent): checked only by a corrected tool call, which an "
    "agent's run does not repeat"
)
CALL_NOT_CHECKED = "its corrected tool call is not checked on the agent's run (its answer is)"


def is_agent(model: ChatModel) -> bool:
    """The model is a CLI agent (`claude-code`, `codex`, `cmd:`): it runs its own episode."""
    return isinstance(model, CliAgent)


def _clip(text: str, limit: int = MAX_CONTEXT_TURN_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + " […]"


def _quoted_turn(msg: Message) -> list[str]:
    """One earlier turn as lines of the quoted conversation."""
    role, text = msg.get("role"), _clip(content_text(msg.get("content")))
    if role == "user":
        return [f"User: {text}"]
    if role == "tool":
        return [f"Tool result: {text}"]
    lines = [f"Assistant: {text}"] if text else []
    for call in msg.get("tool_calls") or []:
        parts = call_parts(call)
        if parts is not None:
            lines.append(f"Assistant called {show_call(parts[0], arguments_value(parts[1]))}")
    return lines


def _messages(given: str | list[Message]) -> list[Message]:
    """A task's input as messages (a night's are its logged ones; a text is one request)."""
    return [{"role": "user", "content": given}] if isinstance(given, str) else list(given)


def agent_prompt(messages: list[Message]) -> list[Message]:
    """A task's messages as a CLI agent takes them: any system message kept (it goes to the
    instruction file; a developer message becomes one), and one user message, the last
    request, with the turns before it quoted ahead of it."""
    system = [
        {"role": "system", "content": m.get("content")}
        for m in messages
        if m.get("role") in ("system", "developer")
    ]
    turns = [m for m in messages if m.get("role") not in ("system", "developer")]
    last = max((i for i, m in enumerate(turns) if m.get("role") == "user"), default=None)
    if last is None:
        return list(messages)  # no request: the agent backend says so
    request = content_text(turns[last].get("content"))
    earlier = [line for m in turns[:last] for line in _quoted_turn(m)]
    if not earlier:
        return [*system, {"role": "user", "content": request}]
    quoted = "\n\n".join(earlier)
    prompt = f"{CONTEXT_HEAD}\n\n{quoted}\n\n{REQUEST_HEAD}\n{request}"
    return [*system, {"role": "user", "content": prompt}]


class AgentNightTask(NightTask):
    """The night's tasks replayed on a CLI agent: each example one prompt (`agent_prompt`), no
    tools or fixtures offered (the agent runs its own), scored on the agent's final message by
    the task's checks. A workspace task (`agent_outcome.py`: the agent's own test run) gives
    the agent a fresh copy of its start folder and is scored by its check on the files the
    agent left, in the sandbox."""

    def __init__(
        self, project: str, splits: dict[str, list[MinedTask]], judge: LlmJudge | None = None
    ):
        super().__init__(project, splits, judge)
        self._sandbox: Sandbox | None = None
        self._examples = {
            s: [
                Example(ex.id, agent_prompt(_messages(ex.input)), ex.reference, ex.state)
                for ex in self._examples[s]
            ]
            for s in SPLITS
        }

    def workspace_for(self, example: Example) -> WorkspaceSpec | None:
        ws = workspace_of(example.state)
        return None if ws is None else WorkspaceSpec(ws[0])

    def score_workspace(self, output: str, example: Example, workspace: Path) -> Score:
        """The check on the files the agent left (a task without one: its answer's checks)."""
        ws = workspace_of(example.state)
        if ws is None:
            return self.score(output, example)
        if self._sandbox is None:
            self._sandbox = open_sandbox()  # bubblewrap, never the unsafe mode: logged text
        return run_check(self._sandbox, ws[1], workspace)

    def score(self, output: str, example: Example) -> Score:
        """A workspace task's check on an untouched copy (a reply alone changes no files)."""
        ws = workspace_of(example.state)
        if ws is None:
            return super().score(output, example)
        workspace = Workspace.create(ws[0])
        try:
            return self.score_workspace(output, example, workspace.path)
        finally:
            workspace.remove()


def for_agent(tasks: list[MinedTask]) -> tuple[list[MinedTask], list[MinedTask]]:
    """(the tasks an agent's run can be checked on, those it cannot: checked only by a
    corrected tool call). A kept task with a corrected call says it is not checked."""
    kept, left = [], []
    for task in tasks:
        if not task.state.expected_calls:
            kept.append(task)
        elif task.state.has_answer_check:
            if CALL_NOT_CHECKED not in task.notes:
                task.notes.append(CALL_NOT_CHECKED)
            kept.append(task)
        else:
            left.append(task)
    return kept, left
