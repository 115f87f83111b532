"""GRPO / GSPO on episodes through TRL's own environment support (trl 1.16:
`GRPOTrainer(environment_factory=...)`); no RL loop of ours. This module is the adapter.

How our episode protocol maps onto TRL's:

- **Environment.** TRL wants a class with `reset(**row)` and one public method per tool (it
  reads each tool's schema from the method's signature and Google docstring, and calls it with
  the parsed arguments). `environment_factories` builds one such class per set of tools the
  task's environments offer: `reset` builds a fresh `task.environment(example)` for the row's
  example, and each method runs the call through `episode.call_tool`, so the blame rule is
  ours: arguments checked against our JSON schema, a refused input answered `error: ...` and
  counted, a crashing tool recorded (that completion's reward is an error, never a score).
- **Rendering.** TRL renders prompts and tool turns with the tokenizer's chat template and
  parses replies with a response template. A model whose template has a tools section uses
  its own (TRL must know its reply format, else the run is refused with TRL's reason). One
  without (SmolLM2) gets `fallback_chat_template`: Jinja that rewrites the messages exactly
  as the local backend's fallback does (`models.tools.fallback_messages`: a `# Tools` system
  section, calls as `<tool_call>` blocks, results as `<tool_response>` blocks in a user
  turn) and then runs the model's own template, plus TRL's Hermes `<tool_call>` parser. Our
  JSON schemas replace the ones TRL derives from the methods (`chat_template_kwargs`), so a
  prompt in training is byte for byte the prompt of evaluation.
- **Reward.** `EpisodeReward` rebuilds the `Episode` from TRL's completion messages and the
  environment's record, and scores it with the task's `score_episode` and the penalties of
  `episode.finish_score` (failed calls cost soft score, caps are named).

What TRL's loop does not do as ours does: a malformed call ends its episode (its parser
falls back to text), so it is counted as a failed call in the reward and that reply is no
answer, but the model gets no error result to recover from; the turn cap is
`max_tool_calling_iterations` (our max_turns - 1) and the token cap is `max_completion_length`
over the whole episode, tool results included.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

from selftaught.models.base import Message, ToolCall
from selftaught.models.tools import RESPONSE_CLOSE, RESPONSE_OPEN, parse_tool_calls
from selftaught.models.tools import tools_system_section as _section
from selftaught.tasks.base import Example, Task
from selftaught.tasks.episode import (
    DEFAULT_MAX_TURNS,
    MALFORMED,
    Episode,
    StopReason,
    ToolCrash,
    ToolTask,
    call_tool,
    is_tool_task,
)
from selftaught.weights.config import ConfigError

SCHEMAS_KWARG = "selftaught_tool_schemas"
_PY_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}

# ---------------------------------------------------------------------- environments


class EpisodeEnvironment:
    """TRL's view of one rollout's world. Subclasses (one per tool set, made by
    `environment_factories`) add one method per tool and set `_task` / `_examples`."""

    _task: ToolTask
    _examples: dict[str, Example]

    def __init__(self) -> None:
        self.env: Any = None
        self.example: Example | None = None
        self.records: list[tuple[str, str, str | None]] = []  # (tool, result, why it failed)
        self.crash: str | None = None

    def reset(self, **row: Any) -> None:
        """A fresh world for the row's example (TRL pools instances and resets them)."""
        self.example = self._examples[str(row["example_id"])]
        self.env = self._task.environment(self.example)
        self.records, self.crash = [], None

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        call: ToolCall = {
            "id": f"call_{len(self.records)}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, default=str)},
        }
        try:
            result, why = call_tool(self.env, call)
        except ToolCrash as err:  # the tool's bug: this completion's reward is an error
            self.crash = self.crash or str(err)
            result, why = "error: the tool failed", None
        self.records.append((name, result, why))
        return result


def _tool_method(tool: Any) -> Callable[..., str]:
    """A method TRL can offer as `tool`: its signature and docstring describe the schema's
    top-level arguments (TRL derives a schema from them; the prompt shows ours instead)."""

    def method(self: EpisodeEnvironment, **arguments: Any) -> str:
        return self._call(tool.name, arguments)

    props = (tool.parameters or {}).get("properties") or {}
    required = set((tool.parameters or {}).get("required") or [])
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    doc_args = []
    for name, spec in props.items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        kind = kind[0] if isinstance(kind, list) and kind else kind
        annotations[name] = _PY_TYPES.get(kind, str) if isinstance(kind, str) else str
        default = inspect.Parameter.empty if name in required else None
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotations[name]
            )
        )
        desc = (spec.get("description") if isinstance(spec, dict) else None) or name
        doc_args.append(f"    {name}: {' '.join(str(desc).split())}")
    method.__name__ = method.__qualname__ = tool.name
    # inspect.signature reads it (so TRL sees the tool's arguments); typeshed's FunctionType
    # does not declare the attribute, and setattr with a constant name is what ruff refuses
    method.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    description = " ".join(str(tool.description or tool.name).split())
    method.__doc__ = description + ("\n\nArgs:\n" + "\n".join(doc_args) if doc_args else "")
    return method


