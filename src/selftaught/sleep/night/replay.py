"""Replay of real tool-using traffic: a logged interaction with `tools` becomes an episode.

A tool-using agent behind the proxy logs one row per request: the first step (the user's
request → the model calls a tool), then each step after it (the same messages plus the
assistant's call and the tool's result → the next call or the final answer). The steps of one
conversation (the same messages up to the user's request, the same tools) are folded into one
task (`conversations`), mined from its longest step:

- the **prompt** is the conversation up to and including the user's last request (earlier
  tool turns kept in the OpenAI shape), redacted again for the models that will read it;
- the **tools** are the request's `tools`, sent verbatim on every replayed turn (and its
  `tool_choice`: a forcing one on the first turn only);
- the **fixtures** are the tool results the agent really received: each logged call (name
  and arguments) and the tool turn that answered it. In the replay the same call (same name,
  arguments equal as JSON: key order and `1` vs `1.0` do not matter, list order does)
  returns the recorded result (a call made twice with different results returns them in
  order); any other call returns `error: not recorded: ...`, which counts against the
  episode like any failed call (`selftaught.tasks.episode.TOOL_ERROR_PENALTY`);
- the **checks**: the final answer against the reference (logged, or corrected by feedback)
  or the rules / rubric, as for any mined task (`selftaught.sleep.night.checks`); and, where
  the user corrected a tool call, the episode's calls against the corrected ones.

A corrected tool call travels in the feedback's `reference`, as JSON (an object, or a string
holding one), for an interaction that has tools:

    {"name": "calculator", "arguments": {"expression": "48213 * 7719"}}
    {"type": "function", "function": {"name": "calculator", "arguments": "{...}"}}
    {"tool_calls": [call, ...], "answer": "372156147"}

Each corrected call must be among the episode's calls (name and arguments as JSON, as above).
A call may carry `"result"`: then it is also a fixture. Without one, making the corrected call
returns a `not recorded` note that does not count against the episode (the deployed agent never
made it, so nothing was logged). `answer` is the corrected final answer (a reference as usual).
Any other reference is the final answer's, as for a plain interaction.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from selftaught.errors import TaskError
from selftaught.models.base import Message
from selftaught.redact import redact_for_model
from selftaught.sleep.adoption.inject import strip_injected_messages
from selftaught.sleep.intake.log import Interaction
from selftaught.sleep.intake.sessions import task_turns
from selftaught.sleep.intake.threads import (
    ToolFeedback,
    arguments_value,
    call_key,
    call_parts,
    logged_tool_calls,
    logged_tools,
    message_text,
    tool_feedback,
)
from selftaught.sleep.night.checks import score_example
from selftaught.sleep.night.mine import (
    MineConfig,
    MinedTask,
    new_task,
    row_label,
    task_checks,
)
from selftaught.sleep.night.split import NightTask
from selftaught.sleep.night.trust import (
    Label,
    Trust,
    field_trust,
    logged_trust,
)
from selftaught.sleep.records import TaskChecks
from selftaught.tasks.base import Example, Score
from selftaught.tasks.episode import (
    DEFAULT_MAX_TURNS,
    Environment,
    Episode,
    Tool,
    ToolError,
    finish_score,
    run_tool_calls,
    with_ids,
)
from selftaught.tasks.scorers import LlmJudge

NOT_RECORDED = "not recorded"
SHOWN_CALLS = 5  # recorded calls named in a "not recorded" result


# ---- calls compared as JSON (`threads.call_key`) -----------------------------------------


def show_call(name: str, arguments: Any) -> str:
    text = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
    return f"{name}({text if len(text) <= 200 else text[:197] + '...'})"


# ---- what the log holds ------------------------------------------------------------------


def logged_tool_choice(it: Interaction) -> Any:
    if it.tool_choice is not None:
        return it.tool_choice
    request = it.meta.get("request") if isinstance(it.meta, dict) else None
    return request.get("tool_choice") if isinstance(request, dict) else None


def _last_user(messages: Sequence[Any]) -> int:
    return max(
        (i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
        default=-1,
    )


def _conversation_key(it: Interaction) -> str | None:
    tools = logged_tools(it)
    if tools is None or not it.is_task:
        return None
    messages = task_turns(it)
    head = messages[: _last_user(messages) + 1]
    return json.dumps([it.project, head, tools], sort_keys=True, ensure_ascii=False, default=str)


def conversations(interactions: list[Interaction]) -> list[list[Interaction]]:
    """The interactions grouped by conversation: the steps of one tool-using request (the same
    messages up to the user's request, the same tools) together, the longest step first (then
    the newest); every other interaction alone. Order follows each group's first member."""
    groups: dict[str, list[Interaction]] = {}
    out: list[list[Interaction]] = []
    for it in interactions:
        key = _conversation_key(it)
        if key is None:
            out.append([it])
        elif key in groups:
            groups[key].append(it)
        else:
            groups[key] = [it]
            out.append(groups[key])
    for group in out:
        group.sort(key=lambda i: (len(i.messages), i.reply is not None, i.created_at), reverse=True)
    return out


