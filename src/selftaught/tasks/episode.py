"""The episode protocol: what an agent practises when it has tools.

An episode starts from an example: the prompt messages (the policy's, as for any task), the
OpenAI `tools` schema of a fresh `Environment` the task builds for that example, and the
environment's state. Then it steps: the model's reply carries `tool_calls` → each call runs
against the environment → the results go back as `{"role": "tool"}` turns → the model answers
again, until a reply with no tool calls (the final answer), the turn cap or the token cap.
Last, the task scores the whole episode (`score_episode`) with feedback, as any task does.

A task without `environment` is the one-step case: one reply, scored by `score(output, ...)`;
`selftaught.rollout` runs both through one loop (the one-step case takes the plain path).

Who is to blame when a call fails:

- the *model* (it named a tool that does not exist, its arguments are not JSON or do not match
  the tool's schema, or the tool refused them by raising `ToolError`): the model sees an
  `error: ...` tool result and may recover; the failed call counts against the episode
  (`Episode.tool_errors`, named in the feedback, and each costs `TOOL_ERROR_PENALTY` of the
  soft score);
- the same for a call the backend could not parse (`Completion.tool_call_errors`: a block that
  is not JSON, an unknown name, a call cut by max_tokens): the turn keeps the reply as written,
  each malformed call is answered with an `error: malformed tool call: ...` tool result, and
  it counts as a failed call; it is never taken for the final answer (`answer_malformed`);
- the *tool* (it raised anything else): the episode ends with an error (error_source "tool"),
  never a score, exactly as a crashed scorer.

Tools run in this process, in a worker thread. A tool that executes model-chosen code must
run that code through `selftaught.tasks.sandbox` (bubblewrap: no network, no files, limits);
the bundled tool tasks (`tool:calculator`, `tool:kvstore`) execute no code: the calculator
evaluates arithmetic on a parsed `ast`, the key-value store is a dict.

How this maps onto TRL's `GRPOTrainer(environment_factory=...)` (trl 1.16): the factory is
`lambda: task.environment(example)` (TRL's `reset(**example)` is our `environment(example)`),
each `Tool` is one public method of TRL's environment (our explicit JSON schema instead of one
read from type hints and docstrings), and `score_episode` is its `get_reward`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeGuard, runtime_checkable

import jsonschema

from selftaught.errors import InputError, RunError
from selftaught.models.base import Message, ToolCall
from selftaught.tasks.base import Example, Score, Task

StopReason = Literal["answer", "length", "turn_cap", "token_cap"]
TOOL_ERROR_PENALTY = 0.25
"""Soft score lost per failed tool call (unknown tool, bad arguments, refused input)."""
DEFAULT_MAX_TURNS = 8
RESULT_CHARS = 4000  # a tool result longer than this is cut (the model's context is small)


class ToolError(InputError):
    """Raised by a tool that refuses the model's input (bad value, forbidden expression): the
    message becomes the call's result and the call counts as failed. Anything else a tool
    raises is a crash of the tool: an error of the episode."""


class ToolCrash(RunError):
    """A tool raised something other than `ToolError` (a bug): the episode is an error."""


@dataclass(frozen=True)
class Tool:
    """One function the model may call: its OpenAI schema and the Python that answers."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments object (checked before `fn` runs)."""
    fn: Callable[..., Any]

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


class Environment:
    """One episode's world: its tools and their state. A tool task builds a fresh one per
    episode, so episodes never share state. Subclasses set `tools` in `__init__`."""

    tools: Sequence[Tool] = ()

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools]

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)


@dataclass
class Episode:
    """What happened in one episode, handed to `score_episode`."""

    environment: Environment
    trajectory: list[Message]
    """Everything after the prompt: assistant turns (with their tool_calls) and tool turns."""
    final: str
    """The final answer: the text of the last assistant reply."""
    stop: StopReason
    turns: int
    tool_calls: int = 0
    tool_errors: list[str] = field(default_factory=list)

    def calls(self) -> list[tuple[str, str, str]]:
        """(tool name, arguments as sent, result) of each call, in order."""
        results = {
            m.get("tool_call_id"): str(m.get("content", ""))
            for m in self.trajectory
            if m.get("role") == "tool"
        }
        out = []
        for m in self.trajectory:
            for call in m.get("tool_calls") or []:
                fn = call.get("function") or {}
                out.append(
                    (str(fn.get("name")), str(fn.get("arguments")), results.get(call.get("id"), ""))
                )
        return out


@runtime_checkable
class ToolTask(Task, Protocol):
    """A task whose examples are episodes: `environment(example)` builds the episode's world
    (tools and state), `score_episode` scores the whole episode."""

    max_turns: int

    def environment(self, example: Example) -> Environment: ...

    def score_episode(self, episode: Episode, example: Example) -> Score: ...


def is_tool_task(task: Task) -> TypeGuard[ToolTask]:
    return callable(getattr(task, "environment", None))


def _parse_arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if not isinstance(raw, str):
        raise ToolError(f"arguments must be a JSON object, got {type(raw).__name__}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ToolError(f"arguments are not valid JSON ({err.msg}): {raw[:200]!r}") from None
    if not isinstance(value, dict):
        raise ToolError(f"arguments must be a JSON object, got {raw[:200]!r}")
    return value


def _result_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) > RESULT_CHARS:
        text = text[:RESULT_CHARS] + f"... [cut at {RESULT_CHARS} characters]"
    return text


