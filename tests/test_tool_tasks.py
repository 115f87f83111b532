"""The bundled tool tasks: generators, splits, scoring, and the calculator's safety."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.models.base import Completion, Message
from selftaught.policy import Policy
from selftaught.rollout import RolloutConfig, run_rollouts
from selftaught.tasks import load_task
from selftaught.tasks.base import TaskError, check_disjoint
from selftaught.tasks.episode import Episode, ToolError
from selftaught.tasks.tools.calculator import CalculatorTask, calculate
from selftaught.tasks.tools.kvstore import KVStoreEnvironment, KVStoreTask
from tests.scripted import ScriptedModel, calls_tools, tool_call, tool_results

CFG = RolloutConfig(progress=False, concurrency=4)


@pytest.mark.parametrize("spec", ["tool:calculator", "tool:kvstore"])
def test_generators_are_seeded_and_splits_disjoint(spec: str) -> None:
    a = load_task(spec, seed=3, train_size=30, val_size=10, test_size=20)
    b = load_task(spec, seed=3, train_size=30, val_size=10, test_size=20)
    c = load_task(spec, seed=4, train_size=30, val_size=10, test_size=20)
    for split, size in (("train", 30), ("val", 10), ("test", 20)):
        xs = a.examples(split)  # type: ignore[arg-type]
        assert len(xs) == size
        assert [(e.input, e.reference, e.state) for e in xs] == [
            (e.input, e.reference, e.state)
            for e in b.examples(split)  # type: ignore[arg-type]
        ]
    assert [e.input for e in a.examples("test")] != [e.input for e in c.examples("test")]
    check_disjoint(a)
    questions = [e.input for s in ("train", "val", "test") for e in a.examples(s)]  # type: ignore[arg-type]
    assert len(set(questions)) == len(questions)


def test_bad_specs_say_what_is_wrong() -> None:
    with pytest.raises(TaskError, match="unknown tool:calculator option.*digits"):
        load_task("tool:calculator?digits=5")
    with pytest.raises(TaskError, match="min_digits <= max_digits"):
        load_task("tool:calculator?min_digits=6&max_digits=4")
    with pytest.raises(TaskError, match="unknown tool task.*tool:calculator, tool:kvstore"):
        load_task("tool:abacus")
    with pytest.raises(TaskError, match="takes no options"):
        load_task("tool:kvstore?size=3")
    big = load_task("tool:calculator?min_digits=6&max_digits=6", test_size=5, train_size=0)
    assert big.name == "tool:calculator?min_digits=6&max_digits=6"
    assert all(len(n) == 6 for e in big.examples("test") for n in re.findall(r"\d+", e.input))


def test_tasks_are_listed() -> None:
    result = CliRunner().invoke(app, ["tasks"])
    assert result.exit_code == 0, result.output
    assert "tool:calculator" in result.output and "tool:kvstore" in result.output


# ---- calculator ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("48213 * 7719", "372156147"),
        ("(12 + 3) * 4 - 6 / 3", "58"),
        ("2 ** 10", "1024"),
        ("1 / 3", "0.3333333333"),
        ("-7 // 2", "-4"),
        ("12,345 × 2", "24690"),
        ("3^2", "9"),
    ],
)
def test_calculator_evaluates_arithmetic_exactly(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("__import__('os').system('id')", "unsupported syntax Call"),
        ("(1).real", "unsupported syntax Attribute"),
        ("x + 1", "unsupported syntax Name"),
        ("'a' * 3", "only numbers"),
        ("[1][0]", "unsupported syntax Subscript"),
        ("0.5 ** -2000", "too large"),
        ("lambda: 1", "unsupported syntax Lambda"),
        ("9 ** 9 ** 9", "too large"),
        ("10 ** 100", "too large"),
        ("2 ** 0.5 ** -2000", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 201, "longer than 200"),
        ("True + 1", "only numbers"),
    ],
)
def test_calculator_refuses_what_is_not_plain_arithmetic(expression: str, says: str) -> None:
    with pytest.raises(ToolError, match=re.escape(says)):
        calculate(expression)


def test_calculator_scores_the_final_number() -> None:
    task = CalculatorTask(train_size=0, val_size=0, test_size=1)
    ex = task.examples("test")[0]
    ref = int(ex.reference)
    assert task.score(f"The result is {ref:,}.", ex).hard == 1.0
    assert task.score(f"Answer: {ref}.0", ex).hard == 1.0
    wrong = task.score(f"Answer: {ref + 1}", ex)
    assert (
        wrong.hard == 0 and wrong.soft == 0 and f"expected {ref}, got {ref + 1}" in wrong.feedback
    )
    assert "no number" in task.score("I cannot say.", ex).feedback


def _episode(final: str, *calls: tuple[str, str]) -> Episode:
    trajectory: list[Message] = []
    for k, (args, result) in enumerate(calls):
        trajectory.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [tool_call("calculator", args, f"c{k}")],
            }
        )
        trajectory.append({"role": "tool", "tool_call_id": f"c{k}", "content": result})
    trajectory.append({"role": "assistant", "content": final})
    return Episode(None, trajectory, final, "answer", len(calls) + 1, len(calls))  # type: ignore[arg-type]


def test_calculator_episode_feedback_says_how_the_tool_was_used() -> None:
    task = CalculatorTask(train_size=0, val_size=0, test_size=1)
    ex = task.examples("test")[0]
    ref = ex.reference
    assert "never called" in task.score_episode(_episode("Answer: 12"), ex).feedback
    misread = task.score_episode(_episode("Answer: 12", ('{"expression": "x"}', ref)), ex)
    assert misread.hard == 0 and misread.soft == 0.5 and "did not report it" in misread.feedback
    wrong = task.score_episode(_episode("Answer: 12", ('{"expression": "1+1"}', "2")), ex)
    assert wrong.soft == 0 and "wrong expression" in wrong.feedback
    assert task.score_episode(_episode(f"Answer: {ref}", ("{}", ref)), ex).hard == 1.0


# ---- kvstore ------------------------------------------------------------------------------


def test_kvstore_tools() -> None:
    env = KVStoreEnvironment({"apples": 3})
    assert env.list_keys() == ["apples"] and env.get("apples") == 3
    assert env.set("pears", "12") == "ok: pears = 12" and env.get("pears") == 12
    with pytest.raises(ToolError, match="no key 'plums'"):
        env.get("plums")
    with pytest.raises(ToolError, match="must be an integer"):
        env.set("plums", "twelve")
    assert [t["function"]["name"] for t in env.schemas()] == ["list_keys", "get", "set"]


def solve_kv(messages: list[Message]) -> str | Completion:
    """A correct agent for every kvstore goal: read what it needs, write, report."""
    user = next(m["content"] for m in messages if m["role"] == "user")
    keys = list(dict.fromkeys(re.findall(r"'(\w+)'", user.split("\n\n")[0])))
    new = keys.pop(0) if user.startswith("Set") else None  # not in the store yet
    results = tool_results(messages)
    if len(results) < len(keys):
        return calls_tools(*(tool_call("get", {"key": k}) for k in keys))
    values = dict(zip(keys, map(int, results[: len(keys)]), strict=False))
    if user.startswith("Which"):
        return f"Answer: {max(values, key=values.__getitem__)}"
    if len(results) == len(keys):
        if user.startswith("Set"):
            a, b = keys
            return calls_tools(tool_call("set", {"key": new or "", "value": values[a] + values[b]}))
        if user.startswith("Increase"):
            n = int(re.search(r"by (\d+)", user).group(1))  # type: ignore[union-attr]
            return calls_tools(tool_call("set", {"key": keys[0], "value": values[keys[0]] + n}))
        a, b = keys
        return calls_tools(
            tool_call("set", {"key": a, "value": values[b]}),
            tool_call("set", {"key": b, "value": values[a]}),
        )
    written = int(results[len(keys)].split("= ")[1])  # "ok: key = value" of the first set
    return f"Answer: {values[keys[1]] if user.startswith('Swap') else written}"


def test_kvstore_a_correct_agent_solves_every_goal_kind() -> None:
    task = KVStoreTask(seed=1, train_size=0, val_size=0, test_size=24)
    examples = task.examples("test")
    assert {e.state["goal"]["kind"] for e in examples} == {"sum", "increase", "swap", "largest"}
    rollouts = run_rollouts(ScriptedModel(solve_kv), Policy(), task, examples, CFG)
    bad = [
        (r.example_id, r.score and r.score.feedback, r.error)
        for r in rollouts
        if not (r.score and r.score.hard)
    ]
    assert not bad
    assert all(r.turns >= 2 and r.tool_calls >= 2 for r in rollouts)


def test_kvstore_scores_the_final_state_and_the_answer() -> None:
    task = KVStoreTask(seed=1, train_size=0, val_size=0, test_size=24)
    ex = next(e for e in task.examples("test") if e.state["goal"]["kind"] == "increase")
    key, want = next(iter(ex.state["goal"]["set"].items()))
    other = next(k for k in ex.state["store"] if k != key)

    def episode(final_store: dict[str, int], answer: str) -> Episode:
        env = KVStoreEnvironment(final_store)
        return Episode(env, [], answer, "answer", 2)

    good = {**ex.state["store"], key: want}
    assert task.score_episode(episode(good, f"Answer: {want}"), ex).hard == 1.0
    meddled = task.score_episode(episode({**good, other: -1}, f"Answer: {want}"), ex)
    assert meddled.hard == 0 and meddled.soft == pytest.approx(2 / 3)
    assert f"keys changed that the goal did not ask for: {other}" in meddled.feedback
    unreported = task.score_episode(episode(good, "Done."), ex)
    assert unreported.hard == 0 and f"the answer should be {want}" in unreported.feedback
    # without tools nothing changes: the reply alone cannot solve a goal that writes
    assert task.score(f"Answer: {want}", ex).hard == 0


def test_kvstore_largest_refuses_a_hedged_answer() -> None:
    task = KVStoreTask(seed=1, train_size=0, val_size=0, test_size=24)
    ex = next(e for e in task.examples("test") if e.state["goal"]["kind"] == "largest")
    top = ex.state["goal"]["answer"]
    other = next(k for k in ex.state["goal"]["asked"] if k != top)
    assert task.score(f"Answer: {top}", ex).hard == 1.0
    assert task.score(f"Answer: {top} or {other}", ex).hard == 0
