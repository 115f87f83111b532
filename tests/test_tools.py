"""The tool-call parser and renderer (selftaught.models.tools): pure functions, no model."""

from __future__ import annotations

import json

import pytest

from selftaught.models import Completion
from selftaught.models.tools import (
    apply_tool_reply,
    check_tool_calls,
    check_tool_choice,
    check_tools,
    fallback_messages,
    native_messages,
    offered_tools,
    parse_tool_calls,
    template_supports_tools,
)

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
LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
TOOLS = [ADD, LOOKUP]
NAMES = ["add", "lookup"]


def call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def test_one_valid_call_parses_into_the_openai_shape():
    parsed = parse_tool_calls(call("add", {"a": 12345, "b": 67890}), NAMES)
    assert parsed.errors == [] and parsed.blocks == 1 and parsed.content == ""
    (c,) = parsed.calls
    assert c["type"] == "function" and c["id"].startswith("call_")
    assert c["function"]["name"] == "add"
    assert json.loads(c["function"]["arguments"]) == {"a": 12345, "b": 67890}
    assert isinstance(c["function"]["arguments"], str)  # OpenAI: arguments are a JSON string


def test_several_calls_get_unique_ids_and_keep_their_order():
    text = call("add", {"a": 1, "b": 2}) + "\n" + call("lookup", {"key": "x"})
    parsed = parse_tool_calls(text, NAMES)
    assert [c["function"]["name"] for c in parsed.calls] == ["add", "lookup"]
    assert len({c["id"] for c in parsed.calls}) == 2
    assert parse_tool_calls(text, NAMES).calls[0]["id"] != parsed.calls[0]["id"]


def test_text_around_calls_is_the_content():
    text = "Let me add them.\n" + call("add", {"a": 1, "b": 2}) + "\nThen I answer."
    parsed = parse_tool_calls(text, NAMES)
    assert parsed.content == "Let me add them.\n\nThen I answer."
    assert len(parsed.calls) == 1


def test_plain_text_has_no_blocks():
    parsed = parse_tool_calls("The answer is 3.", NAMES)
    assert parsed.blocks == 0 and parsed.calls == [] and parsed.content == "The answer is 3."


@pytest.mark.parametrize(
    "body, fragment",
    [
        ('{"name": "add", "arguments": {"a": 1,}}', "not valid JSON"),
        ('{"name": "multiply", "arguments": {}}', "unknown tool 'multiply' (offered: add, lookup)"),
        ('{"name": "add", "arguments": [1, 2]}', "arguments must be a JSON object, got list"),
        ('{"name": "add", "arguments": "{oops"}', "arguments are not valid JSON"),
        ('["add"]', "not a JSON object"),
        ('{"arguments": {}}', "no 'name'"),
    ],
)
def test_malformed_calls_are_errors(body: str, fragment: str):
    parsed = parse_tool_calls(f"<tool_call>{body}</tool_call>", NAMES)
    assert parsed.calls == [] and parsed.blocks == 1
    (err,) = parsed.errors
    assert fragment in err["error"] and err["index"] == 0 and err["raw"] == body


def test_arguments_as_json_string_or_parameters_key_are_accepted():
    text = (
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>'
        '<tool_call>{"name": "lookup", "parameters": {"key": "k"}}</tool_call>'
        '<tool_call>{"name": "lookup"}</tool_call>'
    )
    parsed = parse_tool_calls(text, NAMES)
    assert parsed.errors == []
    args = [json.loads(c["function"]["arguments"]) for c in parsed.calls]
    assert args == [{"a": 1, "b": 2}, {"key": "k"}, {}]


def test_an_unterminated_block_is_an_error_and_its_text_is_not_content():
    text = "Sure. " + call("add", {"a": 1, "b": 2}) + ' <tool_call>{"name": "add", "argu'
    parsed = parse_tool_calls(text, NAMES)
    assert len(parsed.calls) == 1 and parsed.blocks == 2
    assert "never closed" in parsed.errors[0]["error"] and parsed.errors[0]["index"] == 1
    assert parsed.content == "Sure."


def test_apply_tool_reply_valid_calls_become_tool_calls():
    c = apply_tool_reply(Completion(text="ok " + call("add", {"a": 1, "b": 2})), TOOLS)
    assert c.finish_reason == "tool_calls" and c.text == "ok"
    assert c.tool_calls is not None and c.tool_calls[0]["function"]["name"] == "add"
    assert c.tool_call_errors is None


def test_apply_tool_reply_one_malformed_call_keeps_the_text_and_reports():
    raw = call("add", {"a": 1, "b": 2}) + call("nope", {})
    c = apply_tool_reply(Completion(text=raw), TOOLS)
    assert c.tool_calls is None and c.finish_reason == "stop" and c.text == raw
    assert (
        c.tool_call_errors is not None and "unknown tool 'nope'" in c.tool_call_errors[0]["error"]
    )


