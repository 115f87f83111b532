"""Nothing answered goes unlogged, whatever its bytes (issue 49, round four, item 1).

A scripted upstream answers each case of a corpus of hostile bytes, on each API the proxy
speaks (chat completions, Anthropic Messages, OpenAI Responses), streamed and not: lone
UTF-16 surrogates (valid JSON) in content, model, tool arguments and dict keys; NULs; invalid
UTF-8; numbers too large for any column; wrong types in every field the proxy reads, in the
client's request and in the upstream's reply and stream events. The invariant, on SQLite and
PostgreSQL: every request answered 2xx has its row, the client gets every byte the upstream
sent, and /health counts no logging failure. A lone surrogate or NUL is logged as U+FFFD and
counted on the row (`meta["replaced_chars"]`) and on /health.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import loopback

pytest.importorskip("fastapi")

from selftaught.sleep.intake import proxy_wire  # noqa: E402
from selftaught.sleep.intake.log import Interaction, TaskLog  # noqa: E402
from selftaught.sleep.intake.proxy import ID_HEADER, ProxyConfig, proxy_in_background  # noqa: E402
from selftaught.sleep.intake.writer import LogWriter  # noqa: E402
from tests.fake_upstream import FakeUpstream, health  # noqa: E402
from tests.test_sleep_proxy import adopt  # noqa: E402

WIRES = ("chat", "messages", "responses")
PATHS = {"chat": "chat/completions", "messages": "messages", "responses": "responses"}
# JSON a dict cannot spell: a placeholder string in a body is replaced by these bytes
RAW = {
    "__INF__": b"1e400",
    "__NEGINF__": b"-1e400",
    "__NAN__": b"NaN",
    "__BIG__": b"1" + b"0" * 4000,
    "__DEEP__": b"[" * 90 + b"]" * 90,  # under the guard's MAX_JSON_DEPTH (100)
    "__TOO_DEEP__": b"[" * 100_000 + b"]" * 100_000,
}


# Numbers JSON has no spelling for (Python's json reads them as floats that are not finite)
NOT_JSON_NUMBERS = {
    "1e400": b"1e400",
    "-1e400": b"-1e400",
    "NaN": b"NaN",
    "Infinity": b"Infinity",
    "-Infinity": b"-Infinity",
}


def dumps(value: Any) -> bytes:
    """JSON bytes (a lone surrogate escaped, as a client sends it), placeholders filled."""
    out = json.dumps(value).encode()
    for name, raw in RAW.items():
        out = out.replace(f'"{name}"'.encode(), raw)
    return out


def sse(events: list[Any], named: bool = False) -> bytes:
    """A server-sent event stream; bytes pass as they are, `named` adds `event:` lines."""
    out = b""
    for event in events:
        if isinstance(event, bytes):
            out += event
            continue
        kind = event.get("type") if isinstance(event, dict) else None
        head = f"event: {kind}\n".encode() if named and isinstance(kind, str) else b""
        out += head + b"data: " + dumps(event) + b"\n\n"
    return out


@dataclass
class Case:
    name: str
    wire: str
    request: bytes  # the client's body
    reply: bytes  # what the upstream answers (200)
    stream: bool
    status: int = 200  # what the client must get
    replaced: bool = False  # the row must count replaced characters

    @property
    def content_type(self) -> str:
        return "text/event-stream" if self.stream else "application/json"


# ---- well-formed replies of each API ----------------------------------------------------------

CHUNK = {"id": "c1", "object": "chat.completion.chunk", "model": "m"}


def chunk(**fields: Any) -> dict[str, Any]:
    return {**CHUNK, **fields}


def choice(delta: Any = None, **fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {} if delta is None else delta, **fields}]}


def chat_stream(*middle: Any, usage: Any = None) -> list[Any]:
    """A chat stream whose middle events are `middle` (default: the text "ok"), its last
    chunk carrying `usage`."""
    body = middle or (chunk(**choice({"content": "ok"})),)
    return [
        chunk(**choice({"role": "assistant", "content": ""})),
        *body,
        chunk(**choice(finish_reason="stop")),
        chunk(choices=[], usage=usage or {"prompt_tokens": 3, "completion_tokens": 1}),
        b"data: [DONE]\n\n",
    ]


def chat_reply(**over: Any) -> dict[str, Any]:
    message = {"role": "assistant", "content": "ok"}
    body = {
        "id": "c1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    return {**body, **over}


def messages_stream(*middle: Any, start: Any = None, delta: Any = None) -> list[Any]:
    usage = {"input_tokens": 3, "output_tokens": 0}
    message = {
        "id": "msg1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "usage": usage,
    }
    body = middle or (
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 0},
    )
    return [
        {"type": "message_start", "message": message if start is None else start},
        *body,
        {
            "type": "message_delta",
            "delta": delta or {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 1},
        },
        {"type": "message_stop"},
    ]


def messages_reply(**over: Any) -> dict[str, Any]:
    body = {
        "id": "msg1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    return {**body, **over}


ITEM = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}


def responses_reply(**over: Any) -> dict[str, Any]:
    body = {
        "id": "r1",
        "object": "response",
        "model": "m",
        "status": "completed",
        "output": [ITEM],
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    return {**body, **over}


def responses_stream(*middle: Any, final: Any = None) -> list[Any]:
    body = middle or (
        {"type": "response.output_text.delta", "output_index": 0, "delta": "ok"},
        {"type": "response.output_item.done", "output_index": 0, "item": ITEM},
    )
    return [
        {"type": "response.created", "response": {"id": "r1", "model": "m", "output": []}},
        *body,
        {"type": "response.completed", "response": responses_reply() if final is None else final},
    ]


GOOD = {
    ("chat", False): lambda: dumps(chat_reply()),
    ("chat", True): lambda: sse(chat_stream()),
    ("messages", False): lambda: dumps(messages_reply()),
    ("messages", True): lambda: sse(messages_stream(), named=True),
    ("responses", False): lambda: dumps(responses_reply()),
    ("responses", True): lambda: sse(responses_stream(), named=True),
}

# ---- hostile requests --------------------------------------------------------------------------

S = "\ud800"  # a lone high surrogate: valid JSON ("\\ud800"), no UTF-8 spelling


def basic(wire: str, text: str = "hi") -> dict[str, Any]:
    if wire == "chat":
        return {"model": "m", "messages": [{"role": "user", "content": text}]}
    if wire == "messages":
        return {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": text}]}
    return {"model": "m", "input": text}


def tool_round(wire: str) -> dict[str, Any]:
    """A tool call and its result with lone surrogates in names, keys, arguments, results."""
    args = json.dumps({"cmd": "ls " + S}, ensure_ascii=False)  # the surrogate itself inside
    if wire == "chat":
        call = {"id": "c1", "type": "function", "function": {"name": "sh" + S, "arguments": args}}
        return {
            "model": "m",
            "messages": [
                {"role": "user", "content": "run"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "out" + S},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "sh" + S,
                        "parameters": {"properties": {"cmd" + S: {"type": "string"}}},
                    },
                }
            ],
        }
    if wire == "messages":
        use = {"type": "tool_use", "id": "t1", "name": "sh" + S, "input": {"cmd" + S: S}}
        result = {"type": "tool_result", "tool_use_id": "t1", "content": "out" + S}
        return {
            "model": "m",
            "max_tokens": 16,
            "messages": [
                {"role": "user", "content": "run"},
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [result]},
            ],
            "tools": [
                {"name": "sh" + S, "input_schema": {"type": "object", "properties": {S: {}}}}
            ],
        }
    return {
        "model": "m",
        "input": [
            {"role": "user", "content": "run"},
            {"type": "function_call", "call_id": "c1", "name": "sh" + S, "arguments": args},
            {"type": "function_call_output", "call_id": "c1", "output": "out" + S},
        ],
        "tools": [{"type": "function", "name": "sh" + S, "parameters": {S: 1}}],
    }


def field_types(wire: str) -> dict[str, dict[str, Any]]:
    """Wrong types in every field the proxy reads of a request (each body answered and
    logged; the log keeps what it can read of it)."""
    out = {
        "model list": {"model": [1]},
        "model object": {"model": {"a": 1}},
        "model number": {"model": 5},
        "stream string": {"stream": "yes"},  # not True: the proxy reads the reply plain
        "stream_options string": {"stream_options": "x"},
        "metadata string": {"metadata": "x"},
        "metadata user_id number": {"metadata": {"user_id": 5}},
        "metadata user_id not json": {"metadata": {"user_id": "{not json"}},
        "metadata user_id too deep": {"metadata": {"user_id": "[" * 100_000}},
        "client_metadata string": {"client_metadata": "x"},
        "client_metadata session number": {"client_metadata": {"session_id": 5}},
        "tools string": {"tools": "x"},
        "tools object": {"tools": {"a": 1}},
        "tools of odd items": {
            "tools": [
                5,
                "x",
                {"type": "function", "function": "x"},
                {"type": 5, "name": [1], "input_schema": 5},
            ]
        },
        "tool_choice list": {"tool_choice": [1]},
        "tool_choice odd object": {"tool_choice": {"type": 5, "name": [1]}},
        "a 4000-digit integer": {"n": "__BIG__", "max_tokens": "__BIG__"},
        "nested 90 deep": {"extra": "__DEEP__"},
    }
    if wire == "chat":
        out |= {
            "messages string": {"messages": "hi"},
            "messages object": {"messages": {"a": 1}},
            "messages of odd items": {
                "messages": [
                    1,
                    "x",
                    None,
                    {"role": 5, "content": {"a": 1}},
                    {"role": "user", "content": [5, {"type": 5}]},
                    {"role": "assistant", "tool_calls": "x"},
                ]
            },
            "content nested 90 deep": {"messages": [{"role": "user", "content": "__DEEP__"}]},
        }
    elif wire == "messages":
        out |= {
            "messages string": {"messages": "hi"},
            "messages of odd items": {
                "messages": [
                    1,
                    None,
                    {"role": [1], "content": 5},
                    {
                        "role": "user",
                        "content": [
                            5,
                            {"type": 5},
                            {"type": "image", "source": "x"},
                            {"type": "tool_result", "content": 5},
                        ],
                    },
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "input": 5, "name": [1]}],
                    },
                ]
            },
            "system number": {"system": 5},
            "system of odd blocks": {"system": [5, {"type": "text", "text": 5}, {"type": 5}]},
            "system object": {"system": {"a": 1}},
        }
    else:
        out |= {
            "input number": {"input": 5},
            "input object": {"input": {"a": 1}},
            "input of odd items": {
                "input": [
                    5,
                    None,
                    {"type": "function_call", "arguments": 5},
                    {"type": "message", "role": [1], "content": 5},
                    {"type": "message", "content": [5, {"type": 5}]},
                    {"type": "function_call_output", "output": 5},
                    {"type": "custom_tool_call", "input": [1]},
                ]
            },
            "instructions number": {"instructions": 5},
            "instructions list": {"instructions": ["x"]},
        }
    return out


def request_cases(wire: str) -> list[Case]:
    bodies: dict[str, tuple[dict[str, Any], bool]] = {
        "lone surrogate in content": (basic(wire, "a" + S + "b"), True),
        "lone low surrogate alone": (basic(wire, "\udfff"), True),
        "high surrogate at the end": (basic(wire, "x\ud83d"), True),
        "NUL in content": (basic(wire, "a\x00b"), True),
        "lone surrogate in model": ({**basic(wire), "model": "m" + S}, True),
        "NUL in model": ({**basic(wire), "model": "m\x00"}, True),
        "lone surrogate in a key": ({**basic(wire), "x" + S: "v", "metadata": {S: S}}, True),
        "lone surrogates in a tool round": (tool_round(wire), True),
    }
    for name, fields in field_types(wire).items():
        bodies[name] = ({**basic(wire), **fields}, False)
    cases = []
    for stream in (False, True):
        for name, (body, replaced) in bodies.items():
            body = {**body, "stream": True} if stream and "stream" not in body else body
            streamed = body.get("stream") is True
            cases.append(
                Case(
                    f"{wire} request {name}{' streamed' * stream}",
                    wire,
                    dumps(body),
                    GOOD[(wire, streamed)](),
                    streamed,
                    replaced=replaced,
                )
            )
    bad_utf8 = dumps(basic(wire, "__X__")).replace(b'"__X__"', b'"\xff\xfe"')
    cases.append(Case(f"{wire} request invalid UTF-8", wire, bad_utf8, b"", False, status=400))
    too_deep = dumps({**basic(wire), "x": "__TOO_DEEP__"})  # refused by selftaught.http_guard
    cases.append(Case(f"{wire} request nested too deep", wire, too_deep, b"", False, status=400))
    for name, raw in NOT_JSON_NUMBERS.items():  # refused by selftaught.http_guard too
        body = dumps({**basic(wire), "max_tokens": "__X__"}).replace(b'"__X__"', raw)
        cases.append(Case(f"{wire} request max_tokens {name}", wire, body, b"", False, status=400))
    return cases


# ---- hostile upstream replies ------------------------------------------------------------------


def shared_reply_bodies() -> dict[str, bytes]:
    """Plain reply bodies that are no API's shape at all."""
    return {
        "a list": b"[1, 2]",
        "a number": b"5",
        "null": b"null",
        "a string": b'"x"',
        "not JSON": b"{not json",
        "invalid UTF-8": b'{"model": "\xff\xfe"}',
        "nested too deep": RAW["__TOO_DEEP__"],
    }