def call_tool(env: Environment, call: ToolCall) -> tuple[str, str | None]:
    """(result, None) for a call that ran, or (error result, why) for one the model got
    wrong. Raises `ToolCrash` when the tool itself failed."""
    fn = call.get("function") or {}
    name = str(fn.get("name") or "")
    tool = env.tool(name)
    try:
        if tool is None:
            offered = ", ".join(t.name for t in env.tools) or "none"
            raise ToolError(f"unknown tool {name!r}; the tools are: {offered}")
        args = _parse_arguments(fn.get("arguments"))
        try:
            jsonschema.validate(args, tool.parameters)
        except jsonschema.ValidationError as err:
            raise ToolError(f"invalid arguments for {name}: {err.message}") from None
        try:
            return _result_text(tool.fn(**args)), None
        except ToolError:
            raise
        except Exception as err:  # a bug of the tool, not the model's doing
            shown = json.dumps(args)[:200]
            raise ToolCrash(f"tool {name}({shown}) crashed: {type(err).__name__}: {err}") from err
    except ToolError as err:
        return f"error: {err}", f"{name or '?'}: {err}"


def run_tool_calls(
    env: Environment, calls: Sequence[ToolCall], turn: int
) -> tuple[list[Message], list[str]]:
    """One environment step: the tool turns answering an assistant turn's calls (in order),
    and why each failed call failed. Calls without an id get one (`call_<turn>_<k>`)."""
    messages: list[Message] = []
    errors: list[str] = []
    for k, call in enumerate(calls):
        result, why = call_tool(env, call)
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call.get("id") or f"call_{turn}_{k}",
                "content": result,
            }
        )
        if why is not None:
            errors.append(why)
    return messages, errors


def with_ids(calls: Sequence[ToolCall], turn: int) -> list[ToolCall]:
    """The calls, each with an id (a backend may leave it out): tool turns refer to it."""
    return [c if c.get("id") else {**c, "id": f"call_{turn}_{k}"} for k, c in enumerate(calls)]


MALFORMED = "malformed tool call"
_NOT_RUN = "error: not run: another call in the same reply was malformed; send the calls again"


def _problems(errors: Sequence[dict[str, Any]]) -> list[tuple[int, str]]:
    """(index, why) per malformed call; a note without raw text (the reply was cut) joins the
    call before it, so one cut call counts once."""
    out: list[tuple[int, str]] = []
    for err in errors:
        raw = str(err.get("raw") or "")
        why = str(err.get("error") or "malformed")
        if raw:
            why = f"{why} in {' '.join(raw.split())[:100]!r}"
        if not raw and out:
            out[-1] = (out[-1][0], f"{out[-1][1]}; {why}")
        else:
            out.append((int(err.get("index", len(out))), why))
    return out


def answer_malformed(
    text: str, errors: Sequence[dict[str, Any]], sent: Sequence[ToolCall] | None, turn: int
) -> tuple[Message, list[Message], list[str]]:
    """A reply whose tool calls could not be parsed (`Completion.tool_call_errors`): its
    assistant turn, the error results that answer it, and why each malformed call failed.

    Calls the backend did return in OpenAI shape (`sent`: a server's, kept in
    `extra["malformed_tool_calls"]`) stay on the turn and each gets a result (so the
    conversation stays valid for that server); none of them runs. Calls that exist only as
    text (the local model's `<tool_call>` blocks) stay in the turn's text as written, and
    each is answered by one tool result."""
    problems = _problems(errors)
    why = [f"{MALFORMED}: {p}" for _, p in problems]
    assistant: Message = {"role": "assistant", "content": text}
    if sent:
        calls = with_ids(list(sent), turn)
        assistant["tool_calls"] = calls
        by_call: dict[int, list[str]] = {}
        for index, problem in problems:
            by_call.setdefault(min(max(index, 0), len(calls) - 1), []).append(problem)
        results = [
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": f"error: {MALFORMED}: {'; '.join(by_call[k])}"
                if k in by_call
                else _NOT_RUN,
            }
            for k, call in enumerate(calls)
        ]
        return assistant, results, why
    results = [
        {"role": "tool", "tool_call_id": f"call_{turn}_{k}", "content": f"error: {w}"}
        for k, w in enumerate(why)
    ]
    return assistant, results, why


def finish_score(score: Score, episode: Episode) -> Score:
    """The task's score of an episode with what counts against it: failed tool calls cost
    soft score and are named; an episode cut by a cap says so."""
    notes = []
    soft = score.soft
    if episode.tool_errors:
        soft = max(0.0, soft - TOOL_ERROR_PENALTY * len(episode.tool_errors))
        shown = "; ".join(episode.tool_errors[:3])
        more = f" (+{len(episode.tool_errors) - 3} more)" if len(episode.tool_errors) > 3 else ""
        notes.append(f"[{len(episode.tool_errors)} failed tool call(s): {shown}{more}]")
    if episode.stop == "turn_cap":
        notes.append(f"[episode stopped at the turn cap ({episode.turns} turns), no final answer]")
    elif episode.stop == "token_cap":
        notes.append("[episode stopped at the token cap, no final answer]")
    if not notes:
        return score
    return Score(score.hard, soft, " ".join([score.feedback, *notes]).strip())
