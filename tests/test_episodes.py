"""The episode protocol through rollout.py, with scripted models: tool calls → results → final
answer, the caps, the blame rule for failed calls, and the one-step case unchanged."""

from __future__ import annotations

import json
import re

import pytest

from selftaught.evaluation import evaluate_split
from selftaught.models.base import Completion, GenerationParams, Message
from selftaught.policy import Policy
from selftaught.rollout import Rollout, RolloutConfig, episode_row, run_rollouts
from selftaught.tasks.base import Example, Score
from selftaught.tasks.episode import Environment, Episode, Tool, ToolError
from selftaught.tasks.tools.calculator import CalculatorTask
from selftaught.tasks.tools.kvstore import KVStoreTask
from tests.scripted import (
    ScriptedModel,
    ToyTask,
    calculator_agent,
    calls_tools,
    tool_call,
    tool_results,
    transient,
)


def cfg(**kw: object) -> RolloutConfig:
    kw.setdefault("concurrency", 2)
    return RolloutConfig(progress=False, **kw)  # type: ignore[arg-type]


def calc_task(n: int = 3) -> CalculatorTask:
    return CalculatorTask(seed=1, train_size=0, val_size=0, test_size=n)


def test_tool_call_result_final_answer() -> None:
    task = calc_task()
    model = ScriptedModel(calculator_agent)
    rollouts = run_rollouts(model, Policy(), task, task.examples("test"), cfg())
    assert [r.score.hard for r in rollouts if r.score] == [1.0, 1.0, 1.0]
    r = rollouts[0]
    assert r.ok and r.turns == 2 and r.tool_calls == 1 and r.tool_errors == 0
    assert r.stop == "answer" and not r.truncated
    roles = [m["role"] for m in r.trajectory]
    assert roles == ["assistant", "tool", "assistant"]
    call = r.trajectory[0]["tool_calls"][0]
    assert call["id"] and r.trajectory[1]["tool_call_id"] == call["id"]
    assert (
        r.trajectory[1]["content"]
        == r.reply.removeprefix("Answer: ")
        == task.examples("test")[0].reference
    )
    # the second call saw the prompt, the call and its result; tokens summed over both turns
    first, second = [c for c in model.calls if c[0] == r.messages[0]]
    assert second[: len(first)] == first and second[len(first) :] == r.trajectory[:2]
    tools = model.params[0].tools
    assert tools and tools[0]["function"]["name"] == "calculator"
    prompt = sum(sum(len(str(m.get("content", ""))) for m in c) // 4 + 1 for c in (first, second))
    assert r.prompt_tokens == prompt


def test_turn_cap_stops_and_marks_truncated() -> None:
    task = calc_task(1)
    model = ScriptedModel(lambda m: calls_tools(tool_call("calculator", {"expression": "1+1"})))
    [r] = run_rollouts(model, Policy(), task, task.examples("test"), cfg(max_turns=3))
    assert len(model.calls) == 3 and r.turns == 3 and r.tool_calls == 3
    assert r.stop == "turn_cap" and r.truncated
    assert r.ok and r.score is not None and r.score.hard == 0
    assert "turn cap" in r.score.feedback


def test_token_cap_stops_and_limits_the_last_turn() -> None:
    task = calc_task(1)
    model = ScriptedModel(
        lambda m: calls_tools(tool_call("calculator", {"expression": "2*3"}), completion_tokens=10)
    )
    params = GenerationParams(max_tokens=64)
    [r] = run_rollouts(
        model, Policy(), task, task.examples("test"), cfg(max_episode_tokens=25, params=params)
    )
    assert [p.max_tokens for p in model.params] == [25, 15, 5]  # never more than what is left
    assert r.completion_tokens == 30 and r.stop == "token_cap" and r.truncated
    assert "token cap" in r.score.feedback  # type: ignore[union-attr]


class Broken(Environment):
    def __init__(self) -> None:
        def lookup(key: str) -> str:
            if key == "crash":
                raise RuntimeError("database is down")
            if key == "bad":
                raise ToolError("no such entry")
            return "value-" + key

        self.tools = (
            Tool(
                "lookup",
                "Look a key up.",
                {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
                lookup,
            ),
        )


class LookupTask:
    kind = "agent"
    name = "lookup"
    instructions = ""
    max_turns = 4

    def examples(self, split: str) -> list[Example]:
        return [Example(id="q0", input="look up x", reference="value-x")]

    def environment(self, example: Example) -> Environment:
        return Broken()

    def score(self, output: str, example: Example) -> Score:
        ok = output.strip() == example.reference
        return Score(float(ok), float(ok), "ok" if ok else f"expected {example.reference}")


def script(*steps: Completion | str) -> ScriptedModel:
    """A model replying with `steps` in order, one per call."""
    return ScriptedModel(lambda m: steps[sum(x["role"] == "assistant" for x in m)])


def test_a_crashing_tool_is_an_error_not_a_zero() -> None:
    task = LookupTask()
    model = script(calls_tools(tool_call("lookup", {"key": "crash"})), "value-x")
    [r] = run_rollouts(model, Policy(), task, task.examples("test"), cfg())
    assert r.score is None and r.error_source == "tool"
    assert "RuntimeError: database is down" in (r.error or "") and "lookup" in (r.error or "")
    assert r.trajectory and r.trajectory[0]["tool_calls"]  # what happened up to the crash
    result = evaluate_split(
        task,
        script(calls_tools(tool_call("lookup", {"key": "crash"}))),
        Policy(),
        split="test",
        rollout=cfg(),
    )
    assert result.n == 0 and result.n_errors == 1  # excluded, not counted as wrong


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (tool_call("lookpu", {"key": "x"}), "unknown tool 'lookpu'; the tools are: lookup"),
        (tool_call("lookup", '{"key": '), "arguments are not valid JSON"),
        (tool_call("lookup", {"name": "x"}), "invalid arguments for lookup: 'key' is a required"),
        (tool_call("lookup", {"key": "bad"}), "no such entry"),  # the tool refused the input
    ],
)
def test_a_failed_call_is_a_result_that_counts_against_the_episode(call: dict, says: str) -> None:
    task = LookupTask()
    good = calls_tools(tool_call("lookup", {"key": "x"}))
    model = script(calls_tools(call), good, "value-x")
    [r] = run_rollouts(model, Policy(), task, task.examples("test"), cfg())
    assert r.ok and r.error is None
    first = tool_results(r.trajectory)[0]
    assert first.startswith("error: ") and says in first
    assert r.tool_errors == 1 and r.tool_calls == 2 and r.turns == 3
    assert r.score is not None and r.score.hard == 1.0 and r.score.soft == 0.75
    assert "1 failed tool call(s)" in r.score.feedback