# ---- feedback that corrects a tool call ----------------------------------------------------


# ---- mining ---------------------------------------------------------------------------------


def _redact_call(call: dict[str, Any], turn: int, k: int) -> dict[str, Any]:
    name, args = call_parts(call) or ("?", {})
    raw = (call.get("function") or {}).get("arguments")
    text = raw if isinstance(raw, str) else json.dumps(args, ensure_ascii=False)
    return {
        "id": str(call.get("id") or f"call_{turn}_{k}"),
        "type": "function",
        "function": {"name": name, "arguments": redact_for_model(text)},
    }


def redact_turns(messages: list[Message]) -> list[Message] | None:
    """The messages as replayable text, each content redacted, tool calls and tool-call ids
    kept (a call without an id gets one, its tool turn the same); None for non-text content."""
    out: list[Message] = []
    pending: deque[str] = deque()  # ids of calls not yet answered, for tool turns without one
    for turn, msg in enumerate(strip_injected_messages(messages)):
        text = message_text(msg.get("content"))
        if text is None:
            return None
        role = str(msg.get("role", "user"))
        new: Message = {"role": role, "content": redact_for_model(text)}
        calls = [c for c in msg.get("tool_calls") or [] if isinstance(c, dict)]
        if role == "assistant" and calls:
            new["tool_calls"] = [_redact_call(c, turn, k) for k, c in enumerate(calls)]
            pending = deque(c["id"] for c in new["tool_calls"])
        if role == "tool":
            call_id = msg.get("tool_call_id") or (pending[0] if pending else None)
            if call_id is not None:
                new["tool_call_id"] = str(call_id)
                if call_id in pending:
                    pending.remove(call_id)
        out.append(new)
    return out


def fixtures_from(messages: list[Message]) -> list[dict[str, Any]]:
    """Each logged call answered by a tool turn: {"name", "arguments", "result"}, in order."""
    calls: dict[str, tuple[str, Any]] = {}
    out = []
    for msg in messages:
        for call in msg.get("tool_calls") or []:
            parts = call_parts(call)
            if parts is not None and call.get("id"):
                calls[str(call["id"])] = parts
        if msg.get("role") == "tool" and msg.get("tool_call_id") in calls:
            name, args = calls[msg["tool_call_id"]]
            out.append({"name": name, "arguments": args, "result": str(msg.get("content") or "")})
    return out


