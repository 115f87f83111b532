"""`anthropic:MODEL` and `gemini:MODEL` through the vendors' SDKs, against scripted loopback
servers speaking each wire format: the request each sends, prompt-cache usage counted and
priced, the retry / fatal rules every backend keeps, n samples, tools, a missing SDK, and a
`selftaught eval` end to end."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys

import pytest
from typer.testing import CliRunner

from selftaught.errors import MissingDependency
from selftaught.models import (
    FatalBackendError,
    GenerationParams,
    ModelSpecError,
    RetryPolicy,
    TrackedModel,
    UsageLedger,
    load_model,
    parse_model_spec,
)
from selftaught.models.errors import TransientBackendError
from selftaught.models.usage import CACHE_PRICES_PER_MTOK, PRICES_PER_MTOK, Budget
from tests.native_upstream import NativeServer

FAST = RetryPolicy(max_retries=4, base_delay_s=0.01, max_delay_s=0.05)
KEY = "sk-test-secret-0123456789"
SKILL = "Answer with the number only. " * 40  # the stable prefix: long enough to cache
MSGS = [{"role": "system", "content": SKILL}, {"role": "user", "content": "What is 40 + 2?"}]
SPECS = {"anthropic": "anthropic:claude-sonnet-4-6", "gemini": "gemini:gemini-2.5-flash"}
ENV = {"anthropic": "ANTHROPIC", "gemini": "GEMINI"}
WIRES = ["anthropic", "gemini"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}}},
        },
    }
]


@pytest.fixture
def serve(monkeypatch):
    """A scripted server for one wire, with the vendor's key and base URL pointing at it."""
    servers: list[NativeServer] = []
    for name in ("ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GOOGLE_GEMINI_BASE_URL", raising=False)

    def start(wire: str, **kw) -> NativeServer:
        server = NativeServer(wire, require_key=KEY, **kw).__enter__()
        servers.append(server)
        monkeypatch.setenv(f"{ENV[wire]}_API_KEY", KEY)
        monkeypatch.setenv(f"{ENV[wire]}_BASE_URL", server.base_url)
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def model(wire: str, **kw):
    kw.setdefault("retry", FAST)
    kw.setdefault("timeout_s", 0.5)
    return load_model(SPECS[wire], **kw)


# ---- specs ------------------------------------------------------------------------------


def test_specs_parse_and_unknown_prefixes_list_the_new_forms():
    assert parse_model_spec("anthropic:claude-haiku-4-5").backend == "anthropic"
    assert parse_model_spec("gemini:gemini-2.5-pro").model == "gemini-2.5-pro"
    with pytest.raises(ModelSpecError, match="anthropic: needs a model name"):
        parse_model_spec("anthropic:")
    with pytest.raises(ModelSpecError) as info:
        parse_model_spec("claude:opus")
    assert "anthropic:MODEL" in str(info.value) and "gemini:MODEL" in str(info.value)


@pytest.mark.parametrize("wire", WIRES)
def test_a_missing_sdk_names_the_extra(monkeypatch, wire):
    if wire == "anthropic":
        monkeypatch.setitem(sys.modules, "anthropic", None)  # import anthropic -> ImportError
    else:
        import google

        monkeypatch.setitem(sys.modules, "google.genai", None)
        monkeypatch.delattr(google, "genai", raising=False)
    with pytest.raises(MissingDependency, match=rf"pip install 'selftaught\[{wire}\]'"):
        load_model(SPECS[wire], api_key="k")