def chat_replies() -> dict[str, Any]:
    def message(**fields: Any) -> dict[str, Any]:
        return {
            "choices": [
                {"index": 0, "message": {"role": "assistant", **fields}, "finish_reason": "stop"}
            ]
        }

    plain = {
        "choices string": chat_reply(choices="x"),
        "choices empty": chat_reply(choices=[]),
        "choices of a number": chat_reply(choices=[5]),
        "message string": chat_reply(choices=[{"message": "x"}]),
        "content number": chat_reply(**message(content=5)),
        "content of parts": chat_reply(**message(content=["a", {"type": "text", "text": "b"}])),
        "content object": chat_reply(**message(content={"a": 1})),
        "tool_calls object": chat_reply(**message(content="ok", tool_calls={"a": 1})),
        "tool_calls of odd items": chat_reply(**message(content="ok", tool_calls=["x", 5])),
        "finish_reason list": chat_reply(
            choices=[{"message": {"content": "ok"}, "finish_reason": [1]}]
        ),
        "usage list": chat_reply(usage=[1]),
        "usage strings": chat_reply(usage={"prompt_tokens": "3", "completion_tokens": [1]}),
        "usage infinite": chat_reply(
            usage={"prompt_tokens": "__INF__", "completion_tokens": "__NAN__"}
        ),
        "usage too large": chat_reply(usage={"prompt_tokens": 10**30, "completion_tokens": 2**31}),
        "usage negative": chat_reply(usage={"prompt_tokens": -5, "completion_tokens": 1.5}),
        "model list": chat_reply(model=[1]),
        "lone surrogate in content": chat_reply(**message(content="o" + S + "k")),
        "NUL in content": chat_reply(**message(content="o\x00k")),
        "lone surrogate in a key": chat_reply(**{"x" + S: 1}, model="m" + S),
        "error object": chat_reply(error={"message": 5}),
    }
    streams = {
        "usage list": chat_stream(usage=[1, 2]),
        "usage string": chat_stream(usage="x"),
        "usage list mid-stream": chat_stream(chunk(**choice({"content": "ok"}), usage=[1])),
        "usage strings": chat_stream(usage={"prompt_tokens": "3", "completion_tokens": [1]}),
        "usage infinite": chat_stream(usage={"prompt_tokens": "__INF__"}),
        "usage too large": chat_stream(usage={"prompt_tokens": 10**30, "completion_tokens": -1}),
        "model list": chat_stream(chunk(model=[1], **choice({"content": "ok"}))),
        "choices object": chat_stream(chunk(choices={"0": 1})),
        "choices string": chat_stream(chunk(choices="x")),
        "choices of odd items": chat_stream(chunk(choices=[1, None, "x"])),
        "delta string": chat_stream(chunk(**choice("x"))),
        "delta list": chat_stream(chunk(**choice([1]))),
        "content number": chat_stream(chunk(**choice({"content": 5}))),
        "content list": chat_stream(chunk(**choice({"content": ["a"]}))),
        "content object": chat_stream(chunk(**choice({"content": {"text": "x"}}))),
        "tool_calls object": chat_stream(chunk(**choice({"tool_calls": {"a": 1}}))),
        "tool_calls string": chat_stream(chunk(**choice({"tool_calls": "x"}))),
        "tool_calls of odd items": chat_stream(
            chunk(
                **choice(
                    {
                        "tool_calls": [
                            5,
                            {"index": "0", "function": "ls"},
                            {
                                "index": "__INF__",
                                "id": {"a": 1},
                                "function": {"name": 5, "arguments": {"a": 1}},
                            },
                            {
                                "index": 10**30,
                                "id": "c9",
                                "function": {"name": "x", "arguments": "{"},
                            },
                        ]
                    }
                )
            )
        ),
        "finish_reason object": chat_stream(
            chunk(**choice({"content": "ok"}, finish_reason={"a": 1}))
        ),
        "events that are not objects": chat_stream(
            b"data: [1, 2]\n\n", b"data: 5\n\n", b'data: "x"\n\n', b"data: null\n\n"
        ),
        "an event that is not JSON": chat_stream(b"data: {not json\n\n"),
        "an event nested too deep": chat_stream(b"data: " + RAW["__TOO_DEEP__"] + b"\n\n"),
        "invalid UTF-8": chat_stream(b'data: {"choices": [{"delta": {"content": "\xff"}}]}\n\n'),
        "lone surrogate in content": chat_stream(chunk(**choice({"content": "o" + S + "k"}))),
        "NUL in content": chat_stream(chunk(**choice({"content": "o\x00k"}))),
        "lone surrogate in a key and the model": chat_stream(
            chunk(**{"x" + S: 1}, model="m" + S, **choice({"content": "ok"}))
        ),
        "error object": chat_stream(chunk(error={"message": S})),
    }
    return {"plain": plain, "stream": {k: sse(v) for k, v in streams.items()}}


