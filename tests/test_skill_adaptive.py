"""The adaptive edit budget (`edit_schedule="adaptive"`: shrinks after a rejected step, grows
after an accepted one, within its bounds) and patch accumulation (`accumulate_steps=N`: N
batches' reflections merged and ranked before one update and one gate call)."""

from __future__ import annotations

import json
import re

import pytest

from selftaught.errors import ConfigError
from selftaught.gate import GateConfig
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.skill.budget_schedule import adapted_budget, edit_budget
from tests.scripted import (
    POISON,
    ToyTask,
    append,
    canned_analyst,
    edits_json,
    rule_target,
    schedule_of_rules,
    user_of,
)


def test_the_adaptive_budget_moves_with_the_gate_within_its_bounds():
    assert edit_budget(1, 9, 4, 2, "adaptive") == 4  # the first step's: the most
    assert adapted_budget(4, False, 4, 2) == 3 and adapted_budget(3, True, 4, 2) == 4
    assert adapted_budget(4, True, 4, 2) == 4  # never past the most
    assert adapted_budget(2, False, 4, 2) == 2  # nor under the least
    assert adapted_budget(1, False, 4, 0) == 1  # nor 0: a step without edits stays stuck
    with pytest.raises(ConfigError, match="accumulate_steps must be >= 1"):
        SkillOptConfig(accumulate_steps=0)


def rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()][1:]


def test_an_adaptive_run_takes_the_budget_the_gate_left(tmp_path):
    # alpha is accepted (3 stays 3, the most), the poison rule rejected (3 -> 2), beta
    # accepted (2 -> 3)
    rules = ("rule alpha", POISON, "rule beta", "rule gamma")
    analyst = canned_analyst(failure=schedule_of_rules(*rules))
    config = SkillOptConfig(
        epochs=2,
        batch_size=4,
        gate=GateConfig(),
        demos_max=0,
        pool=False,
        edit_schedule="adaptive",
        edit_budget_max=3,
        edit_budget_min=1,
    )
    SkillTrainer(
        config, ToyTask(), rule_target(), analyst, "# Skill\n", output_dir=tmp_path, progress=False
    ).train()
    history = rows(tmp_path)
    decisions = [r["gate"]["decision"] for r in history]
    assert decisions[:3] == ["accept_new_best", "reject", "accept_new_best"]
    budgets = [r["budget"] for r in history]
    expected = [3]
    for d in decisions[:-1]:
        expected.append(adapted_budget(expected[-1], d != "reject", 3, 1))
    assert budgets == expected and budgets[:4] == [3, 3, 2, 3]
    # what the analyst is told it may propose follows it too
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["edit_budget"] == adapted_budget(budgets[-1], decisions[-1] != "reject", 3, 1)


def rules_seen(messages) -> dict:
    """A failure reflection that proposes one rule per rule its shown attempts need."""
    shown = sorted(set(re.findall(r"\[needs (\w+)\]", user_of(messages))))
    return edits_json(*(append(f"rule {r}") for r in shown))


def test_accumulated_patches_meet_one_update_and_one_gate(tmp_path):
    analyst = canned_analyst(failure=rules_seen)
    config = SkillOptConfig(
        epochs=1,
        batch_size=4,
        gate=GateConfig(),
        demos_max=0,
        pool=False,
        llm_merge=False,
        accumulate_steps=2,
        edit_budget_max=4,
        reflect_on_successes=False,
    )
    SkillTrainer(
        config, ToyTask(), rule_target(), analyst, "# Skill\n", output_dir=tmp_path, progress=False
    ).train()
    history = rows(tmp_path)
    assert len(history) == 1 and history[0]["gate"]  # 2 batches of 4: one step, one gate
    diag = json.loads((tmp_path / "diagnostics" / "step_0001.json").read_text())
    assert len(diag["batch"]) == 8
    failures = [c for c in diag["analyst_calls"] if c["kind"] == "failure"]
    ids = [set(c["example_ids"]) for c in failures]
    assert len(failures) == 2 and all(len(i) == 4 for i in ids) and not ids[0] & ids[1]
    # the two batches' edits were merged and ranked before the one update
    merged = {e["content"] for e in diag["merged_edits"]}
    assert merged == {e["content"] for c in failures for e in c["edits"]}
    supported = [e for e in diag["merged_edits"] if e["support"] > 1]
    assert supported, "an edit both batches proposed is one edit with their joint support"


@pytest.mark.local
@pytest.mark.slow
def test_adaptive_accumulated_optimize_on_the_embedded_model(tmp_path):
    from typer.testing import CliRunner

    from selftaught.cli import app

    run = tmp_path / "run"
    args = [
        "optimize",
        "--task",
        "gym:basic_arithmetic?max_terms=2&max_digits=1",
        "--model",
        "local",
        "--epochs",
        "2",
        "--batch-size",
        "2",
        "--train-size",
        "4",
        "--val-size",
        "4",
        "--test-size",
        "2",
        "--max-tokens",
        "24",
        "--analyst-max-tokens",
        "64",
        "--demos-max",
        "0",
        "--no-test",
        "--no-successes",
        "--edit-schedule",
        "adaptive",
        "--edit-budget-max",
        "3",
        "--edit-budget-min",
        "1",
        "--accumulate-steps",
        "2",
        "--output",
        str(run),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    history = rows(run)
    assert len(history) == 2  # 2 epochs of 2 batches, accumulated by 2: 2 updates
    assert all(
        len(json.loads((run / "diagnostics" / f"step_{r['step']:04d}.json").read_text())["batch"])
        == 4
        for r in history
    )
    first = history[0]
    assert first["budget"] == 3
    assert history[1]["budget"] == adapted_budget(3, first["gate"]["decision"] != "reject", 3, 1)