@pytest.mark.parametrize("wire", WIRES)
def test_no_key_and_no_endpoint_is_fatal_and_says_which_variable(monkeypatch, wire):
    for name in ("ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("ANTHROPIC_BASE_URL", "GEMINI_BASE_URL", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(FatalBackendError, match=f"set {ENV[wire]}_API_KEY"):
        load_model(SPECS[wire])


def test_gemini_reads_googles_own_variables(serve, monkeypatch):
    server = serve("gemini")
    monkeypatch.delenv("GEMINI_API_KEY")
    monkeypatch.delenv("GEMINI_BASE_URL")
    monkeypatch.setenv("GOOGLE_API_KEY", KEY)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", server.base_url)  # the SDK's own variable
    assert model("gemini").chat(MSGS, GenerationParams()).text == "42"
    assert server.headers[0]["x-goog-api-key"] == KEY


# ---- Anthropic's Messages API -----------------------------------------------------------


def test_anthropic_maps_system_and_marks_the_prefix_for_the_cache(serve):
    server = serve("anthropic")
    c = model("anthropic").chat(MSGS, GenerationParams(max_tokens=9, stop=["\n\n"]))
    assert (c.text, c.finish_reason, c.retries) == ("42", "stop", 0)
    body = server.requests[0]
    assert body["system"] == [
        {"type": "text", "text": SKILL, "cache_control": {"type": "ephemeral"}}
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is 40 + 2?"}]}
    ]
    assert body["max_tokens"] == 9 and body["stop_sequences"] == ["\n\n"]
    # the SDK's API version refuses sampling settings: none is sent
    assert not {"temperature", "top_p", "top_k"} & set(body)
    assert server.paths == ["/v1/messages"]


def test_anthropic_cache_reads_and_writes_are_counted_and_priced(serve):
    serve("anthropic")
    ledger = UsageLedger()
    tracked = TrackedModel(model("anthropic"), ledger, "target")
    first = tracked.chat(MSGS, GenerationParams())
    second = tracked.chat(MSGS, GenerationParams())
    prefix = len(SKILL) // 4
    assert (first.cache_write_tokens, first.cache_read_tokens) == (prefix, 0)
    assert (second.cache_write_tokens, second.cache_read_tokens) == (0, prefix)
    assert first.prompt_tokens == second.prompt_tokens > prefix  # cached tokens are prompt
    u = ledger.roles["target"]
    assert (u.cache_write_tokens, u.cache_read_tokens) == (prefix, prefix)
    assert u.prompt_tokens == 2 * first.prompt_tokens
    inp, out = PRICES_PER_MTOK["claude-sonnet-4-6"]
    read, write = CACHE_PRICES_PER_MTOK["claude-sonnet-4-6"]
    uncached = u.prompt_tokens - 2 * prefix
    want = (uncached * inp + prefix * read + prefix * write + u.completion_tokens * out) / 1e6
    assert u.usd == pytest.approx(want)
    assert u.usd < (u.prompt_tokens * inp + u.completion_tokens * out) / 1e6  # caching paid off
    Budget(usd=1.0).check_priced(["claude-sonnet-4-6", "claude-haiku-4-5-20251001"])


def test_a_model_without_a_price_has_no_usd(serve):
    serve("anthropic")
    ledger = UsageLedger()
    m = load_model("anthropic:claude-unpriced-9", retry=FAST)
    TrackedModel(m, ledger, "judge").chat(MSGS, GenerationParams())
    assert ledger.roles["judge"].usd is None
    assert ledger.roles["judge"].cache_write_tokens > 0  # still counted


def test_anthropic_n_samples_are_n_calls(serve):
    server = serve("anthropic")
    replies = asyncio.run(model("anthropic").achat_n(MSGS, GenerationParams(temperature=1), 3))
    assert [r.text for r in replies] == ["42"] * 3
    assert len(server.requests) == 3


def test_anthropic_tools_and_tool_calls_round_trip(serve):
    server = serve("anthropic", answer=lambda body: {"tool": "add", "args": {"a": 40}})
    params = GenerationParams(tools=TOOLS, tool_choice="required")
    c = model("anthropic").chat([{"role": "user", "content": "add"}], params)
    assert c.finish_reason == "tool_calls"
    assert c.tool_calls == [
        {"id": "toolu_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 40}'}}
    ]
    body = server.requests[0]
    assert body["tools"][0]["name"] == "add"
    assert body["tools"][0]["input_schema"] == TOOLS[0]["function"]["parameters"]
    assert body["tools"][0]["cache_control"] == {"type": "ephemeral"}  # no system: tools cached
    assert body["tool_choice"] == {"type": "any"}
    # the call and its result, sent back, become tool_use and tool_result blocks
    history = [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": None, "tool_calls": c.tool_calls},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "40"},
    ]
    model("anthropic").chat(history, GenerationParams(tools=TOOLS))
    sent = server.requests[1]["messages"]
    assert sent[1]["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 40}}
    ]
    assert sent[2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "40"}],
    }