def _merged_feedback(
    group: list[Interaction], judge: bool
) -> tuple[ToolFeedback, Label | None, Trust | None]:
    """The corrected calls of every step (in order, without repeats; only the most trusted
    givers' when givers of different trust corrected them), the answer's reference (a
    corrected answer, else the newest plain reference of any step, or its accepted answer:
    `mine.row_label`; the more trusted of the two, `trust.py`) and the trust of the corrected
    calls (None: none)."""
    by_trust: dict[Trust, list[dict[str, Any]]] = {}
    answer: Label | None = None
    plain: Label | None = None
    for it in group:
        fb = tool_feedback(it.feedback.reference)
        if fb is None:
            if plain is None:
                plain = row_label(it, judge)
            continue
        given = field_trust(it.feedback, "reference")
        calls = by_trust.setdefault(given, [])
        for call in fb.calls:
            if all(call_key(c["name"], c["arguments"]) != call_key(call["name"], call["arguments"])
                   for c in calls):  # fmt: skip
                calls.append(call)
        if answer is None and fb.answer is not None:
            answer = Label(fb.answer, given, corrected=True)
        if plain is None and it.reference is not None:
            plain = Label(it.reference, logged_trust(it))
    trusted = max((t for t, calls in by_trust.items() if calls), default=None)
    label = (
        plain if answer is None or (plain is not None and plain.trust > answer.trust) else answer
    )
    value = None if answer is None else answer.value
    return (
        ToolFeedback(by_trust.get(trusted, []) if trusted is not None else [], value),
        label,
        trusted,
    )


def mine_tool_task(
    group: list[Interaction], config: MineConfig
) -> tuple[MinedTask | None, str | None]:
    """One task from the steps of one tool-using conversation (`conversations`), longest step
    first; or (None, why it cannot be one)."""
    it = group[0]
    if not it.is_task:
        return None, it.not_task_reason
    messages = redact_turns(task_turns(it))
    if messages is None:
        return None, "holds non-text content (images, files): cannot be replayed as text"
    cut = _last_user(messages)
    prompt, after = messages[: cut + 1], messages[cut + 1 :]
    if cut < 0 or not str(prompt[-1]["content"]).strip():
        return None, "no user request to replay"
    if sum(len(str(m.get("content") or "")) for m in prompt) > config.max_prompt_chars:
        return None, f"longer than {config.max_prompt_chars} characters"
    reply: Message = {"role": "assistant", "content": redact_for_model(it.reply or "")}
    calls = logged_tool_calls(it)
    if calls:
        reply["tool_calls"] = [_redact_call(c, len(messages), k) for k, c in enumerate(calls)]
    logged = after + ([reply] if it.reply is not None or calls else [])
    corrected, label, calls_trust = _merged_feedback(group, config.judge)
    checks = task_checks(it, prompt, label, config, other_check=bool(corrected.calls))
    if isinstance(checks, str):
        return None, checks
    state, reference = checks
    if calls_trust is not None:
        state = _calls_label(state, calls_trust)
    fixtures = fixtures_from(messages)
    fixtures += [
        {"name": c["name"], "arguments": c["arguments"], "result": c["result"]}
        for c in corrected.calls
        if "result" in c
    ]
    state = state.but(
        tools=tuple(copy.deepcopy(logged_tools(it) or [])),  # the caller's: it has tools
        tool_choice=logged_tool_choice(group[-1]),  # the first step's: what the client began with
        fixtures=tuple(fixtures),
        logged=tuple(logged),
    )
    if corrected.calls:
        state = state.but(
            expected_calls=tuple(
                {"name": c["name"], "arguments": c["arguments"]} for c in corrected.calls
            )
        )
    task = new_task(it, prompt, reference, state)
    task.sources = [i.id for i in group]
    task.negative = task.negative or any(
        i.feedback.thumb == "down" or (i.feedback.score is not None and i.feedback.score < 0.5)
        for i in group
    )
    final = logged[-1] if logged else None
    task.logged_reply = final["content"] if final and not final.get("tool_calls") else None
    return task, None


def _calls_label(state: TaskChecks, trust: Trust) -> TaskChecks:
    """`state` of a task checked by corrected tool calls given with `trust` too: its label is
    the less trusted of the two, and an end user's calls make no demonstration."""
    have = state.trust
    if have is None or Trust[str(have).upper()] > trust:
        state = state.but(trust=trust.label)
    if trust < Trust.OPERATOR and state.no_demo is None:
        state = state.but(no_demo="checked by an end user's corrected tool calls")
    return state


