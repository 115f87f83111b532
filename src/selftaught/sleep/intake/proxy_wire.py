"""The wire formats the proxy speaks: OpenAI chat completions, Anthropic Messages (Claude Code)
and OpenAI Responses (Codex). One `Wire` per format says:

- where a request goes upstream (`path`, below the upstream's `/v1`);
- what is logged of it (`logged`): the messages in the project's one shape, OpenAI chat
  (system / instructions → a `system` message; `tool_use` / `function_call` → an assistant
  turn's `tool_calls`; `tool_result` / `function_call_output` → `role: tool` turns; thinking
  and reasoning items dropped), the tools in the OpenAI `tools` shape (hosted / server tools,
  which no client runs, are named in `meta["hosted_tools"]` instead), `tool_choice`, the
  other request fields (small ones only) and the agent's session id;
- how the adopted skill goes in (`inject`): chat as `sleep.adoption.inject` does it; Messages
  in `system`, Responses in `instructions` (the same marked block, so it is strippable), the
  demo turns placed as turns ahead of the conversation;
- how its reply is read, plain (`reply`) or streamed (`stream()`: an accumulator fed the raw
  bytes as they pass, sharing `SseLines` for the line splitting).

Claude Code sends its session id in the `x-claude-code-session-id` header (and in
`metadata.user_id`, a JSON string); Codex in `session-id` (and `client_metadata.session_id`):
read off the real CLIs (Claude Code 2.1.328, Codex 0.169.0).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from selftaught.models.base import Message
from selftaught.sleep.adoption.inject import RoutedSkill, inject_adopted, render_adopted
from selftaught.sleep.intake.harvest.common import tool_call
from selftaught.sleep.intake.storable import storable
from selftaught.sleep.paths import Adopted

ID_HEADER = "x-selftaught-interaction-id"  # on every answer: the logged row's id
SESSION_HEADERS = ("x-claude-code-session-id", "session-id")
_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
REQUEST_FIELD_CHARS = 2000  # a request field longer than this (as JSON) is not kept in meta
MAX_EVENT_BYTES = 16 * 2**20  # a longer stream line is not read for the log (it still passes)
_BILLING = "x-anthropic-billing-header:"  # Claude Code's first system block: not an instruction


@dataclass
class Logged:
    """What the log keeps of a request body."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    tool_choice: Any
    request: dict[str, Any]  # the other fields, for meta["request"]
    hosted_tools: list[str] = field(default_factory=list)


@dataclass
class Reply:
    """What the log keeps of a reply."""

    text: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    usage: dict[str, int] | None = None  # prompt_tokens, completion_tokens
    model: str | None = None
    finish_reason: str | None = None
    error: str | None = None


# ---- shared helpers -------------------------------------------------------------------------


def error_text(body: Any) -> str:
    """The message of an error body (OpenAI's or Anthropic's shape), else the body cut short."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return json.dumps(body)[:1000] if not isinstance(body, str) else body[:1000]


def session_id(headers: Any, body: dict[str, Any]) -> str | None:
    """The agent session a request belongs to, where the agent sends one."""
    found: list[Any] = [headers.get(name) for name in SESSION_HEADERS]
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        try:  # Claude Code: metadata.user_id is a JSON string holding session_id
            user = json.loads(metadata["user_id"])
            found.append(user.get("session_id") if isinstance(user, dict) else None)
        except (ValueError, RecursionError):
            pass
    client_meta = body.get("client_metadata")
    if isinstance(client_meta, dict):
        found.append(client_meta.get("session_id"))
    for value in found:
        if isinstance(value, str) and _SESSION_ID.fullmatch(value):
            return value
    return None


def request_fields(body: dict[str, Any], skip: tuple[str, ...]) -> dict[str, Any]:
    """The body's other fields, each only when small (meta stays small)."""
    out = {}
    for key, value in body.items():
        if key in skip:
            continue
        if len(json.dumps(value, default=str)) <= REQUEST_FIELD_CHARS:
            out[key] = value
    return out


MAX_TOKENS = 2**31 - 1  # the largest count both backends' INTEGER column stores