def messages_replies() -> dict[str, Any]:
    def block_events(start: Any, delta: Any, index: Any = 0, delta_index: Any = 0) -> list[Any]:
        return [
            {"type": "content_block_start", "index": index, "content_block": start},
            {"type": "content_block_delta", "index": delta_index, "delta": delta},
            {"type": "content_block_stop", "index": index},
        ]

    text = {"type": "text", "text": ""}
    ok = {"type": "text_delta", "text": "ok"}
    use = {"type": "tool_use", "id": "t1", "name": "sh", "input": {}}
    plain = {
        "content string": messages_reply(content="x"),
        "content of odd blocks": messages_reply(
            content=[
                5,
                "x",
                {"type": "text", "text": 5},
                {"type": "tool_use", "input": 5, "name": [1], "id": {"a": 1}},
            ]
        ),
        "tool input nested too deep": messages_reply(
            content=[{"type": "tool_use", "id": "t1", "name": "sh", "input": "[" * 100_000}]
        ),
        "usage string": messages_reply(usage="x"),
        "usage strings": messages_reply(usage={"input_tokens": "3", "output_tokens": [1]}),
        "usage infinite": messages_reply(
            usage={"input_tokens": "__INF__", "output_tokens": "__NAN__"}
        ),
        "usage too large": messages_reply(
            usage={"input_tokens": 2**31, "output_tokens": 10**30, "cache_read_input_tokens": 2**31}
        ),
        "model object": messages_reply(model={"a": 1}),
        "stop_reason list": messages_reply(stop_reason=[1]),
        "lone surrogate in text and key": messages_reply(
            content=[{"type": "text", "text": "o" + S + "k", "k" + S: 1}]
        ),
        "NUL in text": messages_reply(content=[{"type": "text", "text": "o\x00k"}]),
    }
    streams = {
        "index not a number": messages_stream(*block_events(text, ok, "zero", "zero")),
        "index fractional": messages_stream(*block_events(text, ok, 1.5, 1.5)),
        "index null": messages_stream(*block_events(text, ok, None, None)),
        "index negative": messages_stream(*block_events(text, ok, -1, -1)),
        "index list": messages_stream(*block_events(text, ok, [0], [0])),
        "index too large": messages_stream(*block_events(text, ok, 10**30, 10**30)),
        "index infinite": messages_stream(*block_events(text, ok, "__INF__", "__INF__")),
        "content_block string": messages_stream(*block_events("x", ok)),
        "content_block type number": messages_stream(*block_events({"type": 5}, ok)),
        "delta string": messages_stream(*block_events(text, "x")),
        "delta text number": messages_stream(
            *block_events(text, {"type": "text_delta", "text": 5})
        ),
        "partial_json object": messages_stream(
            *block_events(use, {"type": "input_json_delta", "partial_json": {"a": 1}})
        ),
        "partial_json nested too deep": messages_stream(
            *block_events(use, {"type": "input_json_delta", "partial_json": "[" * 100_000})
        ),
        "message string": messages_stream(start="x"),
        "message of odd fields": messages_stream(start={"model": [1], "usage": "x"}),
        "usage strings": messages_stream(start={"model": "m", "usage": {"input_tokens": "3"}}),
        "usage infinite": messages_stream(
            start={"usage": {"input_tokens": "__INF__", "output_tokens": "__NAN__"}}
        ),
        "usage too large": messages_stream(start={"usage": {"input_tokens": 10**30}}),
        "message_delta delta string": messages_stream(delta="x"),
        "stop_reason object": messages_stream(delta={"stop_reason": {"a": 1}}),
        "type not a string": messages_stream({"type": 5}, {"type": [1]}),
        "events that are not objects": messages_stream(b"data: [1]\n\n", b"data: null\n\n"),
        "lone surrogate in text": messages_stream(
            *block_events(text, {"type": "text_delta", "text": "o" + S + "k"})
        ),
        "NUL in text": messages_stream(
            *block_events(text, {"type": "text_delta", "text": "o\x00k"})
        ),
        "error event": messages_stream({"type": "error", "error": {"message": S}}),
    }
    return {"plain": plain, "stream": {k: sse(v, named=True) for k, v in streams.items()}}