# ---- the episode's world: the recorded results -----------------------------------------------


class ReplayEnvironment(Environment):
    """The logged tools, answered from the fixtures: the same call returns its recorded result,
    any other call `error: not recorded: ...` (a failed call)."""

    def __init__(
        self,
        tools: list[dict[str, Any]],
        fixtures: Sequence[Mapping[str, Any]] = (),
        expected: Sequence[Mapping[str, Any]] = (),
        tool_choice: Any = None,
    ):
        self.logged_tools = copy.deepcopy(list(tools))
        self.tool_choice = tool_choice if self.logged_tools else None
        self.recorded: dict[str, deque[str]] = {}
        for f in fixtures:
            self.recorded.setdefault(call_key(f["name"], f["arguments"]), deque()).append(
                str(f["result"])
            )
        self.expected = {call_key(c["name"], c["arguments"]) for c in expected}
        self.shown = [show_call(f["name"], f["arguments"]) for f in fixtures][:SHOWN_CALLS]
        self.validators: dict[str, Any] = {}
        tools_out = []
        for schema in self.logged_tools:
            fn = schema.get("function") if isinstance(schema, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                continue  # a hosted tool (web search...): sent as logged, never called here
            name = fn["name"]
            self.validators[name] = _validator(fn.get("parameters"))
            tools_out.append(
                Tool(
                    name=name,
                    description=str(fn.get("description") or ""),
                    parameters={},  # checked in `answer`, after a recorded call is found
                    fn=self._caller(name),
                )
            )
        self.tools = tuple(tools_out)

    def _caller(self, name: str) -> Any:
        def call(**arguments: Any) -> str:
            return self.answer(name, arguments)

        return call

    def schemas(self) -> list[dict[str, Any]]:
        """Exactly the logged tools (extra fields such as `strict` kept)."""
        return copy.deepcopy(self.logged_tools)

    def answer(self, name: str, arguments: dict[str, Any]) -> str:
        key = call_key(name, arguments)
        results = self.recorded.get(key)
        if results:
            return results.popleft() if len(results) > 1 else results[0]
        validator = self.validators.get(name)
        if validator is not None:
            problem = next(iter(validator.iter_errors(arguments)), None)
            if problem is not None:
                raise ToolError(f"invalid arguments for {name}: {problem.message}")
        if key in self.expected:
            return (
                f"{NOT_RECORDED}: {show_call(name, arguments)} is the user's corrected call; the "
                "deployed agent never made it, so no result was logged"
            )
        recorded = "; ".join(self.shown) or "none"
        raise ToolError(
            f"{NOT_RECORDED}: no result was logged for {show_call(name, arguments)} "
            f"(the recorded calls: {recorded})"
        )


def _validator(parameters: Any) -> Any:
    """A validator for the logged parameters schema; None when there is none or it is not a
    valid JSON schema (the call is then not checked: the log is what it is)."""
    if not isinstance(parameters, dict) or not parameters:
        return None
    cls = jsonschema.validators.validator_for(parameters)
    try:
        cls.check_schema(parameters)
    except jsonschema.SchemaError:
        return None
    return cls(parameters)


def environment_of(example: Example) -> ReplayEnvironment:
    state = example.state
    return ReplayEnvironment(
        state.get("tools") or [],
        state.get("fixtures") or [],
        state.get("expected_calls") or [],
        state.get("tool_choice"),
    )


# ---- scoring ----------------------------------------------------------------------------------


def score_calls(episode: Episode, expected: list[dict[str, Any]]) -> Score:
    """Every corrected call among the episode's calls (name and arguments as JSON)."""
    made = {call_key(name, args) for name, args, _ in episode.calls()}
    missing = [c for c in expected if call_key(c["name"], c["arguments"]) not in made]
    if not missing:
        shown = ", ".join(show_call(c["name"], c["arguments"]) for c in expected)
        return Score(1.0, 1.0, f"made the corrected call(s): {shown}")
    soft = 1.0 - len(missing) / len(expected)
    made_shown = ", ".join(show_call(n, arguments_value(a)) for n, a, _ in episode.calls())
    want = ", ".join(show_call(c["name"], c["arguments"]) for c in missing)
    return Score(0.0, soft, f"the user's corrected call {want} was not made (made: "
                 f"{made_shown or 'no call'})")  # fmt: skip


def has_answer_check(state: Mapping[str, Any]) -> bool:
    """An example's check of the final answer (`TaskChecks.has_answer_check`, of the dict)."""
    return bool(state.get("scorer") or state.get("rubric") or state.get("rules"))


def score_replay(episode: Episode, example: Example, judge: LlmJudge | None = None) -> Score:
    """The final answer's checks and the corrected calls: hard = all passed, soft = the mean."""
    scores = []
    if has_answer_check(example.state):
        scores.append(score_example(episode.final, example, judge))
    if example.state.get("expected_calls"):
        scores.append(score_calls(episode, example.state["expected_calls"]))
    if not scores:
        raise TaskError(f"task {example.id} has no check")
    hard = float(all(s.hard for s in scores))
    soft = sum(s.soft for s in scores) / len(scores)
    return Score(hard, soft, "; ".join(s.feedback for s in scores if s.feedback))


def score_logged(example: Example, judge: LlmJudge | None = None) -> Score:
    """What the logged replies score: the logged turns played against the fixtures and scored
    as a replay would score them (a conversation logged mid-way ends with an empty answer)."""
    env = environment_of(example)
    trajectory: list[Message] = []
    failed: list[str] = []
    calls = turns = 0
    for turn in [m for m in example.state.get("logged") or [] if m.get("role") == "assistant"]:
        turns += 1
        made = with_ids(turn.get("tool_calls") or [], turns)
        trajectory.append({**turn, **({"tool_calls": made} if made else {})})
        if made:
            results, errors = run_tool_calls(env, made, turns)
            trajectory += results
            failed += errors
            calls += len(made)
    if not trajectory or trajectory[-1].get("role") != "assistant":
        turns += 1
        trajectory.append({"role": "assistant", "content": ""})
    final = str(trajectory[-1].get("content") or "")
    episode = Episode(env, trajectory, final, "answer", turns, calls, failed)
    return finish_score(score_replay(episode, example, judge), episode)


# ---- the night's task ----------------------------------------------------------------------------


class ReplayNightTask(NightTask):
    """The night's tasks when some were tool-using: every example is an episode (one without
    tools is the one-step case), in the world of its recorded results."""

    def __init__(
        self, project: str, splits: dict[str, list[MinedTask]], judge: LlmJudge | None = None
    ):
        super().__init__(project, splits, judge)
        longest = max(
            (
                sum(m.get("role") == "assistant" for m in t.state.logged)
                for ts in splits.values()
                for t in ts
            ),
            default=0,
        )
        self.max_turns = max(DEFAULT_MAX_TURNS, longest + 1)

    def environment(self, example: Example) -> ReplayEnvironment:
        return environment_of(example)

    def score_episode(self, episode: Episode, example: Example) -> Score:
        return score_replay(episode, example, self.judge)


def night_task(
    project: str, splits: dict[str, list[MinedTask]], judge: LlmJudge | None = None
) -> NightTask:
    """The night's `Task` on a chat model: a replay of episodes when any task was tool-using,
    else the plain one-reply task (nothing changes for traffic without tools). A CLI agent
    replays the tasks itself (`agent_replay.AgentNightTask`)."""
    tool_using = any(t.state.tools for ts in splits.values() for t in ts)
    return (ReplayNightTask if tool_using else NightTask)(project, splits, judge)
