"""Tools through the OpenAI-compatible backend (a real HTTP server on loopback), the response
cache and the usage ledger: `tools`/`tool_choice` go out only when set, `tool_calls` come back
in the OpenAI shape, malformed ones are reported, and wrappers keep every field."""

from __future__ import annotations

import asyncio
import json

from selftaught.models import GenerationParams, RetryPolicy, TrackedModel, UsageLedger
from selftaught.models.base import AsyncChatModel, Completion, Message
from selftaught.models.cache import CachedModel, ResponseCache
from selftaught.models.openai_compat import OpenAICompatModel
from tests.fault_server import FaultServer

FAST = RetryPolicy(max_retries=2, base_delay_s=0.01, max_delay_s=0.02)
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {}, "b": {}}},
    },
}
CALL = {"id": "call_a1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
TOOL_PARAMS = GenerationParams(max_tokens=20, tools=[ADD], tool_choice="auto")
HISTORY: list[Message] = [
    {"role": "user", "content": "Add 2 and 3."},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_a1", "content": "5"},
]


def make(server: FaultServer) -> OpenAICompatModel:
    return OpenAICompatModel("fake-model", base_url=server.base_url, retry=FAST, timeout_s=2)


def calling(messages: list[dict]) -> dict:
    return {"tool_calls": [CALL]}


def test_plain_requests_send_no_tool_keys():
    with FaultServer() as server:
        model = make(server)
        model.chat([{"role": "user", "content": "hi"}], GenerationParams(max_tokens=5))
        # an empty tools list is no tools (servers refuse [] and a tool_choice without tools)
        no_tools = GenerationParams(max_tokens=5, tools=[], tool_choice="auto")
        model.chat([{"role": "user", "content": "hi"}], no_tools)
    for body in server.requests:
        assert set(body) == {"model", "messages", "max_tokens", "temperature", "top_p"}


def test_tools_go_out_and_tool_calls_come_back_in_the_openai_shape():
    with FaultServer(calling) as server:
        c = make(server).chat(HISTORY, TOOL_PARAMS)
    (body,) = server.requests
    assert body["tools"] == [ADD] and body["tool_choice"] == "auto"
    assert body["messages"] == HISTORY  # tool_calls and tool turns pass through as they are
    assert c.tool_calls == [CALL] and c.finish_reason == "tool_calls"
    assert c.text == "" and c.retries == 0  # a reply of calls alone is not an "empty reply"
    assert c.tool_call_errors is None


def test_a_server_that_says_stop_for_tool_calls_is_normalized():
    with FaultServer(lambda m: {"tool_calls": [CALL], "finish_reason": "stop"}) as server:
        c = make(server).chat(HISTORY, TOOL_PARAMS)
    assert c.finish_reason == "tool_calls" and c.tool_calls == [CALL]


def test_malformed_server_calls_are_reported_not_returned():
    bad = {"id": "x", "type": "function", "function": {"name": "add", "arguments": '{"a": '}}
    unknown = {"id": "y", "type": "function", "function": {"name": "rm", "arguments": "{}"}}
    with FaultServer(lambda m: {"content": "hm", "tool_calls": [bad, unknown]}) as server:
        c = make(server).chat(HISTORY, TOOL_PARAMS)
    assert c.tool_calls is None and c.finish_reason == "stop" and c.text == "hm"
    assert c.tool_call_errors is not None
    assert [e["index"] for e in c.tool_call_errors] == [0, 1]
    assert "not valid JSON" in c.tool_call_errors[0]["error"]
    assert "unknown tool 'rm'" in c.tool_call_errors[1]["error"]
    assert c.extra["malformed_tool_calls"][0]["id"] == "x"


def test_a_truncated_tool_call_is_reported():
    cut = {"tool_calls": [CALL], "finish_reason": "length"}
    with FaultServer(lambda m: cut) as server:
        c = make(server).chat(HISTORY, TOOL_PARAMS)
    assert c.truncated and c.tool_calls is None
    assert c.tool_call_errors and "max_tokens" in c.tool_call_errors[-1]["error"]


def test_the_n_path_carries_tools_and_keeps_choices_of_calls_alone():
    with FaultServer(calling, n_mode="support") as server:
        out = asyncio.run(make(server).achat_n(HISTORY, TOOL_PARAMS, 3))
    assert server.chat_requests() == 1  # one request; no "empty" choice topped up
    (body,) = server.requests
    assert body["n"] == 3 and body["tools"] == [ADD]
    assert all(c.tool_calls == [CALL] and c.finish_reason == "tool_calls" for c in out)
    assert sum(c.completion_tokens for c in out) == 6  # the fake charges 2 per choice


class Scripted(AsyncChatModel):
    """Answers with one tool call (or text when no tools are offered); counts calls."""

    name = "scripted"

    def __init__(self) -> None:
        self.calls = 0

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        self.calls += 1
        if not params.tools:
            return Completion(text="plain", prompt_tokens=3, completion_tokens=1)
        return Completion(
            text="",
            prompt_tokens=7,
            completion_tokens=4,
            finish_reason="tool_calls",
            tool_calls=[json.loads(json.dumps(CALL))],
        )


def test_cache_round_trips_tool_calls_and_errors(tmp_path):
    inner = Scripted()
    model = CachedModel(inner, ResponseCache(tmp_path / "cache.sqlite"))
    first = model.chat(HISTORY, TOOL_PARAMS)
    again = model.chat(HISTORY, TOOL_PARAMS)
    assert inner.calls == 1 and again.cached  # a reply of calls alone (no text) is cached
    assert again.tool_calls == [CALL] and again.finish_reason == "tool_calls"
    assert first.tool_calls == again.tool_calls
    # the same messages without tools are another key: the plain reply, not the calls
    plain = model.chat(HISTORY, GenerationParams(max_tokens=20))
    assert inner.calls == 2 and plain.text == "plain" and plain.tool_calls is None
    # malformed reports survive a round trip too
    cache = ResponseCache(tmp_path / "other.sqlite")
    errors = [{"index": 0, "error": "not valid JSON", "raw": "{"}]
    cache.put("k", Completion(text="<tool_call>{</tool_call>", tool_call_errors=errors))
    got = cache.get("k")
    assert got is not None and got.tool_call_errors == errors and got.tool_calls is None
    # greedy n copies each get their own calls
    out = asyncio.run(model.achat_n(HISTORY, TOOL_PARAMS, 2))
    out[1].tool_calls[0]["id"] = "changed"  # type: ignore[index]
    assert out[0].tool_calls[0]["id"] == "call_a1"  # type: ignore[index]


def test_tracked_model_forwards_tools_and_tool_calls():
    seen: list[GenerationParams] = []

    class Recording(Scripted):
        async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
            seen.append(params)
            return await super().achat(messages, params)

    ledger = UsageLedger()
    c = TrackedModel(Recording(), ledger, "target").chat(HISTORY, TOOL_PARAMS)
    assert seen[0].tools == [ADD] and seen[0].tool_choice == "auto"
    assert c.tool_calls == [CALL]
    assert ledger.roles["target"].calls == 1 and ledger.roles["target"].completion_tokens == 4
