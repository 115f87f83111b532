"""Tools on the local backend: the prompt renders the offered tools with the model's own chat
template when it has a tools section, else with the documented fallback (SmolLM2's has none);
past calls and results render too; the serving loop parses replies into `tool_calls` or
reports malformed ones; and the real embedded model, offered a tool, answers without error
(valid calls, or text, or a reported malformed call: a 135M model rarely calls)."""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from selftaught.models import Completion, GenerationParams  # noqa: E402
from selftaught.models.batching import GenSequence  # noqa: E402
from selftaught.models.local import LocalModel  # noqa: E402
from tests.test_local_model import needs_model  # noqa: E402
from tests.test_local_worker import ScriptedLocalModel  # noqa: E402

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
ASK = [{"role": "user", "content": "What is 48213 + 91377?"}]
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "What is 1200 + 3400?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 1200, "b": 3400}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "4600"},
]

# A ChatML template with its own tools section, in the Qwen2.5 / Hermes manner (it reads
# `tools`, renders assistant `tool_calls` with `arguments | tojson` and tool turns as
# <tool_response> user turns).
NATIVE_TEMPLATE = """
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}## Functions
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Reply with <tool_call>{"name": ..., "arguments": ...}</tool_call> to call one.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' %}
{%- elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{{ m.content }}{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def tokenizer_only(chat_template: str | None = None) -> LocalModel:
    """The embedded model's real tokenizer around a stand-in model: prompts without weights."""
    from transformers import AutoTokenizer

    from selftaught.models.embedded import resolve_local_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_local_path(None))
    stand_in = SimpleNamespace(config=SimpleNamespace(_name_or_path="smol"))
    return LocalModel(model=stand_in, tokenizer=tokenizer, chat_template=chat_template)


@needs_model
def test_smollm2_template_has_no_tools_section_so_the_fallback_renders_them():
    model = tokenizer_only()
    tokenizer = model.tokenizer
    # transformers alone would drop the tools without a word: the template never reads them
    dropped = tokenizer.apply_chat_template(
        ASK, tools=[ADD], add_generation_prompt=True, tokenize=False
    )
    assert "add" not in dropped.replace("What is", "")
    prompt = model.format_prompt(ASK, GenerationParams(tools=[ADD], tool_choice="required"))
    assert json.dumps(ADD) in prompt  # the schema, verbatim
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}' in prompt
    assert "You must answer with at least one tool call." in prompt
    assert prompt.startswith("<|im_start|>system\n# Tools")
    assert prompt.endswith(
        "<|im_start|>user\nWhat is 48213 + 91377?<|im_end|>\n<|im_start|>assistant\n"
    )
    # a plain request renders exactly as before
    plain = tokenizer.apply_chat_template(ASK, add_generation_prompt=True, tokenize=False)
    assert model.format_prompt(ASK) == plain
    assert model.format_prompt(ASK, GenerationParams(tools=[ADD], tool_choice="none")) == plain


@needs_model
def test_fallback_renders_past_calls_and_results_as_text():
    model = tokenizer_only()
    prompt = model.format_prompt(HISTORY, GenerationParams(tools=[ADD]))
    assert prompt.startswith("<|im_start|>system\nUse the tools.\n\n# Tools")
    # an assistant turn of calls alone may leave content out (model_dump(exclude_none=True))
    no_content = [*HISTORY[:2], {k: v for k, v in HISTORY[2].items() if k != "content"}]
    assert model.format_prompt(no_content + HISTORY[3:], GenerationParams(tools=[ADD])) == prompt
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1200, "b": 3400}}'
        "\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n4600\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    ) in prompt


@needs_model
def test_a_template_with_a_tools_section_renders_them_natively():
    model = tokenizer_only(NATIVE_TEMPLATE)
    params = GenerationParams(tools=[ADD], tool_choice="auto")
    prompt = model.format_prompt(HISTORY, params)
    assert "## Functions\n<tools>" + json.dumps(ADD) in prompt  # the template's own section
    assert "You may call one or more functions" not in prompt  # not the fallback's section
    # arguments reach the template as an object (a JSON string would be encoded twice)
    assert '{"name": "add", "arguments": {"a": 1200, "b": 3400}}' in prompt
    assert "<tool_response>\n4600\n</tool_response>" in prompt
    required = model.format_prompt(ASK, GenerationParams(tools=[ADD], tool_choice="required"))
    assert "You must answer with at least one tool call." in required