def responses_replies() -> dict[str, Any]:
    def done(item: Any, index: Any = 0) -> dict[str, Any]:
        return {"type": "response.output_item.done", "output_index": index, "item": item}

    plain = {
        "output string": responses_reply(output="x"),
        "output of odd items": responses_reply(
            output=[
                5,
                "x",
                {"type": "message", "content": 5},
                {"type": "function_call", "arguments": 5, "name": [1]},
            ]
        ),
        "arguments nested too deep": responses_reply(
            output=[
                {"type": "function_call", "call_id": "c", "name": "sh", "arguments": "[" * 100_000}
            ]
        ),
        "usage string": responses_reply(usage="x"),
        "usage infinite": responses_reply(usage={"input_tokens": "__INF__"}),
        "incomplete_details string": responses_reply(status="incomplete", incomplete_details="x"),
        "status list": responses_reply(status=[1]),
        "model list": responses_reply(model=[1]),
        "error number": responses_reply(error=5),
        "lone surrogate in text": responses_reply(
            output=[
                {"type": "message", "content": [{"type": "output_text", "text": "o" + S + "k"}]}
            ]
        ),
    }
    streams = {
        "output_index string": responses_stream(done(ITEM, "0")),
        "output_index infinite": responses_stream(done(ITEM, "__INF__")),
        "output_index list": responses_stream(done(ITEM, [0])),
        "item string": responses_stream(done("x")),
        "item content number": responses_stream(done({"type": "message", "content": 5})),
        "item call of odd fields": responses_stream(
            done({"type": "function_call", "arguments": 5, "name": [1]})
        ),
        "delta object": responses_stream({"type": "response.output_text.delta", "delta": {"a": 1}}),
        "response string": responses_stream(final="x"),
        "response of odd fields": responses_stream(final={"model": 5, "output": 5}),
        "response output string": responses_stream(final={"output": "abc"}),
        "response output of odd items": responses_stream(
            final={"output": [{"type": "message", "content": 5}, 7]}
        ),
        "response usage strings": responses_stream(
            final={"output": [ITEM], "usage": {"input_tokens": "3"}}
        ),
        "incomplete_details string": responses_stream(
            final={"status": "incomplete", "incomplete_details": "x"}
        ),
        "failed with an odd error": [
            {"type": "response.created", "response": {"model": "m"}},
            {"type": "response.failed", "response": {"error": 5}},
        ],
        "type not a string": responses_stream({"type": 5}, {"type": ["x"]}),
        "lone surrogate in text": responses_stream(
            {"type": "response.output_text.delta", "delta": "o" + S + "k"},
            done({"type": "message", "content": [{"type": "output_text", "text": "o" + S}]}),
        ),
    }
    return {"plain": plain, "stream": {k: sse(v, named=True) for k, v in streams.items()}}


