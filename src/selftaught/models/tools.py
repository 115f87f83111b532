"""Tool calls for backends that generate text: check the OpenAI `tools` schema, render tools
and past tool turns into a prompt, and parse a reply back into OpenAI-shaped `tool_calls`.

Pure functions, no model. The local backend uses them; the OpenAI-compatible backend uses
`check_tool_calls` on what a server returns, so every backend reports a malformed call the
same way.

The reply format is the Hermes / Qwen2.5 one, which chat templates with a tools section
already teach their models: each call is a JSON object in its own block,

    <tool_call>
    {"name": "add", "arguments": {"a": 1, "b": 2}}
    </tool_call>

several blocks allowed, text around them kept as the reply's content. A template without a
tools section (SmolLM2's) gets the same instructions as a system-prompt section
(`tools_system_section`), and past tool calls and results rendered as text in that format
(`fallback_messages`).

A reply with a block that is not a valid call (bad JSON, an unknown tool, arguments that are
not an object, an unterminated block, a reply cut by max_tokens) is *malformed*: it keeps its
text and finish reason, has no `tool_calls`, and lists why in `Completion.tool_call_errors`.
It is never turned into a plain answer without that trace.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from selftaught.errors import InputError
from selftaught.models.base import Completion, Message, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
TOOL_CHOICES = ("auto", "none", "required")
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_RAW_LIMIT = 500  # characters of a malformed block kept in its error


# ---------------------------------------------------------------------- schema checks


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """`tools` in the OpenAI shape (a list of {"type": "function", "function": {"name", ...}}
    with distinct names), or ValueError saying what is wrong."""
    if not isinstance(tools, list):
        raise InputError("'tools' must be a list of {'type': 'function', 'function': {...}}")
    names: list[str] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise InputError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise InputError(f"tools[{i}].function.name must be a non-empty string")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise InputError(f"tools[{i}].function.parameters must be a JSON schema object")
        if name in names:
            raise InputError(f"tools[{i}]: the tool name {name!r} appears twice")
        names.append(name)
    return tools


def tool_names(tools: list[dict[str, Any]] | None) -> list[str]:
    return [t["function"]["name"] for t in tools or []]


def check_tool_choice(tool_choice: Any, tools: list[dict[str, Any]] | None) -> None:
    """ValueError unless `tool_choice` is None, "auto", "none", "required" or
    {"type": "function", "function": {"name": <an offered tool>}}."""
    if tool_choice is None or tool_choice in TOOL_CHOICES:
        return
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if isinstance(fn, dict) and tool_choice.get("type") == "function":
        name = fn.get("name")
        if name in tool_names(tools):
            return
        raise InputError(f"tool_choice names the tool {name!r}, which 'tools' does not offer")
    raise InputError(
        "'tool_choice' must be 'auto', 'none', 'required' or "
        "{'type': 'function', 'function': {'name': ...}}"
    )


def offered_tools(
    tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None
) -> list[dict[str, Any]] | None:
    """The tools the model is shown: none for tool_choice "none" (nor is its reply parsed),
    only the named one for a named choice, else all."""
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        return [t for t in tools if t["function"]["name"] == name]
    return tools


def choice_instruction(tool_choice: str | dict[str, Any] | None) -> str | None:
    """One sentence that asks for a call when the caller requires one (a local model cannot
    be forced to call; it is told to)."""
    if tool_choice == "required":
        return "You must answer with at least one tool call."
    if isinstance(tool_choice, dict):
        return f"You must answer with a call of the tool {tool_choice['function']['name']}."
    return None


def check_tool_messages(messages: list[Message]) -> None:
    """ValueError unless every assistant `tool_calls` is a list of OpenAI-shaped calls and
    every tool turn has string content."""
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if calls is not None:
            if m.get("role") != "assistant" or not isinstance(calls, list):
                raise InputError(f"message {i}: only an assistant turn carries a tool_calls list")
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise InputError(
                        f"message {i} tool_calls[{j}] must be {{'id', 'type': 'function', "
                        "'function': {'name', 'arguments'}}"
                    )
                if not isinstance(fn.get("arguments", ""), (str, dict)):
                    raise InputError(
                        f"message {i} tool_calls[{j}].function.arguments must be a string"
                    )


# ---------------------------------------------------------------------- rendering


@functools.lru_cache(maxsize=32)
def template_supports_tools(chat_template: str | None) -> bool:
    """Whether a Jinja chat template reads the `tools` variable (Qwen2.5's, Hermes', Llama
    3.1's do; SmolLM2's does not and would drop the tools without a word)."""
    if not chat_template:
        return False
    import jinja2
    from jinja2 import meta

    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(chat_template)
    except jinja2.TemplateSyntaxError:  # e.g. transformers' own {% generation %} tag
        return re.search(r"\btools\b", chat_template) is not None
    return "tools" in meta.find_undeclared_variables(ast)


def tools_system_section(tools: list[dict[str, Any]], instruction: str | None = None) -> str:
    """The fallback's system-prompt section: the tools as JSON schema and the call format."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    lines = [
        "# Tools",
        "",
        "You may call one or more functions to assist with the user query.",
        "",
        "You are provided with function signatures within <tools></tools> XML tags:",
        f"<tools>\n{listed}\n</tools>",
        "",
        "For each function call, return a json object with function name and arguments within "
        f"{OPEN}{CLOSE} XML tags:",
        f'{OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE}',
    ]
    if instruction:
        lines += ["", instruction]
    return "\n".join(lines)


