"""`selftaught serve` against the official openai client: a real uvicorn server on loopback
around a scripted model (endpoints, errors, concurrency), plus the real local model."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import openai
import pytest

from tests import loopback

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from selftaught.models import Completion, GenerationParams, Message  # noqa: E402
from selftaught.models.base import AsyncChatModel  # noqa: E402
from selftaught.models.errors import FatalBackendError, TransientBackendError  # noqa: E402
from selftaught.serve import (  # noqa: E402
    create_app,
    is_loopback,
    parse_chat_request,
    run_server,
    serve_in_background,
)

NAME = "scripted-echo"


class EchoModel(AsyncChatModel):
    """Replies 'echo: <last user message>', truncated to max_tokens words; records params.
    A user message 'wait' blocks until `gate_size` such calls are in flight at once."""

    name = NAME

    def __init__(self, gate_size: int = 4) -> None:
        self.params: list[GenerationParams] = []
        self.messages: list[list[Message]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.waiters = 0
        self.gate_size = gate_size
        self.fail_with: Exception | None = None

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        self.messages.append(messages)
        self.params.append(params)
        if self.fail_with is not None:
            raise self.fail_with
        last = messages[-1]["content"]
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if last == "wait":
                self.waiters += 1
                for _ in range(500):  # up to 5 s for the others to arrive
                    if self.waiters >= self.gate_size:
                        break
                    await asyncio.sleep(0.01)
        finally:
            self.in_flight -= 1
        words = f"echo: {last}".split()
        truncated = len(words) > params.max_tokens
        return Completion(
            text=" ".join(words[: params.max_tokens]),
            prompt_tokens=sum(len(m["content"].split()) for m in messages),
            completion_tokens=min(len(words), params.max_tokens),
            finish_reason="length" if truncated else "stop",
            model=NAME,
        )


@pytest.fixture(scope="module")
def echo() -> EchoModel:
    return EchoModel()


@pytest.fixture(scope="module")
def base_url(echo: EchoModel) -> Iterator[str]:
    with serve_in_background(echo, NAME) as url:
        yield url


@pytest.fixture()
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=10)


def test_models_and_health(client: openai.OpenAI, base_url: str):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    health = loopback.get(base_url.removesuffix("/v1") + "/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "model": NAME}


def test_chat_completion_round_trip(client: openai.OpenAI, echo: EchoModel):
    reply = client.chat.completions.create(
        model=NAME,
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"},
        ],
        max_tokens=50,
        temperature=0.3,
        top_p=0.9,
        seed=11,
        stop=["###"],
    )
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == NAME
    assert len(reply.choices) == 1
    choice = reply.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert choice.message.content == "echo: hello there"
    assert choice.finish_reason == "stop"
    assert reply.usage.prompt_tokens == 4
    assert reply.usage.completion_tokens == 3
    assert reply.usage.total_tokens == 7
    assert echo.messages[-1] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello there"},
    ]
    assert echo.params[-1] == GenerationParams(
        max_tokens=50, temperature=0.3, top_p=0.9, seed=11, stop=["###"]
    )


def test_truncation_and_max_completion_tokens_fallback(client: openai.OpenAI, echo: EchoModel):
    reply = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "one two three four"}],
        max_completion_tokens=2,
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content == "echo: one"
    assert echo.params[-1].max_tokens == 2
    assert echo.params[-1].temperature == 1.0  # OpenAI's default when none is sent


def test_unknown_model_is_404_with_openai_error_body(client: openai.OpenAI):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(
            model="gpt-nope", messages=[{"role": "user", "content": "hi"}]
        )
    error = info.value.body
    assert error["code"] == "model_not_found"
    assert error["type"] == "invalid_request_error"
    assert "gpt-nope" in error["message"] and NAME in error["message"]


def test_n_above_one_is_refused(client: openai.OpenAI, base_url: str):
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "hi"}], n=2
        )
    response = loopback.post(
        f"{base_url}/chat/completions",
        json={"model": NAME, "messages": [{"role": "user", "content": "hi"}], "stream": "yes"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "'stream' must be a boolean"


def test_streaming_with_the_openai_client(client: openai.OpenAI):
    stream = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "one two  three"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: one two three"  # the scripted model re-joins words
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert len({c.id for c in chunks}) == 1 and all(c.model == NAME for c in chunks)
    # without include_usage there is no usage chunk; truncation shows as finish_reason length
    plain = list(
        client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "a b c d"}], stream=True, max_tokens=2
        )
    )
    assert all(c.usage is None for c in plain) and plain[-1].choices[0].finish_reason == "length"


def test_streaming_errors_are_http_errors_not_broken_streams(
    client: openai.OpenAI, echo: EchoModel
):
    echo.fail_with = TransientBackendError("scripted", "overloaded", status=503)
    try:
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": "hi"}], stream=True
            )
        assert info.value.status_code == 503
    finally:
        echo.fail_with = None


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": NAME}, "'messages' must be a non-empty list"),
        ({"model": NAME, "messages": []}, "'messages' must be a non-empty list"),
        ({"model": NAME, "messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"model": NAME, "messages": [{"role": "user", "content": 3}]}, "content"),
        (
            {"model": NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            "'max_tokens' must be a positive integer",
        ),
        (
            {"model": NAME, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
            "'temperature' must be a number",
        ),
        (
            {"model": NAME, "messages": [{"role": "user", "content": "x"}], "stop": [1]},
            "'stop'",
        ),
        ([1, 2, 3], "JSON object"),
    ],
)
def test_bad_bodies_are_400_with_a_clear_message(base_url: str, body, fragment: str):
    response = loopback.post(f"{base_url}/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert fragment in error["message"]
    assert error["type"] == "invalid_request_error"


def test_invalid_json_and_unknown_route(base_url: str):
    response = loopback.post(
        f"{base_url}/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]
    missing = loopback.get(f"{base_url}/nothing-here")
    assert missing.status_code == 404
    assert "error" in missing.json()


def test_text_content_parts_are_joined(client: openai.OpenAI):
    reply = client.chat.completions.create(
        model=NAME,
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "part "}, {"type": "text", "text": "two"}],
            }
        ],
    )
    assert reply.choices[0].message.content == "echo: part two"


def test_backend_errors_map_to_server_errors(client: openai.OpenAI, echo: EchoModel):
    echo.fail_with = TransientBackendError("scripted", "overloaded", status=503)
    try:
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 503
        echo.fail_with = FatalBackendError("scripted", "weights are corrupt")
        with pytest.raises(openai.InternalServerError, match="weights are corrupt"):
            client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])
    finally:
        echo.fail_with = None


def test_concurrent_requests_reach_the_model_concurrently(base_url: str, echo: EchoModel):
    async def main() -> list[str]:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as c:
            replies = await asyncio.gather(
                *(
                    c.chat.completions.create(
                        model=NAME, messages=[{"role": "user", "content": "wait"}]
                    )
                    for _ in range(echo.gate_size)
                )
            )
        return [r.choices[0].message.content for r in replies]

    echo.max_in_flight = echo.waiters = 0
    assert asyncio.run(main()) == ["echo: wait"] * echo.gate_size
    assert echo.max_in_flight == echo.gate_size


def test_remote_hosts_need_explicit_permission():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    with pytest.raises(ValueError, match="allow_remote"):
        run_server(EchoModel(), NAME, host="0.0.0.0", port=1)
    with (
        pytest.raises(ValueError, match="allow_remote"),
        serve_in_background(EchoModel(), NAME, host="10.0.0.1"),
    ):
        pass


def test_parse_chat_request_defaults_and_developer_role():
    parsed = parse_chat_request(
        {"messages": [{"role": "developer", "content": "rules"}, {"role": "user", "content": "q"}]},
        NAME,
        default_max_tokens=64,
    )
    assert parsed.model == NAME  # a missing model means the served one
    assert parsed.messages[0] == {"role": "system", "content": "rules"}
    assert parsed.params.max_tokens == 64
    with pytest.raises(ValueError):
        create_app(EchoModel(), "")


@pytest.mark.slow
def test_real_local_model_served_to_the_openai_client():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    pytest.importorskip("transformers")
    from selftaught.models.local import LocalModel

    try:
        local = LocalModel()
        _ = local.model
    except FatalBackendError as err:
        pytest.skip(f"embedded model unavailable: {err}")
    with serve_in_background(local, "smol") as url:

        async def main():
            async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as c:
                return await asyncio.gather(
                    *(
                        c.chat.completions.create(
                            model="smol",
                            messages=[{"role": "user", "content": q}],
                            max_tokens=8,
                            temperature=0,
                        )
                        for q in ("What is 2+2?", "Name a color.", "Say hello.")
                    )
                )

        prefills_before = local.stats.prefill_calls
        replies = asyncio.run(main())
    local.close()
    assert all(r.choices[0].message.content.strip() for r in replies)
    assert all(r.usage.prompt_tokens > 0 for r in replies)
    assert all(r.choices[0].finish_reason in ("stop", "length") for r in replies)
    # Served concurrently, the three requests were decoded in one batch.
    assert local.stats.prefill_calls - prefills_before < 3
    assert local.stats.max_rows > 1


def test_serve_cli_refuses_a_remote_host_before_loading_anything():
    from typer.testing import CliRunner

    from selftaught.cli import app

    result = CliRunner().invoke(
        app, ["serve", "--model", "local:/nonexistent", "--host", "0.0.0.0"]
    )
    assert result.exit_code == 2
    assert "refusing to bind 0.0.0.0" in " ".join(result.output.split())
    assert "Traceback" not in result.output