REPLIES: dict[str, Callable[[], dict[str, Any]]] = {
    "chat": chat_replies,
    "messages": messages_replies,
    "responses": responses_replies,
}


def reply_cases(wire: str) -> list[Case]:
    replies = REPLIES[wire]()
    cases = []
    plain = {**{k: dumps(v) for k, v in replies["plain"].items()}, **shared_reply_bodies()}
    for name, reply in plain.items():
        cases.append(
            Case(
                f"{wire} reply {name}",
                wire,
                dumps(basic(wire)),
                reply,
                False,
                replaced="surrogate" in name or "NUL" in name,
            )
        )
    for name, reply in replies["stream"].items():
        request = dumps({**basic(wire), "stream": True})
        cases.append(
            Case(
                f"{wire} stream {name}",
                wire,
                request,
                reply,
                True,
                replaced="surrogate" in name or "NUL" in name,
            )
        )
    return cases


# ---- driving the proxy -----------------------------------------------------------------------


@contextlib.contextmanager
def scripted_proxy(tmp_path: Path, log_at: Path | str, cases: list[Case]) -> Iterator[str]:
    """A proxy (an adopted skill injected, so injection reads the hostile fields too) in
    front of an upstream that answers each case's reply, found by its x-request-id."""
    by_name = {case.name: case for case in cases}

    def answer(handler: Any, _body: Any) -> None:
        case = by_name[handler.headers["x-request-id"]]
        handler.send_response(200)
        handler.send_header("Content-Type", case.content_type)
        handler.send_header("Content-Length", str(len(case.reply)))
        handler.end_headers()
        handler.wfile.write(case.reply)

    adopt(tmp_path / "home", "demo", "Answer briefly.", "", "1")
    routes = {f"/v1/{path}": answer for path in PATHS.values()}
    with FakeUpstream(routes=routes) as upstream:
        config = ProxyConfig(
            upstream=f"{upstream.base_url}#m",
            project="demo",
            port=0,
            log_path=log_at,
            home=tmp_path / "home",
        )
        with proxy_in_background(config) as (url, _app):
            yield url


@dataclass
class Outcome:
    case: Case
    status: int
    content: bytes
    id: str | None
    problems: list[str] = field(default_factory=list)


def send(url: str, case: Case) -> Outcome:
    headers = {"content-type": "application/json", "x-request-id": case.name}
    try:
        response = loopback.post(
            f"{url}/{PATHS[case.wire]}", content=case.request, headers=headers, timeout=60
        )
    except httpx.HTTPError as err:  # a stream the proxy cut
        return Outcome(case, 0, b"", None, [f"no answer: {type(err).__name__}: {err}"])
    out = Outcome(case, response.status_code, response.content, response.headers.get(ID_HEADER))
    if response.status_code != case.status:
        out.problems.append(f"status {response.status_code}, not {case.status}")
    elif case.status == 200 and response.content != case.reply:
        out.problems.append(f"the client got {len(response.content)} of {len(case.reply)} bytes")
    return out