def _tool_set_key(schemas: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(schemas, sort_keys=True).encode()).hexdigest()[:12]


def environment_factories(
    task: Task, examples: Sequence[Example]
) -> tuple[dict[str, type[EpisodeEnvironment]], dict[str, str], dict[str, dict[str, Any]]]:
    """One environment class per distinct tool set among the examples' environments; which
    class each example uses (by id); and every tool's JSON schema by name (for the prompt).
    Refuses a task whose tools have names Python methods cannot carry or that two tool sets
    define differently."""
    classes: dict[str, type[EpisodeEnvironment]] = {}
    env_of: dict[str, str] = {}
    schemas: dict[str, dict[str, Any]] = {}
    if not is_tool_task(task):
        raise ConfigError(f"task {task.name!r} has no environment: its examples are no episodes")
    by_id = {ex.id: ex for ex in examples}
    for ex in examples:
        env = task.environment(ex)
        tools = list(env.tools)
        if not tools:
            raise ConfigError(f"{ex.id}: the episode offers no tools; GRPO on episodes needs some")
        key = _tool_set_key(env.schemas())
        env_of[ex.id] = key
        for tool in tools:
            if not tool.name.isidentifier() or tool.name.startswith("_") or tool.name == "reset":
                raise ConfigError(
                    f"tool name {tool.name!r} cannot be a method of TRL's environment "
                    "(it must be a Python identifier, not start with '_', not be 'reset')"
                )
            if schemas.setdefault(tool.name, tool.schema()) != tool.schema():
                raise ConfigError(f"two environments define the tool {tool.name!r} differently")
        if key not in classes:
            attrs: dict[str, Any] = {t.name: _tool_method(t) for t in tools}
            attrs.update(_task=task, _examples=by_id)
            classes[key] = type(f"{type(env).__name__}ForTRL", (EpisodeEnvironment,), attrs)
    return classes, env_of, schemas


# ---------------------------------------------------------------------- the chat template


