"""Grounded proposals (issue 52, `--grounded-proposals`): a train-set summary written once per run
from train items only, saved so a resumed run does not ask again, grounds one more proposal
call per step whose edits meet the same gate; off by default."""

from __future__ import annotations

import json

import pytest

from selftaught.demos import DemoLeakError, LeakCheck
from selftaught.gate import GateConfig
from selftaught.models.base import run_sync
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.skill.grounding import Summarizer, TrainSummary, read_summary, summary_sample
from tests.scripted import (
    ScriptedModel,
    ToyTask,
    append,
    canned_analyst,
    edits_json,
    rule_target,
    transient,
    user_of,
)

SUMMARY_PROMPT = "You are studying a data set"
GROUNDED_PROMPT = "## What the task's data looks like"
SUMMARY = "Addition questions, each tagged with the rule it needs; answers are 'Answer: N'."


def kind(messages) -> str:
    text = user_of(messages)
    if SUMMARY_PROMPT in text:
        return "summary"
    if GROUNDED_PROMPT in text:
        return "grounded"
    return "other"


def grounded_analyst(summary: str = f"<summary>{SUMMARY}</summary>") -> ScriptedModel:
    """Writes `summary` when asked for one; a grounded proposal adds 'rule alpha' and 'rule
    beta' only when the summary is in its prompt; every other reflection proposes nothing."""
    canned = canned_analyst()

    def answer(messages):
        k = kind(messages)
        if k == "summary":
            return summary
        if k == "grounded":
            if SUMMARY not in user_of(messages):
                return '{"edits": []}'
            return edits_json(append("Always apply rule alpha."), append("Apply rule beta."))
        return canned.fn(messages)

    return ScriptedModel(answer, "grounded-analyst")


def calls_of(model: ScriptedModel, name: str) -> list[str]:
    return [user_of(m) for m in model.calls if kind(m) == name]


def make(tmp_path, analyst, **kw):
    config = dict(epochs=1, batch_size=8, demos_max=0, pool=False, screen_size=0)
    config.update(kw)
    return SkillTrainer(
        SkillOptConfig(gate=GateConfig(), **config),
        ToyTask(),
        rule_target(),
        analyst,
        "# Skill\n",
        output_dir=tmp_path,
        progress=False,
    )


def history(path) -> list[dict]:
    return [json.loads(x) for x in (path / "history.jsonl").read_text().splitlines()]


def test_off_by_default_no_summary_no_grounded_call(tmp_path):
    assert SkillOptConfig().grounded_proposals is False
    analyst = grounded_analyst()
    result = make(tmp_path, analyst).train()
    assert calls_of(analyst, "summary") == [] and calls_of(analyst, "grounded") == []
    assert not (tmp_path / "train_summary.json").exists()
    assert result.val_best.solved == result.val_initial.solved == 0


def test_the_summary_grounds_a_proposal_that_meets_the_gate(tmp_path):
    analyst = grounded_analyst()
    result = make(tmp_path, analyst, grounded_proposals=True).train()
    (summary_prompt,) = calls_of(analyst, "summary")
    # train items only, with their references; nothing of val or test
    assert "What is 0 + 3?" in summary_prompt and "Reference answer: 3" in summary_prompt
    assert "What is 1000 +" not in summary_prompt and "What is 2000 +" not in summary_prompt
    saved = json.loads((tmp_path / "train_summary.json").read_text())
    assert saved["text"] == SUMMARY and saved["status"] == "ok"
    assert sorted(saved["item_ids"]) == [f"train-{i:03d}" for i in range(8)]
    (grounded,) = calls_of(analyst, "grounded")
    assert SUMMARY in grounded
    assert "Answer given:" in grounded and "Grader feedback:" in grounded  # the failed replies
    # its edits met the gate like any other: val 0 -> alpha 5 + beta 3 of 11
    assert result.val_initial.solved == 0 and result.val_best.solved == 8
    diag = json.loads((tmp_path / "diagnostics" / "step_0001.json").read_text())
    assert "grounded" in {c["kind"] for c in diag["analyst_calls"]}
    # charged to the optimizer like every analyst call
    assert result.usage["optimizer"]["calls"] == len(analyst.calls)


def test_a_resumed_run_reads_the_summary_instead_of_asking_again(tmp_path):
    analyst = grounded_analyst()
    make(tmp_path, analyst, grounded_proposals=True, batch_size=4, max_steps=1).train()
    assert len(calls_of(analyst, "summary")) == 1
    again = grounded_analyst()
    make(tmp_path, again, grounded_proposals=True, batch_size=4, max_steps=2).train()
    assert calls_of(again, "summary") == []  # read from train_summary.json
    assert [SUMMARY in p for p in calls_of(again, "grounded")] == [True]
    assert [r["step"] for r in history(tmp_path)] == [0, 1, 2]


def test_a_failed_summary_call_leaves_the_step_ungrounded_and_is_asked_again(tmp_path):
    analyst = grounded_analyst()
    analyst.fail_at[0] = transient()  # the first optimizer call is the summary
    make(tmp_path, analyst, grounded_proposals=True, batch_size=4, max_steps=2).train()
    assert len(calls_of(analyst, "summary")) == 2
    assert len(calls_of(analyst, "grounded")) == 1  # step 2 only
    assert json.loads((tmp_path / "train_summary.json").read_text())["status"] == "ok"


def test_no_demo_and_leaking_train_items_are_never_summarized():
    task = ToyTask(overlap=True)  # val-000 asks train-000's question
    train = task.examples("train")
    train[1].state["no_demo"] = "an end user's correction"
    check = LeakCheck.of_task(task)
    ids = {ex.id for ex in summary_sample(train, check, 100, seed=0)}
    assert ids == {ex.id for ex in train} - {"train-000", "train-001"}
    assert len(summary_sample(train, check, 3, seed=0)) == 3


def test_summarizing_a_held_out_item_fails_closed_naming_it():
    task = ToyTask()
    model = grounded_analyst()
    summarizer = Summarizer(
        model, max_tokens=64, temperature=0, max_input_chars=200, max_reply_chars=50, timeout_s=5
    )
    items = task.examples("train")[:2] + task.examples("val")[:1]
    with pytest.raises(DemoLeakError, match="val-000"):
        run_sync(summarizer.summarize(items, LeakCheck.of_task(task)))
    assert model.calls == []


def test_read_summary_and_round_trip():
    assert read_summary("x <summary> a </summary> y <summary>b</summary>") == "b"
    assert read_summary("no tags") == "no tags"
    assert read_summary("<summary>cut off") == "cut off"
    s = TrainSummary("t", ["train-000"], "backend_error", "503")
    assert TrainSummary.from_dict(s.to_dict()) == s


def test_summary_items_must_be_positive():
    from selftaught.errors import ConfigError

    with pytest.raises(ConfigError, match="summary_items"):
        SkillOptConfig(summary_items=0)