def settled(url: str, answered: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """/health once every answered request's row is accounted for."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = health(url)
        log = stats["log"]
        done = log["logged"] + log["failures"] + log["dropped"] + log["spooled"]
        if done >= answered or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def check(url: str, log_at: Path | str, cases: list[Case]) -> tuple[list[str], list[Any]]:
    """Send every case; (what went wrong, the stored rows of the answered ones)."""
    outcomes = [send(url, case) for case in cases]
    answered = [o for o in outcomes if 200 <= o.status < 300]
    stats = settled(url, len(answered))
    with TaskLog(log_at) as log:
        rows = {row.id: row for row in log.rows_by_id([o.id for o in answered if o.id])}
    for o in answered:
        row = rows.get(o.id or "")
        if row is None:
            o.problems.append("answered 2xx and never logged")
        elif o.case.replaced and not row.meta.get("replaced_chars"):
            o.problems.append(f"no replaced_chars on its row: {row.meta}")
    problems = [f"{o.case.name}: {p}" for o in outcomes for p in o.problems]
    counters = {k: stats["log"][k] for k in ("failures", "dropped", "salvaged")}
    if any(counters.values()):
        problems.append(f"/health: {counters}")
    return problems, list(rows.values())


@pytest.mark.parametrize("wire", WIRES)
def test_every_hostile_exchange_answered_2xx_is_logged(tmp_path, log_at, wire):
    cases = request_cases(wire) + reply_cases(wire)
    with scripted_proxy(tmp_path, log_at, cases) as url:
        problems, rows = check(url, log_at, cases)
        stats = health(url)
    assert problems == [], "\n".join(problems)
    assert len(rows) == sum(case.status == 200 for case in cases)
    assert stats["replaced_chars"] >= sum(case.replaced for case in cases)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("wire", WIRES)
def test_a_lone_surrogate_is_answered_and_logged_as_u_fffd(tmp_path, log_at, wire, stream):
    body = {**basic(wire, "a" + S + "b"), "model": "m" + S, "metadata": {"k" + S: "v\x00"}}
    body = {**body, "stream": True} if stream else body
    case = Case("surrogate", wire, dumps(body), GOOD[(wire, stream)](), stream)
    with scripted_proxy(tmp_path, log_at, [case]) as url:
        outcome = send(url, case)
        stats = settled(url, 1)
    assert outcome.problems == [] and stats["log"]["failures"] == 0
    with TaskLog(log_at) as log:
        row = log.get(outcome.id or "")
    assert row.is_task and row.reply == "ok" and row.messages[-1]["content"] == "a\ufffdb"
    assert row.meta["request"]["model"] == "m\ufffd"  # the row's model is the reply's
    assert row.meta["request"]["metadata"] == {"k\ufffd": "v\ufffd"}
    assert row.meta["replaced_chars"] == 4 and stats["replaced_chars"] == 4


@pytest.mark.parametrize(
    ("wire", "events"),
    [
        ("chat", sse(chat_stream(usage=[1, 2]))),
        (
            "messages",
            sse(
                messages_stream(
                    {
                        "type": "content_block_start",
                        "index": "zero",
                        "content_block": {"type": "text", "text": ""},
                    },
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": "ok"},
                    },
                ),
                named=True,
            ),
        ),
        (
            "responses",
            sse(
                responses_stream(
                    {"type": "response.output_text.delta", "delta": "ok"},
                    {"type": "response.output_item.done", "output_index": "zero", "item": ITEM},
                ),
                named=True,
            ),
        ),
    ],
    ids=["chat-usage-list", "messages-index-string", "responses-index-string"],
)
def test_a_malformed_event_never_cuts_the_stream_short_nor_loses_the_row(
    tmp_path, log_at, wire, events
):
    case = Case("malformed", wire, dumps({**basic(wire), "stream": True}), events, True)
    with scripted_proxy(tmp_path, log_at, [case]) as url:
        outcome = send(url, case)
        stats = settled(url, 1)
    assert outcome.problems == []  # every byte, the stream's end included
    with TaskLog(log_at) as log:
        row = log.get(outcome.id or "")
    assert row.is_task and row.reply == "ok" and stats["log"]["failures"] == 0


def test_a_row_that_cannot_be_built_is_an_error_row_and_the_answer_is_whole(
    tmp_path, log_at, monkeypatch
):
    def unreadable(*_: Any) -> Any:
        raise TypeError("a reply of no known shape")

    monkeypatch.setattr(proxy_wire.ChatStream, "result", unreadable)
    monkeypatch.setattr(proxy_wire.ChatWire, "reply", unreadable)
    cases = [
        Case(
            f"unbuildable {s}",
            "chat",
            dumps({**basic("chat"), "stream": s}),
            GOOD[("chat", s)](),
            s,
        )
        for s in (False, True)
    ]
    with scripted_proxy(tmp_path, log_at, cases) as url:
        outcomes = [send(url, case) for case in cases]
        stats = settled(url, 2)
    assert [o.problems for o in outcomes] == [[], []]
    with TaskLog(log_at) as log:
        rows = [log.get(o.id or "") for o in outcomes]
    for row in rows:
        assert row.error and row.error.startswith("the proxy could not read the upstream")
        assert "no known shape" in row.meta["log_error"] and row.messages[-1]["content"] == "hi"
    assert stats["rows_not_read"] == 2 and stats["log"]["failures"] == 0


def test_a_row_the_log_refuses_is_stored_made_storable_or_as_an_error_row(log_at, tmp_path):
    """The writer's last resort, for rows that reach it unstorable (not through the proxy's
    parsing): made storable field by field, else a minimal error row; never lost."""
    deep: Any = "bottom"
    for _ in range(5000):  # deeper than any recursion the redactor or JSON can take
        deep = [deep]
    odd = Interaction(
        [{"role": "user", "content": "a" + S, "k" + S: 1}],
        "r\x00",
        project="demo",
        model="m" + S,
        tool_calls=[{"id": S}],
        client="c\x00",
    )
    too_deep = Interaction([{"role": "user", "content": deep}], "r", project="demo")
    with TaskLog(log_at) as log:
        writer = LogWriter(log, home=tmp_path)
        outcomes = [writer.submit(odd), writer.submit(too_deep)]
        assert writer.flush(60)
        writer.close()
        assert [o.result() for o in outcomes] == ["logged", "logged"]
        stored, minimal = log.get(odd.id), log.get(too_deep.id)
    assert writer.snapshot()["failures"] == 0 and writer.snapshot()["salvaged"] == 2
    assert stored.messages == [{"role": "user", "content": "a\ufffd", "k\ufffd": 1}]
    assert (stored.reply, stored.model, stored.client) == ("r\ufffd", "m\ufffd", "c\ufffd")
    assert stored.tool_calls == [{"id": "\ufffd"}] and stored.meta["replaced_chars"] == 6
    assert minimal.messages == [] and minimal.error.startswith("the log could not store")
    assert minimal.meta["log_error"] == minimal.error and not minimal.is_task


def test_the_spool_keeps_unstorable_rows_while_the_database_is_away(pg_url, tmp_path):
    from selftaught.sleep.store import versions
    from tests.pg import Relay

    relay = Relay(pg_url)
    try:
        with TaskLog(relay.url) as log:
            writer = LogWriter(log, home=tmp_path)
            relay.cut()
            rows = [
                Interaction([{"role": "user", "content": f"q{i} {S}"}], "r\x00", project="demo")
                for i in range(3)
            ]
            outcomes = [writer.submit(row) for row in rows]
            assert [o.result(timeout=60) for o in outcomes] == ["spooled"] * 3
            relay.restore()
            deadline = time.monotonic() + 90
            while writer.snapshot()["spool_waiting"] and time.monotonic() < deadline:
                time.sleep(0.1)
            writer.close()
            assert writer.snapshot()["failures"] == 0
        with TaskLog(pg_url) as log:
            stored = sorted(log.query(), key=lambda r: r.messages[0]["content"])
        assert [r.messages[0]["content"] for r in stored] == [f"q{i} \ufffd" for i in range(3)]
        assert all(r.reply == "r\ufffd" for r in stored)
    finally:
        versions.forget(relay.url)
        relay.close()


@pytest.mark.parametrize("wire", WIRES)
def test_a_giant_stream_line_is_skipped_in_linear_time(wire):
    """An upstream line of 64 MiB, fed as it passes in 64 KiB pieces: not read for the log
    (counted), the events after it read as usual. Before, each piece re-copied the line so
    far: quadratic, tens of seconds of a blocked event loop."""
    acc = proxy_wire.WIRES[wire].stream()
    piece = b"x" * 65536
    started = time.monotonic()
    acc.feed(b'data: {"type": "')
    for _ in range(1024):
        acc.feed(piece)
    acc.feed(b'"}\n\n' + GOOD[(wire, True)]())
    elapsed = time.monotonic() - started
    assert acc.result().text == "ok" and acc.finished and acc.malformed == 1
    assert elapsed < 10, f"{elapsed:.1f} s"


def test_a_request_the_proxy_cannot_read_is_still_answered_or_refused_and_logged(
    tmp_path, log_at, monkeypatch
):
    """Whatever the request's fields, the proxy answers (or refuses with a 4xx) and logs: a
    body the log cannot read is an error row saying why; one the skill cannot be injected
    into is a 400, logged. Never a 500 without a row."""

    def unreadable(*_: Any) -> Any:
        raise TypeError("fields of no known shape")

    monkeypatch.setattr(proxy_wire.ChatWire, "logged", unreadable)
    monkeypatch.setattr(proxy_wire.MessagesWire, "inject", unreadable)
    cases = [
        Case("unreadable", "chat", dumps(basic("chat")), GOOD[("chat", False)](), False),
        Case("uninjectable", "messages", dumps(basic("messages")), b"", False, status=400),
    ]
    with scripted_proxy(tmp_path, log_at, cases) as url:
        outcomes = [send(url, case) for case in cases]
        stats = settled(url, 2)
    assert [o.problems for o in outcomes] == [[], []]
    with TaskLog(log_at) as log:
        answered, refused = (log.get(o.id or "") for o in outcomes)
    assert answered.error.startswith("the proxy could not read the request: TypeError")
    assert answered.messages == [] and answered.reply == "ok" and not answered.is_task
    assert refused.error.startswith("the proxy could not read the request: TypeError")
    assert refused.error_status == 400 and refused.messages[-1]["content"] == "hi"
    assert stats["rows_not_read"] == 1 and stats["log"]["failures"] == 0


def test_feedback_with_a_lone_surrogate_is_stored_as_u_fffd(tmp_path, log_at):
    body = {**basic("chat"), "stream": False}
    case = Case("for-feedback", "chat", dumps(body), GOOD[("chat", False)](), False)
    with scripted_proxy(tmp_path, log_at, [case]) as url:
        outcome = send(url, case)
        settled(url, 1)
        feedback = dumps({"id": outcome.id, "comment": "wrong" + S, "reference": "4" + S})
        answer = loopback.post(
            f"{url}/feedback", content=feedback, headers={"content-type": "application/json"}
        )
    assert answer.status_code == 200, answer.text
    with TaskLog(log_at) as log:
        fb = log.get(outcome.id or "").feedback
    assert (fb.comment, fb.reference) == ("wrong\ufffd", "4\ufffd")


def test_feedback_scores_must_be_finite_numbers_from_0_to_1(tmp_path, log_at):
    """Issue 63, class 8: a score of 1e400 was a 500 with a traceback; NaN and ±Infinity were
    stored. Each is now a 400 in one sentence, and nothing is stored; so is a score out of
    0..1, and a number JSON cannot spell in any field."""
    case = Case("for-feedback", "chat", dumps(basic("chat")), GOOD[("chat", False)](), False)
    with scripted_proxy(tmp_path, log_at, [case]) as url:
        row = send(url, case).id
        settled(url, 1)

        def give(raw: bytes, field: str = "score") -> httpx.Response:
            body = dumps({"id": row, field: "__X__"}).replace(b'"__X__"', raw)
            headers = {"content-type": "application/json"}
            return loopback.post(f"{url}/feedback", content=body, headers=headers, timeout=30)

        refused = {name: give(raw) for name, raw in NOT_JSON_NUMBERS.items()}
        refused |= {f"score {raw!r}": give(raw) for raw in (b"1.5", b"-0.25", b"1e308")}
        refused["NaN in another field"] = give(b"NaN", "comment")
        kept = give(b"0.75")
    for name, answer in refused.items():
        message = answer.json()["error"]["message"]
        assert answer.status_code == 400 and "\n" not in message, (name, answer.text)
        assert "Traceback" not in message, name
    assert "0 to 1" in refused["score b'1.5'"].json()["error"]["message"]
    assert kept.status_code == 200, kept.text
    with TaskLog(log_at) as log:
        assert log.get(row or "").feedback.score == 0.75


# ---- round five: the endpoints added since this file was written ------------------------------
# `selftaught watch` (GET /, /live.js, /api/state) and the MCP server's tools (`selftaught
# mcp`); the commands added since (`sleep log forget`, `sleep feedback --reject-signal`, ...)
# are in tests/test_cli_hostile.py. The proxy's own routes are those above.

HOSTILE_QUERIES = [
    "since=1e400",
    "since=NaN",
    "since=-Infinity",
    "since=" + "9" * 5000,
    "gen=99999999999999999999999999",
    "since=-99999999999999999999999",
    "rev=%ED%A0%80",  # a lone surrogate, UTF-8-encoded
    "since=%FF%FE",  # not UTF-8
    "since=1&since=2",
    "x=%00",
]


def strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_watch_answers_hostile_queries_with_json_or_a_4xx(tmp_path):
    from tests.report_fixtures import optimize_run
    from tests.test_report_live import Replay, client

    optimize_run(tmp_path / "finished")
    replay = Replay(tmp_path / "finished", tmp_path / "run")
    replay.append(3)
    watch = client(replay.root)
    for path in ("/", "/live.js"):
        assert watch.get(f"{path}?{HOSTILE_QUERIES[0]}").status_code == 200
    for query in HOSTILE_QUERIES:
        answer = watch.get(f"/api/state?{query}")
        assert answer.status_code in (200, 422), (query, answer.text[:300])
        strict_json(answer.text)  # a 422 says why in JSON too


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ({"comment": "wrong" + S}, {"comment": "wrong\ufffd"}),
        ({"reference": "4" + S, "thumb": "down"}, {"reference": "4\ufffd", "thumb": "down"}),
        ({"comment": "a\x00b"}, {"comment": "a\ufffdb"}),  # PostgreSQL refuses NUL in text
        ({"comment": "\udfff" * 1000}, {"comment": "\ufffd" * 1000}),
    ],
    ids=["surrogate comment", "surrogate reference", "NUL", "many surrogates"],
)
def test_mcp_feedback_with_hostile_bytes_is_stored_as_u_fffd(tmp_path, log_at, given, stored):
    """An agent's `give_feedback` holding a lone surrogate or a NUL raised an encoding error
    and stored nothing; now it is stored as the proxy stores it."""
    from selftaught.sleep.mcp_server import SleepTools

    with TaskLog(log_at) as log:
        row = Interaction([{"role": "user", "content": "q"}], "a", project="demo")
        row.source, row.session_id = "proxy", "sess-1"
        log.add(row)
    tools = SleepTools(project="demo", log_path=log_at, env={}, folder=tmp_path)
    answer = tools.give_feedback(session_id="sess-1", **given)
    assert answer["attached_to"] == row.id and answer["feedback"] == stored
    with TaskLog(log_at) as log:
        fb = log.get(row.id).feedback
    assert {k: getattr(fb, k) for k in stored} == stored


@pytest.mark.parametrize(
    "session_id",
    [S, "s" + S, "x" * 100_000, "a\x00b", "../" * 50, "1e400"],
    ids=["surrogate", "surrogate inside", "100k", "NUL", "dots", "a number's spelling"],
)
def test_mcp_feedback_with_a_hostile_session_id_is_one_sentence(tmp_path, log_at, session_id):
    from selftaught.errors import SelftaughtError
    from selftaught.sleep.mcp_server import SleepTools

    tools = SleepTools(project="demo", log_path=log_at, env={}, folder=tmp_path)
    with pytest.raises(SelftaughtError) as err:
        tools.give_feedback(thumb="up", session_id=session_id)
    message = str(err.value)
    assert "\n" not in message and len(message) < 600, message
    with TaskLog(log_at) as log:
        assert log.count() == 0


def test_mcp_tools_over_the_wire_refuse_hostile_arguments(tmp_path, log_at):
    """JSON-RPC bytes written to a real `selftaught mcp` (what a hostile agent can send; an
    MCP client library refuses to encode most of them): numbers JSON cannot spell, wrong types
    and a 5000-character id are tool errors, never a traceback; a NUL is stored as U+FFFD
    (PostgreSQL refused it); the server answers every call it can read and goes on."""
    import queue
    import subprocess
    import sys
    import threading

    from mcp.types import LATEST_PROTOCOL_VERSION

    import selftaught

    with TaskLog(log_at) as log:
        row = Interaction([{"role": "user", "content": "q"}], "a", project="demo")
        row.source, row.session_id = "proxy", "sess-1"
        log.add(row)
    start = {"protocolVersion": LATEST_PROTOCOL_VERSION, "capabilities": {},
             "clientInfo": {"name": "hostile", "version": "1"}}  # fmt: skip
    lines = [
        dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": start}),
        dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ]
    calls = {
        "number thumb": {"thumb": "__INF__"},
        "NaN thumb": {"thumb": "__NAN__"},
        "deep reference": {"reference": "__DEEP__"},
        "object comment": {"comment": {"a": [1, "__BIG__"]}},
        "huge session": {"thumb": "up", "session_id": "9" * 5000},
        "NUL comment": {"comment": "a\x00b"},
        # lines the MCP SDK's JSON parser refuses: dropped unanswered, the server goes on
        "too deep reference": {"reference": "__TOO_DEEP__"},
        "surrogate comment": {"comment": "wrong" + S},
    }
    unread = {"too deep reference", "surrogate comment"}
    for i, args in enumerate(calls.values(), start=1):
        params = {"name": "give_feedback", "arguments": {"session_id": "sess-1", **args}}
        lines.append(dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}))
    after = len(calls) + 1  # a last call: the server still answers
    lines.append(dumps({"jsonrpc": "2.0", "id": after, "method": "tools/call",
                        "params": {"name": "adopted_skill", "arguments": {}}}))  # fmt: skip
    environ = {
        "PYTHONPATH": str(Path(selftaught.__file__).parents[1]),
        "HOME": str(tmp_path),
        "SELFTAUGHT_HOME": str(tmp_path / "home"),
        "SELFTAUGHT_LOG": str(log_at),
        "CLAUDE_CONFIG_DIR": str(tmp_path / "claude"),
        "CODEX_HOME": str(tmp_path / "codex"),
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "selftaught", "mcp", "--project", "demo"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environ,
        cwd=tmp_path,
    )
    assert server.stdin is not None and server.stdout is not None
    said: queue.Queue[bytes] = queue.Queue()
    stdout = server.stdout
    threading.Thread(target=lambda: [said.put(line) for line in stdout], daemon=True).start()
    server.stdin.write(b"\n".join(lines) + b"\n")
    server.stdin.flush()
    answers: dict[Any, Any] = {}
    names = dict(enumerate(calls, start=1))
    wanted = {i for i, name in names.items() if name not in unread} | {after}
    deadline = time.monotonic() + 90
    while not wanted <= set(answers) and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            message = json.loads(said.get(timeout=1))
            answers[message.get("id")] = message
    server.stdin.close()
    server.wait(timeout=60)
    stderr = server.stderr.read() if server.stderr else b""
    assert b"Traceback" not in stderr, stderr.decode(errors="replace")[-2000:]
    assert wanted <= set(answers), ([names.get(i) for i in wanted - set(answers)], stderr[-2000:])
    for i, name in names.items():
        if name in unread:
            continue
        text = json.dumps(answers[i])
        assert "Traceback" not in text, (name, text[:600])
        failed = "error" in answers[i] or answers[i]["result"].get("isError")
        assert failed == (name != "NUL comment"), (name, text[:600])
    assert not answers[after]["result"].get("isError")
    with TaskLog(log_at) as log:
        assert log.get(row.id).feedback.comment == "a\ufffdb"