def test_samples_are_separate_episodes_with_their_own_state() -> None:
    task = KVStoreTask(seed=0, train_size=0, val_size=0, test_size=30)
    example = next(e for e in task.examples("test") if e.state["goal"]["kind"] == "increase")
    key = next(iter(example.state["goal"]["set"]))
    n = int(re.search(r"by (\d+)", str(example.input)).group(1))  # type: ignore[union-attr]

    def agent(messages: list[Message]) -> str | Completion:
        results = tool_results(messages)
        if not results:
            return calls_tools(tool_call("get", {"key": key}))
        if len(results) == 1:
            return calls_tools(tool_call("set", {"key": key, "value": int(results[0]) + n}))
        return f"Answer: {results[0] and int(results[0]) + n}"

    envs: list[object] = []

    class Spy(KVStoreTask):
        def environment(self, example: Example):  # type: ignore[no-untyped-def]
            envs.append(super().environment(example))
            return envs[-1]

    spy = Spy(seed=0, train_size=0, val_size=0, test_size=30)
    before = dict(example.state["store"])
    rollouts = run_rollouts(ScriptedModel(agent), Policy(), spy, [example], cfg(samples=3))
    assert [r.score.hard for r in rollouts if r.score] == [1.0, 1.0, 1.0]
    assert [r.sample for r in rollouts] == [0, 1, 2]
    assert len({id(e) for e in envs}) == 3  # one world per episode
    assert example.state["store"] == before  # the example itself is never written


def test_a_transient_failure_mid_episode_is_a_backend_error() -> None:
    task = calc_task()
    model = ScriptedModel(calculator_agent)
    model.fail_at[1] = transient()
    [r] = run_rollouts(model, Policy(), task, task.examples("test")[:1], cfg())
    assert r.error_source == "backend" and r.score is None and len(r.trajectory) == 2


def test_one_step_tasks_are_unchanged() -> None:
    task = ToyTask()
    model = ScriptedModel(lambda m: "Answer: 3")
    [r] = run_rollouts(model, Policy(), task, task.examples("val")[:1], cfg())
    assert model.params[0].tools is None and len(model.calls) == 1
    row = r.to_dict()
    assert not {"turns", "tool_calls", "trajectory", "stop"} & set(row)
    assert episode_row(r) == {} and not r.is_episode
    assert Rollout.from_dict(row) == r


def test_episode_rows_round_trip_and_show_the_trajectory() -> None:
    task = calc_task()
    [r] = run_rollouts(
        ScriptedModel(calculator_agent), Policy(), task, task.examples("test")[:1], cfg()
    )
    row = json.loads(json.dumps(r.to_dict()))
    assert row["turns"] == 2 and row["trajectory"][0]["tool_calls"]
    back = Rollout.from_dict(row)
    assert back.trajectory == r.trajectory and back.stop == "answer" and back.tool_calls == 1
    lines = episode_row(r)["trajectory"]
    assert lines[0].startswith("call calculator({") and lines[0].endswith(
        f"-> {task.examples('test')[0].reference}"
    )
    assert lines[-1] == f"answer: Answer: {task.examples('test')[0].reference}"


def test_score_episode_sees_the_environment() -> None:
    task = KVStoreTask(seed=0, train_size=0, val_size=0, test_size=30)
    example = next(e for e in task.examples("test") if e.state["goal"]["kind"] == "sum")
    target, value = next(iter(example.state["goal"]["set"].items()))
    # reports the right number without storing it: the final state check fails
    model = script(f"Answer: {value}")
    [r] = run_rollouts(model, Policy(), task, [example], cfg())
    assert r.turns == 1 and r.stop == "answer"
    assert r.score is not None and r.score.hard == 0 and r.score.soft == pytest.approx(2 / 3)
    assert f"'{target}' should be {value}, is None" in r.score.feedback


def test_episode_is_given_to_the_scorer() -> None:
    seen: list[Episode] = []

    class Spy(LookupTask):
        def score_episode(self, episode: Episode, example: Example) -> Score:
            seen.append(episode)
            return self.score(episode.final, example)

    model = script(calls_tools(tool_call("lookup", {"key": "x"})), "value-x")
    run_rollouts(model, Policy(), Spy(), Spy().examples("test"), cfg())
    [ep] = seen
    assert (
        ep.final == "value-x"
        and ep.turns == 2
        and ep.calls() == [("lookup", '{"key": "x"}', "value-x")]
    )