def _jinja_str(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid Jinja string literal


_HEAD, _, _TAIL = _section([{"__listed__": True}]).partition(json.dumps({"__listed__": True}))

_FALLBACK_PREFIX = (
    """{%- set ns = namespace(out=[], tool_run=false) -%}
{%- for m in messages -%}
  {%- if m.role == 'tool' -%}
    {%- set block = """
    + _jinja_str(RESPONSE_OPEN + "\n")
    + """ ~ (m.content or '') ~ """
    + _jinja_str("\n" + RESPONSE_CLOSE)
    + """ -%}
    {%- if ns.tool_run -%}
      {%- set ns.out = ns.out[:-1]
          + [{'role': 'user', 'content': ns.out[-1].content ~ '\\n' ~ block}] -%}
    {%- else -%}
      {%- set ns.out = ns.out + [{'role': 'user', 'content': block}] -%}
    {%- endif -%}
    {%- set ns.tool_run = true -%}
  {%- else -%}
    {%- set parts = namespace(items=[m.content] if m.content else []) -%}
    {%- if m.role == 'assistant' and m.tool_calls -%}
      {%- set calls = namespace(items=[]) -%}
      {%- for c in m.tool_calls -%}
        {%- set fn = c.function if c.function is defined else c -%}
        {%- if fn.arguments is string -%}
          {%- set payload = '{"name": ' ~ (fn.name | tojson)
              ~ ', "arguments": ' ~ fn.arguments ~ '}' -%}
        {%- else -%}
          {%- set payload = {'name': fn.name, 'arguments': fn.arguments} | tojson -%}
        {%- endif -%}
        {%- set calls.items = calls.items + ['<tool_call>\\n' ~ payload ~ '\\n</tool_call>'] -%}
      {%- endfor -%}
      {%- set parts.items = parts.items + [calls.items | join('\\n')] -%}
    {%- endif -%}
    {%- set ns.out = ns.out + [{'role': m.role, 'content': parts.items | join('\\n')}] -%}
    {%- set ns.tool_run = false -%}
  {%- endif -%}
{%- endfor -%}
{%- if tools -%}
  {%- set listed = namespace(items=[]) -%}
  {%- for t in tools -%}
    {%- set tname = t.function.name if t.function is defined else t.name -%}
    {%- if """
    + SCHEMAS_KWARG
    + " is defined and tname in "
    + SCHEMAS_KWARG
    + """ -%}
      {%- set listed.items = listed.items + ["""
    + SCHEMAS_KWARG
    + """[tname] | tojson] -%}
    {%- else -%}
      {%- set listed.items = listed.items + [t | tojson] -%}
    {%- endif -%}
  {%- endfor -%}
  {%- set section = """
    + _jinja_str(_HEAD)
    + """ ~ (listed.items | join('\\n')) ~ """
    + _jinja_str(_TAIL)
    + """ -%}
  {%- if ns.out and ns.out[0].role == 'system' -%}
    {%- set ns.out = [{'role': 'system', 'content': ns.out[0].content ~ '\\n\\n' ~ section}]
        + ns.out[1:] -%}
  {%- else -%}
    {%- set ns.out = [{'role': 'system', 'content': section}] + ns.out -%}
  {%- endif -%}
{%- endif -%}
{%- set messages = ns.out -%}
"""
)


def fallback_chat_template(model_template: str) -> str:
    """A chat template that renders tools and tool turns as the local backend's fallback does
    (see `models.tools`), then hands the rewritten messages to `model_template`."""
    return _FALLBACK_PREFIX + model_template


def trl_tokenizer(tokenizer: Any) -> Any:
    """A copy of `tokenizer` TRL can run tools with: the model's own template when it has a
    tools section (TRL then picks its reply parser), else the fallback template with TRL's
    Hermes `<tool_call>` parser (the format the fallback asks for)."""
    from selftaught.models.tools import template_supports_tools

    template = tokenizer.chat_template
    if not isinstance(template, str):
        raise ConfigError("GRPO on episodes needs a tokenizer with a chat template")
    tok = copy.deepcopy(tokenizer)
    if template_supports_tools(template):
        return tok
    from trl.chat_template_utils import _SUPPORTS_RESPONSE_TEMPLATE, qwen3_schema, qwen3_template

    tok.chat_template = fallback_chat_template(template)
    if _SUPPORTS_RESPONSE_TEMPLATE:
        tok.response_template = qwen3_template
    else:  # older transformers parse with the legacy schema
        tok.response_schema = qwen3_schema
    return tok


# ---------------------------------------------------------------------- the reward


def episode_from_completion(
    messages: Sequence[Message],
    environment: EpisodeEnvironment,
    *,
    max_iterations: int,
    truncated: bool,
) -> tuple[Episode, bool]:
    """The `Episode` TRL played (its completion messages: assistant turns with parsed
    `tool_calls`, tool turns) and whether it was truncated. Failed calls: those our
    `call_tool` refused (from the environment's record), those TRL found no tool for, and
    `<tool_call>` blocks TRL's parser could not read (left in the final text)."""
    names = [t.name for t in environment.env.tools]
    records = iter(environment.records)
    trajectory: list[Message] = []
    failed: list[str] = []
    pending: list[str] = []  # ids of the calls awaiting their tool turn
    calls = 0
    for k, m in enumerate(messages):
        if m.get("role") == "tool":
            trajectory.append(
                {
                    "role": "tool",
                    "tool_call_id": pending.pop(0) if pending else f"call_{k}",
                    "content": str(m.get("content", "")),
                }
            )
            continue
        turn: Message = {"role": "assistant", "content": str(m.get("content") or "")}
        shaped = []
        for j, call in enumerate(m.get("tool_calls") or []):
            fn = call.get("function") or {}
            name, args = str(fn.get("name")), fn.get("arguments", {})
            cid = f"call_{k}_{j}"
            shaped.append(
                {
                    "id": cid,
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
            pending.append(cid)
            calls += 1
            if name not in names:
                failed.append(f"{name}: unknown tool {name!r}")
                continue
            record = next(records, None)
            if record is not None and record[2] is not None:
                failed.append(record[2])
        if shaped:
            turn["tool_calls"] = shaped
        trajectory.append(turn)
    turns = sum(m["role"] == "assistant" for m in trajectory)
    last = trajectory[-1] if trajectory else {"role": "tool"}
    final = ""
    stop: StopReason
    if last["role"] == "assistant" and not last.get("tool_calls"):
        parsed = parse_tool_calls(last["content"], names)
        final = "" if parsed.blocks else last["content"]  # a call, even broken, is no answer
        for err in parsed.errors:
            failed.append(f"{MALFORMED}: {err['error']}")
        for call in parsed.calls:  # readable by us, not by TRL's parser: never run
            failed.append(f"{MALFORMED}: {call['function']['name']} was not run")
        calls += parsed.blocks
        stop = "length" if truncated else "answer"
    elif last["role"] == "assistant" and turns > max_iterations:
        stop = "turn_cap"
    else:
        stop = "token_cap"
    episode = Episode(environment.env, trajectory, final, stop, turns, calls, failed)
    return episode, truncated or stop in ("turn_cap", "token_cap")


def max_tool_iterations(task: Task, max_turns: int | None = None) -> int:
    """TRL's `max_tool_calling_iterations`: tool rounds after the first reply."""
    return max(0, (max_turns or getattr(task, "max_turns", None) or DEFAULT_MAX_TURNS) - 1)