def arguments_object(arguments: Any) -> Any:
    """A call's arguments as the object a template renders (JSON strings decoded; a string
    that is not a JSON object is kept as it is)."""
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError:
            return arguments
        return decoded if isinstance(decoded, dict) else arguments
    return arguments


def tool_calls_text(calls: list[ToolCall]) -> str:
    """Past calls in the reply format, one block each."""
    blocks = []
    for call in calls:
        fn = call["function"]
        args = arguments_object(fn.get("arguments", {}))
        payload = json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False)
        blocks.append(f"{OPEN}\n{payload}\n{CLOSE}")
    return "\n".join(blocks)


def fallback_messages(
    messages: list[Message], tools: list[dict[str, Any]] | None, instruction: str | None = None
) -> list[Message]:
    """`messages` for a template without a tools section: the tools section joins the system
    prompt (or becomes one), assistant tool calls become text blocks, and each run of tool
    results becomes one user turn of <tool_response> blocks (ChatML models know user turns;
    some templates reject a 'tool' role or two user turns in a row)."""
    out: list[Message] = []
    for m in messages:
        role = m["role"]
        if role == "tool":
            block = f"{RESPONSE_OPEN}\n{m.get('content') or ''}\n{RESPONSE_CLOSE}"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        elif role == "assistant" and m.get("tool_calls"):
            text = "\n".join(
                p for p in (m.get("content") or "", tool_calls_text(m["tool_calls"])) if p
            )
            out.append({"role": "assistant", "content": text})
        else:
            out.append({"role": role, "content": m.get("content") or ""})
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        section = tools_system_section(tools, instruction)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{section}"}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def native_messages(
    messages: list[Message], instruction: str | None = None, *, renders_calls: bool = True
) -> list[Message]:
    """`messages` for a template with a tools section: call arguments as objects (Qwen2.5's
    template writes `arguments | tojson`; a JSON string would be encoded twice), None content
    as "" and the tool-choice sentence appended to the system prompt. A template that reads
    `tools` but not `tool_calls` gets past calls as text blocks."""
    out: list[Message] = []
    for m in messages:
        m = copy.deepcopy(m)
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls"):
            if renders_calls:
                for call in m["tool_calls"]:
                    fn = call["function"]
                    fn["arguments"] = arguments_object(fn.get("arguments", {}))
            else:
                calls = m.pop("tool_calls")
                m["content"] = "\n".join(p for p in (m["content"], tool_calls_text(calls)) if p)
        out.append(m)
    if instruction:
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{instruction}"
        else:
            out.insert(0, {"role": "system", "content": instruction})
    return out


def render_prompt(
    tokenizer: Any,
    messages: list[Message],
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
    *,
    add_generation_prompt: bool = True,
) -> str:
    """The text a local model sees for `messages` with `tools` offered: its own chat template
    when the template reads `tools` (native), else the fallback (a `# Tools` system section,
    past calls as <tool_call> blocks, results as <tool_response> blocks). The local backend
    prompts with it, and ReST trains episodes with it (`add_generation_prompt=False` for a
    finished conversation), so training text is token for token what generation saw."""
    offered = offered_tools(tools, tool_choice)
    kwargs: dict[str, Any] = {}
    if offered or any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        instruction = choice_instruction(tool_choice) if offered else None
        template = tokenizer.chat_template
        if isinstance(template, str) and template_supports_tools(template):
            calls_native = "tool_calls" in template
            messages = native_messages(messages, instruction, renders_calls=calls_native)
            kwargs["tools"] = offered
        else:
            messages = fallback_messages(messages, offered, instruction)
    text: str = tokenizer.apply_chat_template(  # tokenize=False: the prompt as text
        messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
    )
    return text