def test_apply_tool_reply_truncated_reply_is_not_run():
    raw = call("add", {"a": 1, "b": 2})
    c = apply_tool_reply(Completion(text=raw, finish_reason="length"), TOOLS)
    assert c.tool_calls is None and c.truncated
    assert c.tool_call_errors and "max_tokens" in c.tool_call_errors[-1]["error"]


def test_apply_tool_reply_leaves_plain_text_alone():
    c = apply_tool_reply(Completion(text="3"), TOOLS)
    assert (c.text, c.finish_reason, c.tool_calls, c.tool_call_errors) == ("3", "stop", None, None)


def test_check_tool_calls_validates_what_a_server_returned():
    good = {"id": "1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    bad = {"id": "2", "type": "function", "function": {"name": "add", "arguments": '{"a": '}}
    unknown = {"id": "3", "type": "function", "function": {"name": "x", "arguments": "{}"}}
    errors = check_tool_calls([good, bad, unknown], NAMES)
    assert [e["index"] for e in errors] == [1, 2]
    assert "not valid JSON" in errors[0]["error"] and "unknown tool" in errors[1]["error"]


def test_schema_and_choice_checks_say_what_is_wrong():
    assert check_tools(TOOLS) is TOOLS
    with pytest.raises(ValueError, match="must be a list"):
        check_tools({"type": "function"})
    with pytest.raises(ValueError, match=r"tools\[0\] must be"):
        check_tools([{"name": "add"}])
    with pytest.raises(ValueError, match="appears twice"):
        check_tools([ADD, ADD])
    check_tool_choice("required", TOOLS)
    check_tool_choice({"type": "function", "function": {"name": "add"}}, TOOLS)
    with pytest.raises(ValueError, match="does not offer"):
        check_tool_choice({"type": "function", "function": {"name": "mul"}}, TOOLS)
    with pytest.raises(ValueError, match="'tool_choice' must be"):
        check_tool_choice("always", TOOLS)
    with pytest.raises(ValueError, match="'tool_choice' must be"):
        check_tool_choice({"type": "function", "function": "add"}, TOOLS)
    assert offered_tools(TOOLS, "none") is None
    assert offered_tools(TOOLS, {"type": "function", "function": {"name": "lookup"}}) == [LOOKUP]
    assert offered_tools(TOOLS, "auto") == TOOLS


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 12345 + 67890?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 12345, "b": 67890}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "80235"},
    {"role": "tool", "tool_call_id": "call_2", "content": "nothing"},
]


def test_fallback_messages_render_tools_calls_and_results_as_text():
    out = fallback_messages(HISTORY, TOOLS, "You must answer with at least one tool call.")
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    system = out[0]["content"]
    assert system.startswith("Be brief.\n\n# Tools")
    assert json.dumps(ADD) in system and "<tool_call>" in system
    assert system.endswith("You must answer with at least one tool call.")
    assert out[2]["content"] == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 12345, "b": 67890}}\n</tool_call>\n'
        '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'
    )
    # the two results share one user turn, in order
    assert out[3]["content"] == (
        "<tool_response>\n80235\n</tool_response>\n<tool_response>\nnothing\n</tool_response>"
    )
    assert HISTORY[2]["content"] is None  # the caller's messages are not modified
    assert all(set(m) == {"role", "content"} for m in out)


def test_fallback_without_a_system_prompt_adds_one():
    out = fallback_messages([{"role": "user", "content": "hi"}], [ADD])
    assert out[0]["role"] == "system" and out[0]["content"].startswith("# Tools")


def test_native_messages_decode_arguments_for_the_template():
    out = native_messages(HISTORY, "Call add.")
    assert out[2]["tool_calls"][0]["function"]["arguments"] == {"a": 12345, "b": 67890}
    assert out[2]["content"] == "" and out[0]["content"] == "Be brief.\n\nCall add."
    assert HISTORY[2]["tool_calls"][0]["function"]["arguments"].startswith("{")  # untouched
    as_text = native_messages(HISTORY, renders_calls=False)
    assert "tool_calls" not in as_text[2] and as_text[2]["content"].startswith("<tool_call>")


def test_template_supports_tools_reads_the_template():
    assert template_supports_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert not template_supports_tools(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% endfor %}"
    )
    # a template that sets its own variable named tools does not read the caller's
    assert not template_supports_tools("{% set tools = [] %}{{ tools }}")
    assert not template_supports_tools(None) and not template_supports_tools("{% if %}")
    # transformers' {% generation %} tag is no plain Jinja: the variable is then looked for
    marked = "{% if tools %}T{% endif %}{% generation %}{{ m }}{% endgeneration %}"
    assert template_supports_tools(marked)
    assert template_supports_tools("{% for t in tools %}{% break %}{% endfor %}")