def _count(value: Any) -> int | None:
    """A token count as an upstream should send it (a whole number in the column's range),
    else None: a count of another type or size is not guessed at."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= MAX_TOKENS else None


def _index(value: Any) -> int:
    """A stream's block / output index; one that is not a whole number reads as 0 (as a
    missing one does)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _label(value: Any) -> str | None:
    """A short name an upstream sends (model, finish reason, id): a string as is, another
    value as JSON, nothing as None."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, default=str)[:200]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _reply_text(content: Any) -> str:
    """A reply's content as text: a string as is, text parts joined, anything else as JSON."""
    if isinstance(content, str):
        return content
    if not content:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        parts = _text_or_parts(content)
        if isinstance(parts, str):
            return parts
    return json.dumps(content, ensure_ascii=False, default=str)


def _usage(prompt: Any, completion: Any) -> dict[str, int] | None:
    """The token counts; one that is missing or malformed (`_count`) reads as 0."""
    prompt, completion = _count(prompt), _count(completion)
    if prompt is None and completion is None:
        return None
    return {"prompt_tokens": prompt or 0, "completion_tokens": completion or 0}


def _text_or_parts(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A content: one string when every part is text, else the OpenAI parts."""
    if all(p.get("type") == "text" for p in parts):
        return "\n".join(str(p.get("text", "")) for p in parts)
    return parts


def _json_object(text: str) -> Any:
    try:
        return json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):  # not JSON, or nested past what Python parses
        return text


# ---- reading a stream as it passes ----------------------------------------------------------


class SseLines:
    """Server-sent events fed as raw bytes (split anywhere); each `data:` JSON object goes to
    `event`. Subclasses collect the reply (`result`) and say whether it ended (`done`)."""

    def __init__(self) -> None:
        self._partial: list[bytes] = []  # the line still coming, in pieces (joined once)
        self._held = 0  # its bytes so far
        self._oversize = False  # it outgrew MAX_EVENT_BYTES: skipped to its end
        self.done = False
        self.error: str | None = None
        self.model: str | None = None
        self.finish_reason: str | None = None
        self.replaced = 0  # characters `storable` replaced in the events
        self.malformed = 0  # events that were not JSON objects, or not of the API's shape

    def feed(self, data: bytes) -> None:
        """Read what passed; never raises (a malformed event is counted and skipped). Linear
        in the bytes fed, however a line is split."""
        *lines, rest = data.split(b"\n")
        if lines:
            lines[0] = b"" if self._oversize else b"".join([*self._partial, lines[0]])
            self._partial, self._held, self._oversize = [], 0, False
        if rest and not self._oversize:
            self._partial.append(rest)
            self._held += len(rest)
            if self._held > MAX_EVENT_BYTES:  # never parsed: its bytes still pass through
                self._partial, self._held, self._oversize = [], 0, True
                self.malformed += 1
        for line in lines:
            self._line(line.strip())

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            event, replaced = storable(json.loads(payload))
        except (ValueError, RecursionError):
            self.malformed += 1
            return
        self.replaced += replaced
        try:
            if not isinstance(event, dict):
                raise TypeError("not an object")
            self.event(event)
        except Exception:  # noqa: BLE001 - an event of the wrong shape is skipped
            self.malformed += 1

    def event(self, event: dict[str, Any]) -> None:
        raise NotImplementedError

    def result(self) -> Reply:
        raise NotImplementedError

    @property
    def finished(self) -> bool:
        """The stream reached its end (else it broke off)."""
        return self.done or self.finish_reason is not None


class ChatStream(SseLines):
    """OpenAI chat completion chunks."""

    def __init__(self) -> None:
        super().__init__()
        self.content: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None

    def event(self, event: dict[str, Any]) -> None:
        if event.get("error"):
            self.error = error_text(event)
        self.model = _label(event.get("model")) or self.model
        if isinstance(event.get("usage"), dict) and event["usage"]:
            self.usage = event["usage"]
        for choice in _list(event.get("choices")):
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = _dict(choice.get("delta"))
            if delta.get("content"):
                self.content.append(_reply_text(delta["content"]))
            for call in _list(delta.get("tool_calls")):
                if isinstance(call, dict):
                    self._tool_call_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = _label(choice["finish_reason"])

    def _tool_call_delta(self, call: dict[str, Any]) -> None:
        """One fragment of a streamed tool call. Fragments of one call share its `index`; a
        server that leaves `index` out starts a new call with each new `id`."""
        index = call.get("index")
        call_id = _label(call.get("id"))
        if not isinstance(index, int) or isinstance(index, bool):
            last = max(self.tool_calls, default=-1)
            fresh = call_id and (last < 0 or self.tool_calls[last]["id"] != call_id)
            index = last + 1 if fresh or last < 0 else last
        slot = self.tool_calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        slot["id"] = call_id or slot["id"]
        fn = _dict(call.get("function"))
        for part in ("name", "arguments"):
            if isinstance(fn.get(part), str):
                slot["function"][part] += fn[part]

    def calls(self) -> list[dict[str, Any]] | None:
        """The streamed tool calls in index order (an id the server never sent is left out)."""
        out = [
            {k: v for k, v in slot.items() if v is not None}
            for _, slot in sorted(self.tool_calls.items())
        ]
        return out or None

    @property
    def text(self) -> str:
        return "".join(self.content)

    def result(self) -> Reply:
        usage = self.usage or {}
        return Reply(
            self.text,
            self.calls(),
            _usage(usage.get("prompt_tokens"), usage.get("completion_tokens")),
            self.model,
            self.finish_reason,
            self.error,
        )


class MessagesStream(SseLines):
    """Anthropic's message stream: message_start, content_block_start / delta / stop,
    message_delta (stop_reason, output tokens), message_stop; `error` events."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: dict[int, dict[str, Any]] = {}
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            message = event["message"]
            self.model = _label(message.get("model")) or self.model
            self._take_usage(message.get("usage"))
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            block = dict(event["content_block"])
            block["partial"] = ""
            self.blocks[_index(event.get("index"))] = block
        elif kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            self._delta(_index(event.get("index")), event["delta"])
        elif kind == "message_delta":
            delta = _dict(event.get("delta"))
            self.finish_reason = _label(delta.get("stop_reason")) or self.finish_reason
            self._take_usage(event.get("usage"))
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            self.error = error_text(event)

    def _take_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        if usage.get("input_tokens") is not None:
            self.input_tokens = _anthropic_input_tokens(usage)
        if usage.get("output_tokens") is not None:
            self.output_tokens = _count(usage["output_tokens"])

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self.blocks.setdefault(index, {"type": "text", "text": "", "partial": ""})
        if delta.get("type") == "text_delta":
            block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
        elif delta.get("type") == "input_json_delta":
            block["partial"] += str(delta.get("partial_json") or "")

    def result(self) -> Reply:
        content = []
        for _, block in sorted(self.blocks.items()):
            block = dict(block)
            partial = block.pop("partial")
            if block.get("type") == "tool_use" and partial:
                block["input"] = _json_object(partial)
            content.append(block)
        text, calls = _message_content(content)
        return Reply(
            text,
            calls,
            _usage(self.input_tokens, self.output_tokens),
            self.model,
            self.finish_reason,
            self.error,
        )


class ResponsesStream(SseLines):
    """OpenAI Responses events: the items from `response.output_item.done` (text deltas
    kept for a stream that breaks), the usage and status from `response.completed`."""

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[int, dict[str, Any]] = {}
        self.deltas: list[str] = []
        self.final: dict[str, Any] | None = None

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        response = event.get("response") if isinstance(event.get("response"), dict) else None
        if response is not None:
            self.model = _label(response.get("model")) or self.model
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            self.items[_index(event.get("output_index"))] = event["item"]
        elif kind == "response.output_text.delta":
            self.deltas.append(_reply_text(event.get("delta")))
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self.final = response or {}
            self.done = True
            if kind == "response.failed":
                self.error = error_text(self.final.get("error") or "the response failed")
        elif kind == "error":
            self.error = error_text(event)

    def result(self) -> Reply:
        final = self.final or {}
        output = _list(final.get("output")) or [item for _, item in sorted(self.items.items())]
        reply = _responses_reply({**final, "output": output})
        if not output and self.deltas:
            reply.text = "".join(self.deltas)
        reply.model = reply.model or self.model
        reply.error = self.error
        return reply


# ---- the wire formats -------------------------------------------------------------------------


class Wire:
    """One API the proxy speaks (see the module docstring)."""

    name = ""
    path = ""  # upstream path below /v1

    def logged(self, body: dict[str, Any]) -> Logged:
        raise NotImplementedError

    def inject(
        self, body: dict[str, Any], adopted: Adopted, routed: RoutedSkill | None = None
    ) -> dict[str, Any]:
        raise NotImplementedError

    def reply(self, body: Any) -> Reply:
        raise NotImplementedError

    def stream(self) -> SseLines:
        raise NotImplementedError


class ChatWire(Wire):
    name, path = "chat", "chat/completions"

    def logged(self, body: dict[str, Any]) -> Logged:
        messages = body.get("messages")
        tools = body.get("tools")
        return Logged(
            messages=messages if isinstance(messages, list) else [],
            tools=tools if isinstance(tools, list) and tools else None,
            tool_choice=body.get("tool_choice"),
            request={
                k: v for k, v in body.items() if k not in ("messages", "tools", "tool_choice")
            },
        )

    def inject(
        self, body: dict[str, Any], adopted: Adopted, routed: RoutedSkill | None = None
    ) -> dict[str, Any]:
        return {**body, "messages": inject_adopted(body.get("messages"), adopted, routed)}

    def reply(self, body: Any) -> Reply:
        try:
            choice = body["choices"][0]
            message = _dict(choice.get("message"))
        except (KeyError, IndexError, TypeError, AttributeError):
            return Reply(error="the upstream reply has no choices")
        usage = _dict(body.get("usage"))
        calls = [c for c in _list(message.get("tool_calls")) if isinstance(c, dict)]
        return Reply(
            _reply_text(message.get("content")),
            calls or None,
            _usage(usage.get("prompt_tokens"), usage.get("completion_tokens")),
            _label(body.get("model")),
            _label(choice.get("finish_reason")),
        )

    def stream(self) -> ChatStream:
        return ChatStream()


class MessagesWire(Wire):
    """Anthropic Messages (`POST /v1/messages`, `?beta=true` from Claude Code)."""

    name, path = "messages", "messages"

    def logged(self, body: dict[str, Any]) -> Logged:
        messages = anthropic_messages(body.get("system"), body.get("messages"))
        tools, hosted = anthropic_tools(body.get("tools"))
        return Logged(
            messages=messages,
            tools=tools,
            tool_choice=anthropic_tool_choice(body.get("tool_choice")),
            request=request_fields(body, ("messages", "system", "tools", "tool_choice")),
            hosted_tools=hosted,
        )

    def inject(
        self, body: dict[str, Any], adopted: Adopted, routed: RoutedSkill | None = None
    ) -> dict[str, Any]:
        rendered = render_adopted(self.logged(body).messages, adopted, routed)
        if not rendered.block:
            return body
        out = {**body, "system": _system_with(body.get("system"), rendered.block)}
        if rendered.turns and isinstance(body.get("messages"), list):
            demos = [{"role": t["role"], "content": str(t["content"])} for t in rendered.turns]
            out["messages"] = demos + body["messages"]
        return out

    def reply(self, body: Any) -> Reply:
        if not isinstance(body, dict) or not isinstance(body.get("content"), list):
            return Reply(error="the upstream reply has no content")
        text, calls = _message_content(body["content"])
        usage = _dict(body.get("usage"))
        return Reply(
            text,
            calls,
            _usage(_anthropic_input_tokens(usage), usage.get("output_tokens")),
            _label(body.get("model")),
            _label(body.get("stop_reason")),
        )

    def stream(self) -> MessagesStream:
        return MessagesStream()


class ResponsesWire(Wire):
    """OpenAI Responses (`POST /v1/responses`)."""

    name, path = "responses", "responses"

    def logged(self, body: dict[str, Any]) -> Logged:
        tools, hosted = responses_tools(body.get("tools"))
        return Logged(
            messages=responses_messages(body.get("instructions"), body.get("input")),
            tools=tools,
            tool_choice=responses_tool_choice(body.get("tool_choice")),
            request=request_fields(body, ("input", "instructions", "tools", "tool_choice")),
            hosted_tools=hosted,
        )

    def inject(
        self, body: dict[str, Any], adopted: Adopted, routed: RoutedSkill | None = None
    ) -> dict[str, Any]:
        rendered = render_adopted(self.logged(body).messages, adopted, routed)
        if not rendered.block:
            return body
        given = body.get("instructions")
        instructions = f"{rendered.block}\n\n{given}" if isinstance(given, str) and given else None
        out = {**body, "instructions": instructions or rendered.block}
        if rendered.turns:
            items = body.get("input")
            items = [{"role": "user", "content": items}] if isinstance(items, str) else items
            demos = [{"role": t["role"], "content": str(t["content"])} for t in rendered.turns]
            out["input"] = demos + list(items or [])
        return out

    def reply(self, body: Any) -> Reply:
        if not isinstance(body, dict) or not isinstance(body.get("output"), list):
            return Reply(error="the upstream reply has no output")
        return _responses_reply(body)

    def stream(self) -> ResponsesStream:
        return ResponsesStream()


WIRES: dict[str, Wire] = {w.name: w for w in (ChatWire(), MessagesWire(), ResponsesWire())}


# ---- Anthropic Messages → the log's shape ---------------------------------------------------


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _anthropic_input_tokens(usage: dict[str, Any]) -> int | None:
    """Input tokens, cache reads and writes included (Anthropic counts them apart)."""
    keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    counts = [_count(usage.get(k)) for k in keys]
    if all(c is None for c in counts):
        return None
    return sum(c or 0 for c in counts)


def anthropic_system_text(system: Any) -> str:
    blocks = [b for b in _blocks(system) if b.get("type") == "text"]
    texts = [str(b.get("text", "")) for b in blocks]
    return "\n\n".join(t for t in texts if t.strip() and not t.startswith(_BILLING))


def _system_with(system: Any, block: str) -> Any:
    """`system` with the injected block first (after Claude Code's billing header)."""
    if isinstance(system, list):
        out = list(system)
        at = 0
        while at < len(out) and _is_billing(out[at]):
            at += 1
        out.insert(at, {"type": "text", "text": block})
        return out
    if isinstance(system, str) and system:
        return f"{block}\n\n{system}"
    return block


def _is_billing(block: Any) -> bool:
    return isinstance(block, dict) and str(block.get("text", "")).startswith(_BILLING)


def _anthropic_part(block: dict[str, Any]) -> dict[str, Any]:
    """A user content block as an OpenAI content part (cache markers dropped)."""
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": str(block.get("text", ""))}
    source = _dict(block.get("source"))
    if kind == "image" and source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "image" and source.get("type") == "url":
        return {"type": "image_url", "image_url": {"url": source.get("url")}}
    return {k: v for k, v in block.items() if k != "cache_control"}


def _message_content(blocks: list[Any]) -> tuple[str, list[dict[str, Any]] | None]:
    """(the text, the tool calls in the OpenAI shape) of an assistant message's blocks."""
    texts, calls = [], []
    for block in _blocks(blocks):
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            calls.append(tool_call(block.get("id"), block.get("name"), block.get("input")))
    return "\n".join(t for t in texts if t), calls or None


def anthropic_messages(system: Any, messages: Any) -> list[Message]:
    """An Anthropic conversation in the OpenAI chat shape."""
    out: list[Message] = []
    text = anthropic_system_text(system)
    if text:
        out.append({"role": "system", "content": text})
    for msg in messages if isinstance(messages, list) else []:
        if not isinstance(msg, dict):
            continue
        role, blocks = str(msg.get("role") or "user"), _blocks(msg.get("content"))
        if role == "assistant":
            content, calls = _message_content(blocks)
            turn: Message = {"role": "assistant", "content": content or (None if calls else "")}
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
            continue
        for block in blocks:
            if block.get("type") == "tool_result":
                result = block.get("content")
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(block.get("tool_use_id") or ""),
                        "content": result if isinstance(result, str) else _result_text(result),
                    }
                )
        parts = [_anthropic_part(b) for b in blocks if b.get("type") != "tool_result"]
        if parts:
            out.append({"role": role, "content": _text_or_parts(parts)})
    return out