# ---------------------------------------------------------------------- parsing


@dataclass
class ParsedReply:
    """A reply split into its text and its tool-call blocks."""

    content: str
    """The text outside the blocks, stripped."""
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    """One {"index", "error", "raw"} per block that is not a valid call."""
    blocks: int = 0
    """How many blocks the reply opened (valid or not)."""


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def parse_tool_calls(text: str, names: list[str]) -> ParsedReply:
    """Every <tool_call> block of `text` as an OpenAI tool call, validated against the
    offered tool `names`; an unterminated last block is an error too."""
    parsed = ParsedReply(content="")
    pieces: list[str] = []
    end = 0
    for match in _BLOCK.finditer(text):
        pieces.append(text[end : match.start()])
        end = match.end()
        _add_call(parsed, match.group(1), names)
    rest = text[end:]
    cut = rest.find(OPEN)
    if cut >= 0:  # an opened block never closed
        pieces.append(rest[:cut])
        parsed.errors.append(
            _error(parsed.blocks, f"{OPEN} is never closed by {CLOSE}", rest[cut + len(OPEN) :])
        )
        parsed.blocks += 1
    else:
        pieces.append(rest)
    parsed.content = "".join(pieces).strip()
    return parsed


def _add_call(parsed: ParsedReply, body: str, names: list[str]) -> None:
    index = parsed.blocks
    parsed.blocks += 1
    try:
        obj = json.loads(body)
    except ValueError as err:
        parsed.errors.append(_error(index, f"not valid JSON ({err})", body))
        return
    problem, name, args = _call_problem(obj, names)
    if problem:
        parsed.errors.append(_error(index, problem, body))
        return
    parsed.calls.append(
        {
            "id": new_call_id(),
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
        }
    )


def _call_problem(obj: Any, names: list[str]) -> tuple[str | None, str, dict[str, Any]]:
    """(what is wrong or None, name, arguments) of one decoded call object."""
    if not isinstance(obj, dict):
        return "the call is not a JSON object", "", {}
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "the call has no 'name' string", "", {}
    if name not in names:
        offered = ", ".join(names) or "none"
        return f"unknown tool {name!r} (offered: {offered})", name, {}
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models encode the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as err:
            return f"arguments are not valid JSON ({err})", name, {}
    if not isinstance(args, dict):
        return f"arguments must be a JSON object, got {type(args).__name__}", name, {}
    return None, name, args


def _error(index: int, message: str, raw: str) -> dict[str, Any]:
    return {"index": index, "error": message, "raw": raw.strip()[:_RAW_LIMIT]}


def check_tool_calls(calls: list[ToolCall], names: list[str]) -> list[dict[str, Any]]:
    """Errors of OpenAI-shaped calls a server returned (the same rules as for parsed ones:
    an offered name, arguments a JSON object)."""
    errors = []
    for i, call in enumerate(calls):
        fn = call.get("function") or {}
        raw = fn.get("arguments")
        obj = {"name": fn.get("name"), "arguments": raw if raw is not None else {}}
        problem, _, _ = _call_problem(obj, names)
        if problem:
            errors.append(_error(i, problem, json.dumps(fn, ensure_ascii=False)))
    return errors


def apply_tool_reply(completion: Completion, tools: list[dict[str, Any]]) -> Completion:
    """Turn a generated reply that holds <tool_call> blocks into tool calls (in place):
    all valid and not truncated → `tool_calls`, the text outside them as `text`,
    finish_reason "tool_calls"; otherwise text and finish reason stay and
    `tool_call_errors` says why. A reply without blocks is left alone."""
    parsed = parse_tool_calls(completion.text, tool_names(tools))
    if not parsed.blocks:
        return completion
    errors = list(parsed.errors)
    if completion.truncated:
        errors.append(
            _error(parsed.blocks, "the reply was cut by max_tokens, so its calls are not run", "")
        )
    if errors:
        completion.tool_call_errors = errors
        return completion
    completion.tool_calls = parsed.calls
    completion.text = parsed.content
    completion.finish_reason = "tool_calls"
    return completion