# ---- Gemini's generateContent -----------------------------------------------------------


def test_gemini_maps_system_and_sampling_settings(serve):
    server = serve("gemini")
    params = GenerationParams(max_tokens=9, temperature=0.3, top_p=0.9, seed=7, stop=["\n\n"])
    history = [*MSGS, {"role": "assistant", "content": "42"}, {"role": "user", "content": "+1?"}]
    c = model("gemini").chat(history, params)
    assert (c.text, c.finish_reason) == ("42", "stop")
    body = server.requests[0]
    assert body["systemInstruction"]["parts"] == [{"text": SKILL}]
    assert [(t["role"], t["parts"][0]["text"]) for t in body["contents"]] == [
        ("user", "What is 40 + 2?"),
        ("model", "42"),
        ("user", "+1?"),
    ]
    assert body["generationConfig"] == {
        "temperature": 0.3,
        "topP": 0.9,
        "maxOutputTokens": 9,
        "seed": 7,
        "stopSequences": ["\n\n"],
    }
    assert server.headers[0]["x-goog-api-key"] == KEY
    assert server.paths[0].endswith("/models/gemini-2.5-flash:generateContent")


def test_gemini_cached_tokens_are_counted_and_priced(serve):
    serve("gemini")
    ledger = UsageLedger()
    tracked = TrackedModel(model("gemini"), ledger, "target")
    tracked.chat(MSGS, GenerationParams())
    second = tracked.chat(MSGS, GenerationParams())
    prefix = len(SKILL) // 4
    assert second.cache_read_tokens == prefix
    u = ledger.roles["target"]
    assert (u.cache_read_tokens, u.cache_write_tokens) == (prefix, 0)
    inp, out = PRICES_PER_MTOK["gemini-2.5-flash"]
    read, _ = CACHE_PRICES_PER_MTOK["gemini-2.5-flash"]
    want = ((u.prompt_tokens - prefix) * inp + prefix * read + u.completion_tokens * out) / 1e6
    assert u.usd == pytest.approx(want)


def test_gemini_n_samples_are_one_request_or_n_where_refused(serve):
    server = serve("gemini")
    m = model("gemini")
    replies = asyncio.run(m.achat_n(MSGS, GenerationParams(temperature=0.8), 3))
    assert [r.text for r in replies] == ["42"] * 3 and len(server.requests) == 1
    assert server.requests[0]["generationConfig"]["candidateCount"] == 3
    assert [bool(r.extra.get("prompt_shared")) for r in replies] == [False, True, True]

    server = serve("gemini", n_mode="reject")
    m = model("gemini")
    replies = asyncio.run(m.achat_n(MSGS, GenerationParams(temperature=0.8), 3))
    assert len(replies) == 3 and len(server.requests) == 4  # the refused one, then 3 single
    asyncio.run(m.achat_n(MSGS, GenerationParams(temperature=0.8), 2))
    assert len(server.requests) == 6  # not asked again


def test_gemini_tools_and_tool_calls_round_trip(serve):
    server = serve("gemini", answer=lambda body: {"tool": "add", "args": {"a": 40}})
    params = GenerationParams(tools=TOOLS, tool_choice="required")
    c = model("gemini").chat([{"role": "user", "content": "add"}], params)
    assert c.finish_reason == "tool_calls"
    (call,) = c.tool_calls
    assert call["function"] == {"name": "add", "arguments": '{"a": 40}'}
    body = server.requests[0]
    (decl,) = body["tools"][0]["functionDeclarations"]
    assert decl["name"] == "add"
    # the SDK sends this field under its proto name (JSON parsers of Google's APIs take both)
    schema = decl.get("parametersJsonSchema") or decl.get("parameters_json_schema")
    assert schema == TOOLS[0]["function"]["parameters"]
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    history = [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": None, "tool_calls": c.tool_calls},
        {"role": "tool", "tool_call_id": call["id"], "content": "40"},
    ]
    model("gemini").chat(history, GenerationParams(tools=TOOLS))
    sent = server.requests[1]["contents"]
    assert sent[1]["parts"][0]["functionCall"]["args"] == {"a": 40}
    answer = sent[2]["parts"][0]["functionResponse"]
    assert sent[2]["role"] == "user"
    assert (answer["name"], answer["response"]) == ("add", {"result": "40"})