def _result_text(content: Any) -> str:
    blocks = _blocks(content)
    texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
    if texts or not blocks:
        return "\n".join(texts)
    return json.dumps(content, ensure_ascii=False)


def anthropic_tools(tools: Any) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """(the client tools in the OpenAI shape, the names of server / built-in tools)."""
    out, hosted = [], []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        if isinstance(tool.get("input_schema"), dict):
            fn = {"name": tool.get("name"), "description": tool.get("description") or ""}
            fn["parameters"] = tool["input_schema"]
            out.append({"type": "function", "function": fn})
        else:
            hosted.append(str(tool.get("name") or tool.get("type")))
    return out or None, hosted


def anthropic_tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"any": "required"}.get(str(kind), kind)


# ---- OpenAI Responses → the log's shape -----------------------------------------------------

_CALL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call")
_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


def _responses_part(part: Any) -> dict[str, Any]:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "refusal"):
        return {"type": "text", "text": str(part.get("text", part.get("refusal", "")))}
    if kind == "input_image" and part.get("image_url"):
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    return dict(part)


def _responses_content(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return _reply_text(content)
    parts = [_responses_part(p) for p in content if isinstance(p, (dict, str))]
    return _text_or_parts(parts) if parts else ""


def _item_call(item: dict[str, Any]) -> dict[str, Any]:
    """A call item in the OpenAI chat shape (a custom tool's text input as {"input": ...})."""
    kind = item.get("type")
    arguments = item.get("arguments")
    if kind == "custom_tool_call":
        arguments = {"input": item.get("input")}
    elif kind == "local_shell_call":
        arguments = item.get("action")
    name = item.get("name") or ("local_shell" if kind == "local_shell_call" else None)
    return tool_call(item.get("call_id") or item.get("id"), name, arguments)


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    content = _responses_content(output) if isinstance(output, list) else output
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def responses_messages(instructions: Any, items: Any) -> list[Message]:
    """A Responses `instructions` + `input` in the OpenAI chat shape."""
    out: list[Message] = []
    if isinstance(instructions, str) and instructions.strip():
        out.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = str(item.get("role") or "user")
            out.append({"role": role, "content": _responses_content(item.get("content"))})
        elif kind in _CALL_ITEMS:
            last = out[-1] if out else None
            if not (last and last["role"] == "assistant"):
                last = {"role": "assistant", "content": None}
                out.append(last)
            last.setdefault("tool_calls", []).append(_item_call(item))
        elif kind in _OUTPUT_ITEMS:
            call_id = item.get("call_id") or item.get("id")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": str(call_id or ""),
                    "content": _output_text(item.get("output")),
                }
            )
    return out  # reasoning, item references and hosted tool calls carry nothing replayable


