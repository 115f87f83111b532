"""`selftaught serve` driven as an agent by the official openai client: `tools` reach the
model, `tool_calls` come back (plain and streamed) with finish_reason "tool_calls", and the
tool turns of the next request reach the model as sent."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from tests import loopback

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from selftaught.models import Completion, GenerationParams, Message  # noqa: E402
from selftaught.models.base import AsyncChatModel  # noqa: E402
from selftaught.serve import serve_in_background  # noqa: E402

NAME = "scripted-agent"
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


class AgentModel(AsyncChatModel):
    """Offered tools, it calls add on the two numbers of the question (and says so when the
    question says "explain"); given a tool result, it answers with it; records every call."""

    name = NAME

    def __init__(self) -> None:
        self.seen: list[tuple[list[Message], GenerationParams]] = []

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        self.seen.append((messages, params))
        last = messages[-1]
        if last["role"] == "tool":
            return Completion(text=f"The sum is {last['content']}.", completion_tokens=4)
        if not params.tools:
            return Completion(text="no tools", completion_tokens=2)
        a, b = (int(w) for w in last["content"].split() if w.isdigit())
        calls = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b + i})},
            }
            for i in range(2 if "twice" in last["content"] else 1)
        ]
        text = "Let me add them." if "explain" in last["content"] else ""
        return Completion(
            text=text,
            prompt_tokens=30,
            completion_tokens=12,
            finish_reason="tool_calls",
            tool_calls=calls,
        )


@pytest.fixture(scope="module")
def agent() -> AgentModel:
    return AgentModel()


@pytest.fixture(scope="module")
def base_url(agent: AgentModel) -> Iterator[str]:
    with serve_in_background(agent, NAME) as url:
        yield url


@pytest.fixture()
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=10)


def test_an_openai_client_runs_a_tool_loop(client: openai.OpenAI, agent: AgentModel):
    messages: list = [{"role": "user", "content": "add 48213 and 91377"}]
    first = client.chat.completions.create(
        model=NAME, messages=messages, tools=[ADD], tool_choice="auto"
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None  # OpenAI's shape for a reply of calls alone
    (call,) = choice.message.tool_calls
    assert call.id == "call_0" and call.type == "function" and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 48213, "b": 91377}
    sent_messages, sent = agent.seen[-1]
    assert sent.tools == [ADD] and sent.tool_choice == "auto"
    # the agent runs the tool and sends the result back
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "139590"},
    ]
    second = client.chat.completions.create(model=NAME, messages=messages, tools=[ADD])
    assert second.choices[0].message.content == "The sum is 139590."
    assert (
        second.choices[0].finish_reason == "stop" and second.choices[0].message.tool_calls is None
    )
    got, _ = agent.seen[-1]
    assert got[1]["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": '{"a": 48213, "b": 91377}',
    }
    assert got[2] == {"role": "tool", "content": "139590", "tool_call_id": "call_0"}


def test_plain_requests_carry_no_tools(client: openai.OpenAI, agent: AgentModel):
    reply = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "add 1 and 2"}]
    )
    assert reply.choices[0].message.content == "no tools"
    assert reply.choices[0].message.tool_calls is None
    _, params = agent.seen[-1]
    assert params.tools is None and params.tool_choice is None


def test_streamed_tool_calls_in_the_openai_delta_shape(client: openai.OpenAI):
    stream = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "explain: add 2 and 3 twice"}],
        tools=[ADD],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Let me add them."
    # accumulate the calls as OpenAI's docs show: by index, arguments concatenated
    calls: dict[int, dict] = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            slot = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = d.id or slot["id"]
            slot["name"] += (d.function.name or "") if d.function else ""
            slot["arguments"] += (d.function.arguments or "") if d.function else ""
    assert [calls[i]["id"] for i in sorted(calls)] == ["call_0", "call_1"]
    assert [json.loads(calls[i]["arguments"]) for i in sorted(calls)] == [
        {"a": 2, "b": 3},
        {"a": 2, "b": 4},
    ]
    assert all(calls[i]["name"] == "add" for i in calls)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls" and set(finishes[:-1]) == {None}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ({"tools": {"type": "function"}}, "'tools' must be a list"),
        ({"tools": [{"name": "add"}]}, "tools[0] must be"),
        ({"tools": [ADD], "tool_choice": "sometimes"}, "'tool_choice' must be"),
        (
            {"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "mul"}}},
            "does not offer",
        ),
    ],
)
def test_bad_tools_are_400_with_a_clear_message(base_url: str, extra: dict, fragment: str):
    body = {"model": NAME, "messages": [{"role": "user", "content": "add 1 and 2"}], **extra}
    response = loopback.post(f"{base_url}/chat/completions", json=body)
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]


def test_bad_tool_calls_in_messages_are_400(base_url: str):
    messages = [
        {"role": "user", "content": "add 1 and 2"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": "add"}]},
    ]
    response = loopback.post(
        f"{base_url}/chat/completions", json={"model": NAME, "messages": messages, "tools": [ADD]}
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("messages[1] tool_calls[0] must be")


def test_the_local_backend_parse_path_behind_serve():
    """A LocalModel whose decoding is scripted (no weights): its reply text is parsed into
    tool_calls by the local backend and served to the openai client."""
    pytest.importorskip("transformers")
    from tests.test_local_tools import ToolScriptedModel

    model = ToolScriptedModel(max_batch_size=2, batch_wait_ms=1)
    reply = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    with serve_in_background(model, "local-scripted") as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=10)
        plain = client.chat.completions.create(
            model="local-scripted",
            messages=[{"role": "user", "content": reply}],
            tools=[ADD],
            max_tokens=2,
        )
        streamed = list(
            client.chat.completions.create(
                model="local-scripted",
                messages=[{"role": "user", "content": reply}],
                tools=[ADD],
                max_tokens=2,
                stream=True,
            )
        )
    model.close()
    (call,) = plain.choices[0].message.tool_calls
    assert plain.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 2}
    assert call.id.startswith("call_")
    deltas = [d for c in streamed for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "add" and deltas[0].id.startswith("call_")
    assert json.loads(deltas[1].function.arguments) == {"a": 1, "b": 2}
    assert streamed[-1].choices[0].finish_reason == "tool_calls"