class ToolScriptedModel(ScriptedLocalModel):
    """The scripted serving loop (no weights) whose reply is the question itself, ended by
    the end-of-turn token, or cut by max_tokens after a "CUT:" prefix."""

    def _completion(self, seq: GenSequence, prompt_tokens: int) -> Completion:
        text = seq.owner.messages[-1]["content"]
        return Completion(
            text=text.removeprefix("CUT:"),
            prompt_tokens=prompt_tokens,
            completion_tokens=len(seq.tokens),
            finish_reason="length" if text.startswith("CUT:") else "stop",
            model=self.name,
        )


def scripted_reply(model: LocalModel, reply: str, params: GenerationParams) -> list[Completion]:
    async def main() -> list[Completion]:
        return await model.achat_n([{"role": "user", "content": reply}], params, 2)

    return asyncio.run(main())


def test_the_serving_loop_parses_calls_and_reports_malformed_ones():
    model = ToolScriptedModel(max_batch_size=4, batch_wait_ms=1)
    offer = GenerationParams(max_tokens=2, tools=[ADD])
    good = 'Sure.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    first, copy = scripted_reply(model, good, offer)
    assert first.finish_reason == "tool_calls" and first.text == "Sure."
    assert first.tool_calls is not None and copy.tool_calls is not None
    assert json.loads(first.tool_calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert first.tool_calls is not copy.tool_calls  # greedy copies hold their own calls
    bad = '<tool_call>{"name": "sub", "arguments": {}}</tool_call>'
    (c, _) = scripted_reply(model, bad, offer)
    assert c.tool_calls is None and c.finish_reason == "stop" and c.text == bad
    assert c.tool_call_errors and "unknown tool 'sub'" in c.tool_call_errors[0]["error"]
    (cut, _) = scripted_reply(model, "CUT:" + good, offer)
    assert cut.tool_calls is None and cut.truncated and cut.text == good
    assert cut.tool_call_errors and "max_tokens" in cut.tool_call_errors[-1]["error"]
    # without tools offered (or with tool_choice "none") the text is left alone
    for params in (
        GenerationParams(max_tokens=2),
        GenerationParams(tools=[ADD], tool_choice="none"),
    ):
        (plain, _) = scripted_reply(model, good, params)
        assert plain.text == good and plain.tool_calls is None and plain.tool_call_errors is None
    model.close()


def test_bad_tools_and_tool_messages_are_refused_in_one_sentence():
    model = ToolScriptedModel()
    with pytest.raises(ValueError, match=r"tools\[0\] must be"):
        model.chat(ASK, GenerationParams(tools=[{"name": "add"}]))
    with pytest.raises(ValueError, match="does not offer"):
        model.chat(
            ASK,
            GenerationParams(
                tools=[ADD], tool_choice={"type": "function", "function": {"name": "x"}}
            ),
        )
    with pytest.raises(ValueError, match="content must be a string"):
        model.chat([{"role": "user", "content": None}], GenerationParams())
    with pytest.raises(ValueError, match="only an assistant turn carries"):
        model.chat([{"role": "user", "content": "hi", "tool_calls": []}], GenerationParams())
    model.close()


@pytest.mark.slow
@needs_model
def test_real_embedded_model_offered_a_tool_answers_without_error():
    model = LocalModel(batch_wait_ms=50)
    params = GenerationParams(max_tokens=24, tools=[ADD], tool_choice="required")
    assert json.dumps(ADD) in model.format_prompt(ASK, params)  # SmolLM2 sees the schema
    second = [{"role": "user", "content": "What is 70000 + 12345?"}]

    async def both() -> list[Completion]:
        return list(await asyncio.gather(model.achat(ASK, params), model.achat(second, params)))

    replies = asyncio.run(both())
    stats = model.stats
    model.close()
    # the two prompts share the tools section: it was prefilled once, as a cached prefix
    assert stats.prefix_builds >= 1
    assert stats.prefilled_tokens < sum(c.prompt_tokens for c in replies)
    for c in replies:
        assert c.prompt_tokens > 100  # the schema and the instructions were in the prompt
        if c.tool_calls:  # the model called: every call is a valid, offered one
            assert c.finish_reason == "tool_calls" and c.tool_call_errors is None
            for call in c.tool_calls:
                assert call["function"]["name"] == "add"
                assert isinstance(json.loads(call["function"]["arguments"]), dict)
        elif "<tool_call>" in c.text:  # it tried: the malformed call is reported
            assert c.tool_call_errors and c.finish_reason in ("stop", "length")
        else:  # it answered in prose (what a 135M model mostly does)
            assert c.text.strip() and c.tool_call_errors is None
            assert c.finish_reason in ("stop", "length")