def responses_tools(tools: Any) -> tuple[list[dict[str, Any]] | None, list[str]]:
    out, hosted = [], []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if kind == "function" and isinstance(tool.get("name"), str):
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
            out.append({"type": "function", "function": fn})
        elif kind == "custom" and isinstance(tool.get("name"), str):
            text = {"type": "object", "properties": {"input": {"type": "string"}}}
            fn = {"name": tool["name"], "description": tool.get("description") or ""}
            out.append({"type": "function", "function": {**fn, "parameters": text}})
        else:
            hosted.append(str(tool.get("name") or kind))
    return out or None, hosted


def responses_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _responses_reply(body: dict[str, Any]) -> Reply:
    texts, calls = [], []
    for item in _list(body.get("output")):
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            content = _responses_content(item.get("content") or [])
            texts.append(content if isinstance(content, str) else json.dumps(content))
        elif item.get("type") in _CALL_ITEMS:
            calls.append(_item_call(item))
    usage = _dict(body.get("usage"))
    finish = _label(body.get("status"))
    if finish == "incomplete":
        finish = f"incomplete: {_label(_dict(body.get('incomplete_details')).get('reason'))}"
    error = error_text(body["error"]) if body.get("error") else None
    return Reply(
        "\n".join(texts),
        calls or None,
        _usage(usage.get("input_tokens"), usage.get("output_tokens")),
        _label(body.get("model")),
        finish,
        error,
    )
