"""A tool call the backend could not parse (`Completion.tool_call_errors`) is a failed call
of the episode: answered with an error result the model can recover from, counted and named
in the feedback, never taken for the final answer."""

from __future__ import annotations

from selftaught.models.base import Completion
from selftaught.models.tools import apply_tool_reply
from selftaught.policy import Policy
from selftaught.rollout import RolloutConfig, run_rollouts, trajectory_lines
from tests.scripted import ScriptedModel, calls_tools, tool_call, tool_results
from tests.test_episodes import Broken, LookupTask

TOOLS = Broken().schemas()


def cfg(**kw: object) -> RolloutConfig:
    return RolloutConfig(progress=False, concurrency=1, **kw)  # type: ignore[arg-type]


def local_reply(text: str, finish_reason: str = "stop") -> Completion:
    """What the local backend returns for `text`: its <tool_call> blocks parsed by the same
    function the backend uses."""
    return apply_tool_reply(Completion(text=text, finish_reason=finish_reason), TOOLS)


def script(*steps: Completion | str) -> ScriptedModel:
    return ScriptedModel(lambda m: steps[sum(x["role"] == "assistant" for x in m)])


BAD_JSON = 'Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"key": }\n</tool_call>'
GOOD = '<tool_call>\n{"name": "lookup", "arguments": {"key": "x"}}\n</tool_call>'


def test_a_malformed_call_is_answered_and_counted_not_taken_for_the_answer() -> None:
    first = local_reply(BAD_JSON)
    assert first.tool_calls is None and first.tool_call_errors  # what the backend reports
    model = script(first, local_reply(GOOD), "value-x")
    [r] = run_rollouts(model, Policy(), LookupTask(), LookupTask().examples("test"), cfg())
    assert r.ok and r.turns == 3 and r.stop == "answer" and r.reply == "value-x"
    assert r.tool_calls == 2 and r.tool_errors == 1  # the malformed one and the one that ran
    # the turn keeps the reply as the model wrote it; the error result answers it
    assert r.trajectory[0] == {"role": "assistant", "content": BAD_JSON}
    error = tool_results(r.trajectory)[0]
    assert error.startswith("error: malformed tool call: not valid JSON")
    assert tool_results(r.trajectory)[1] == "value-x"  # the recovered call ran
    assert model.calls[1][-1]["content"] == error  # the model saw the error and recovered
    assert r.score is not None and r.score.hard == 1.0 and r.score.soft == 0.75
    assert "1 failed tool call(s): malformed tool call" in r.score.feedback
    lines = trajectory_lines(r)
    assert lines[0].startswith("malformed call: Let me look.") and "error: malformed" in lines[0]
    assert lines[-1] == "answer: value-x"


def test_a_model_that_only_writes_malformed_calls_never_answers() -> None:
    model = ScriptedModel(lambda m: local_reply('<tool_call>{"name": "nope"}</tool_call>'))
    [r] = run_rollouts(model, Policy(), LookupTask(), LookupTask().examples("test"), cfg())
    assert r.stop == "turn_cap" and r.turns == 4 and r.tool_errors == 4 and r.truncated
    assert r.score is not None and r.score.hard == 0.0 and r.score.soft == 0.0
    assert "unknown tool 'nope'" in r.score.feedback and "turn cap" in r.score.feedback


def test_a_call_cut_by_max_tokens_counts_once() -> None:
    cut = local_reply('<tool_call>\n{"name": "lookup", "argu', finish_reason="length")
    assert cut.tool_call_errors is not None and len(cut.tool_call_errors) == 2
    [r] = run_rollouts(
        script(cut, local_reply(GOOD), "value-x"),
        Policy(),
        LookupTask(),
        LookupTask().examples("test"),
        cfg(),
    )
    assert r.tool_errors == 1 and r.score is not None and r.score.soft == 0.75
    error = tool_results(r.trajectory)[0]
    assert "never closed" in error and "cut by max_tokens" in error


def test_a_servers_malformed_calls_stay_on_the_turn_and_each_gets_a_result() -> None:
    sent = [tool_call("lookpu", {"key": "x"}), tool_call("lookup", {"key": "x"})]
    server = Completion(
        text="",
        tool_call_errors=[{"index": 0, "error": "unknown tool 'lookpu'", "raw": "{}"}],
        extra={"malformed_tool_calls": sent},
    )
    model = script(server, calls_tools(tool_call("lookup", {"key": "x"})), "value-x")
    [r] = run_rollouts(model, Policy(), LookupTask(), LookupTask().examples("test"), cfg())
    turn = r.trajectory[0]
    ids = [c["id"] for c in turn["tool_calls"]]
    # a valid conversation for an OpenAI server: every call of the turn has its result
    assert [m.get("tool_call_id") for m in r.trajectory[1:3]] == ids
    first, second = tool_results(r.trajectory)[:2]
    assert first.startswith("error: malformed tool call: unknown tool 'lookpu'")
    assert second.startswith("error: not run")  # nothing of a malformed reply runs
    assert r.tool_errors == 1 and r.tool_calls == 2  # one failed, one that ran later
    assert r.score is not None and r.score.hard == 1.0 and r.score.soft == 0.75
