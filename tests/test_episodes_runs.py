"""Trajectories reach what a run writes: eval's rollouts JSONL and optimize's diagnostics."""

from __future__ import annotations

import json
from pathlib import Path

from selftaught.api import evaluate
from selftaught.rollout import Rollout, RolloutConfig
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.tasks.tools.calculator import CalculatorTask
from tests.scripted import ScriptedModel, calculator_agent, canned_analyst


def test_eval_writes_whole_trajectories(tmp_path: Path) -> None:
    task = CalculatorTask(train_size=0, val_size=0, test_size=3)
    out = tmp_path / "eval.jsonl"
    result = evaluate(
        task,
        ScriptedModel(calculator_agent),
        rollout=RolloutConfig(progress=False),
        output=out,
    )
    assert result.hard == 1.0 and result.n == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row, ex in zip(rows, task.examples("test"), strict=True):
        assert row["turns"] == 2 and row["tool_calls"] == 1 and row["stop"] == "answer"
        call, result_turn, final = row["trajectory"]
        assert call["tool_calls"][0]["function"]["name"] == "calculator"
        assert result_turn == {
            "role": "tool",
            "tool_call_id": call["tool_calls"][0]["id"],
            "content": ex.reference,
        }
        assert final["content"] == f"Answer: {ex.reference}"
        assert Rollout.from_dict(row).trajectory == row["trajectory"]


def test_optimize_diagnostics_show_trajectories(tmp_path: Path) -> None:
    task = CalculatorTask(train_size=4, val_size=3, test_size=2)
    SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=4, concurrency=2),
        task,
        ScriptedModel(calculator_agent),
        canned_analyst(),
        "# Skill\n",
        output_dir=tmp_path,
        progress=False,
    ).train()
    diag = json.loads((tmp_path / "diagnostics" / "step_0001.json").read_text())
    rows = diag["batch"] + diag["val"]
    assert rows and all(r["turns"] == 2 and r["tool_calls"] == 1 for r in rows)
    first = rows[0]["trajectory"]
    assert first[0].startswith('call calculator({"expression": ') and first[1].startswith(
        "answer: Answer: "
    )


def test_eval_table_counts_tool_use(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import io

    from rich.console import Console

    from selftaught.cli import eval_serve

    task = CalculatorTask(train_size=0, val_size=0, test_size=2)
    result = evaluate(task, ScriptedModel(calculator_agent), rollout=RolloutConfig(progress=False))
    buf = io.StringIO()
    monkeypatch.setattr(eval_serve, "out", Console(file=buf, width=120))
    eval_serve.print_eval(result)
    text = buf.getvalue()
    assert "turns / tool calls per episode" in text and "2.00 / 1.00" in text
    assert "episodes that called a tool" in text


def test_the_analyst_sees_calls_results_and_the_final_answer(tmp_path: Path) -> None:
    from tests.scripted import calls_tools, prompt_kind, tool_call, tool_results, user_of

    def misreports(messages):  # type: ignore[no-untyped-def]
        if tool_results(messages):
            return "Answer: 7"  # ignores what the calculator said
        return calls_tools(tool_call("calculator", {"expression": "6 + 1"}))

    analyst = canned_analyst()
    task = CalculatorTask(train_size=4, val_size=3, test_size=2)
    SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=4, concurrency=2),
        task,
        ScriptedModel(misreports),
        analyst,
        "# Skill\n",
        output_dir=tmp_path,
        progress=False,
    ).train()
    failure = next(user_of(m) for m in analyst.calls if prompt_kind(m) == "failure")
    assert 'call calculator({"expression": "6 + 1"}) -> 7' in failure
    assert "answer: Answer: 7" in failure


def test_attempt_text_is_bounded_and_keeps_the_end() -> None:
    from selftaught.rollout import attempt_text
    from tests.scripted import calls_tools, tool_call

    task = CalculatorTask(train_size=0, val_size=0, test_size=1)
    model = ScriptedModel(lambda m: calls_tools(tool_call("calculator", {"expression": "2*3"})))
    [r] = evaluate(task, model, rollout=RolloutConfig(progress=False, max_turns=40)).rollouts
    text = attempt_text(r, 400)
    assert len(text) <= 450 and "more steps)" in text
    assert text.endswith("stopped: turn_cap after 40 turns")
    assert attempt_text(Rollout("x", [], reply="plain " * 200), 10) == "plain " * 200