# ---- the same retry / fatal rules as every backend ----------------------------------------


@pytest.mark.parametrize("wire", WIRES)
def test_transient_faults_are_retried_then_succeed(serve, wire):
    server = serve(wire)
    server.faults.extend(["429", "529", "500", "timeout"])
    c = model(wire).chat(MSGS, GenerationParams())
    assert (c.text, c.retries) == ("42", 4)
    assert len(server.requests) == 5


@pytest.mark.parametrize("wire", WIRES)
def test_retries_are_bounded(serve, wire):
    server = serve(wire)
    server.faults.extend(["503"] * 10)
    with pytest.raises(TransientBackendError, match="gave up after 4 retries"):
        model(wire).chat(MSGS, GenerationParams())
    assert len(server.requests) == 5


@pytest.mark.parametrize("wire", WIRES)
def test_a_rejected_key_is_fatal_at_once_and_never_shown(serve, wire, monkeypatch, caplog):
    server = serve(wire)
    wrong = "sk-wrong-key-9876543210"
    monkeypatch.setenv(f"{ENV[wire]}_API_KEY", wrong)
    caplog.set_level(logging.DEBUG)
    m = model(wire)
    with pytest.raises(FatalBackendError, match="HTTP 401: the API key was rejected") as info:
        m.chat(MSGS, GenerationParams())
    assert len(server.requests) == 1
    assert wrong not in str(info.value) and wrong not in repr(m) and wrong not in caplog.text


@pytest.mark.parametrize("wire", WIRES)
def test_a_bad_request_is_fatal_with_the_servers_message(serve, wire):
    server = serve(wire)
    server.faults.append("400")
    with pytest.raises(FatalBackendError, match="HTTP 400: injected 400") as info:
        model(wire).chat(MSGS, GenerationParams())
    assert info.value.status == 400 and len(server.requests) == 1


# ---- where specs are used -----------------------------------------------------------------


def test_native_specs_are_remote_for_a_night_and_refused_as_a_proxy_upstream():
    from selftaught.sleep.intake.proxy import ProxyConfig, ProxyError, build_upstream
    from selftaught.sleep.night.cycle import is_remote

    assert is_remote("anthropic:claude-haiku-4-5") and is_remote("gemini:gemini-2.5-flash")
    with pytest.raises(ProxyError, match="--upstream anthropic"):
        build_upstream(ProxyConfig(upstream="anthropic:claude-haiku-4-5"))


def test_a_night_marks_its_anthropic_calls(serve):
    server = serve("anthropic")
    m = load_model(
        SPECS["anthropic"], retry=FAST, sign=lambda path, body: {"x-mark": f"{path} {len(body)}"}
    )
    m.chat(MSGS, GenerationParams())
    assert server.headers[0]["x-mark"] == f"/v1/messages {server.headers[0]['content-length']}"


def test_eval_end_to_end_with_an_anthropic_model(serve, tmp_path):
    from selftaught.cli import app

    server = serve("anthropic", answer=lambda body: _sum(body["messages"][-1]))
    data = tmp_path / "sums.jsonl"
    rows = [
        {"id": f"s{i}", "input": f"What is {i} + 2?", "reference": str(i + 2), "split": "test"}
        for i in range(4)
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    skill = tmp_path / "skill.md"
    skill.write_text(SKILL)
    out = tmp_path / "eval.jsonl"
    args = ["eval", "--task", f"jsonl:{data}", "--model", "anthropic:claude-haiku-4-5"]
    args += ["--skill", str(skill), "--output", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "eval.summary.json").read_text())
    assert summary["n"] == 4 and summary["hard"] == 1.0
    usage = summary["usage"]["target"]
    assert usage["calls"] == 4 and usage["cache_read_tokens"] > 0 and usage["usd"] > 0
    assert all(b["system"][-1]["cache_control"] == {"type": "ephemeral"} for b in server.requests)


def _sum(turn: dict) -> str:
    text = "".join(b.get("text", "") for b in turn["content"])
    a, b = (int(n) for n in re.findall(r"\d+", text)[:2])
    return str(a + b)
