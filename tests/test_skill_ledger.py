"""The slow update with scripted models: the edit ledger across runs, "tried and failed" in the
analyst's prompt, the slow consolidation (leave-one-out, merge, the gate), and the night's
`slow_every` and rollbacks."""

from __future__ import annotations

import json
from pathlib import Path

from selftaught.gate import GateConfig
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.skill.document import Edit
from selftaught.skill.ledger import EditLedger, LedgerEvent
from selftaught.skill.result import SkillRunResult
from selftaught.skill.slow import rule_units
from selftaught.sleep.adoption import staging
from selftaught.sleep.night.cycle import run_night
from selftaught.sleep.paths import edit_ledger_path
from tests.scripted import (
    POISON,
    ScriptedModel,
    ToyTask,
    canned_analyst,
    edits_json,
    rule_target,
    schedule_of_rules,
    user_of,
)
from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models

TRIED = "## Tried and failed in earlier runs"
MERGE = "## Rules that kept helping"


def run(tmp: Path, name: str, analyst=None, skill: str = "# Skill\n", **cfg) -> SkillRunResult:
    defaults = {
        "epochs": 1,
        "batch_size": 4,
        "concurrency": 4,
        "gate": GateConfig(),
        "demos_max": 0,
        "pool": False,
        "edit_ledger": str(tmp / "ledger.jsonl"),
    }
    config = SkillOptConfig(**{**defaults, **cfg})
    analyst = analyst or canned_analyst(failure=schedule_of_rules("rule alpha", POISON))
    trainer = SkillTrainer(
        config, ToyTask(), rule_target(), analyst, skill, output_dir=tmp / name, progress=False
    )
    return trainer.train()


def held_out_inputs() -> list[str]:
    task = ToyTask()
    return [ex.input for split in ("val", "test") for ex in task.examples(split)]


def analyst_prompts(analyst: ScriptedModel) -> list[str]:
    return [user_of(m) for m in analyst.calls]


def test_the_ledger_persists_across_runs_and_counts_each_edit_once(tmp_path):
    run(tmp_path, "one")
    run(tmp_path, "two")
    ledger = EditLedger(tmp_path / "ledger.jsonl")
    assert len(ledger.runs()) == 2
    entries = {e.content: e for e in ledger.summary("skill")}
    assert set(entries) == {POISON, "rule alpha"}  # identical edits: one entry each
    poison, alpha = entries[POISON], entries["rule alpha"]
    assert (poison.proposed, poison.accepted, poison.rejected) == (2, 0, 2)
    assert (alpha.proposed, alpha.accepted, alpha.rejected) == (2, 2, 0)
    assert len(poison.runs) == 2 and poison.tasks  # the train tasks it was proposed on
    assert all(t.startswith("train-") for t in poison.tasks + alpha.tasks)
    assert [e.content for e in ledger.tried_and_failed("skill")] == [POISON]
    # the same event written twice (a resumed step) counts once; a torn last line is skipped
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    with open(tmp_path / "ledger.jsonl", "a") as f:
        f.write(lines[-1] + "\n" + lines[-1][:20])
    assert len(EditLedger(tmp_path / "ledger.jsonl").events()) == len(ledger.events())


def test_a_twice_rejected_edit_is_shown_as_tried_and_failed_on_the_next_run(tmp_path):
    first = canned_analyst(failure=schedule_of_rules("rule alpha", POISON))
    run(tmp_path, "one", first)
    run(tmp_path, "two")
    assert not any(TRIED in p for p in analyst_prompts(first))  # one rejection: not yet
    third = canned_analyst(failure=schedule_of_rules("rule alpha", POISON))
    result = run(tmp_path, "three", third)
    prompts = [p for p in analyst_prompts(third) if "## Failed attempts" in p]
    assert POISON in prompts[0].split(TRIED, 1)[1].split("## Your job", 1)[0]
    # and it is not applied again: the second step applies nothing, the gate never sees it
    row = json.loads((tmp_path / "three" / "history.jsonl").read_text().splitlines()[2])
    assert row["edits"]["applied"] == 0 and "rejected before" in row["gate"]["reason"]
    assert result.decisions == {"accept_new_best": 1, "reject": 1}
    poison = next(e for e in EditLedger(tmp_path / "ledger.jsonl").summary() if e.content == POISON)
    assert (poison.proposed, poison.rejected) == (3, 2)


def no_edits_analyst(merge_reply: str = '{"edits": []}') -> ScriptedModel:
    def answer(messages):
        return merge_reply if MERGE in user_of(messages) else '{"edits": []}'

    return ScriptedModel(answer, "scripted-analyst")


def test_the_slow_update_drops_what_earns_nothing_and_keeps_what_helps(tmp_path):
    analyst = no_edits_analyst()
    skill = "# Skill\nrule alpha\nBe polite.\nrule beta\n  (beta's second line)\n"
    result = run(tmp_path, "slow", analyst, skill, slow_every=1)
    slow = result.slow
    assert slow is not None and slow.due and slow.shipped and slow.decision == "accept"
    assert slow.dropped == ["Be polite."]
    kept = [t.rule for t in slow.trials if t.verdict == "kept"]
    assert kept == ["rule alpha", "rule beta\n  (beta's second line)"]
    assert result.best_skill == "# Skill\nrule alpha\nrule beta\n  (beta's second line)\n"
    assert (tmp_path / "slow" / "best_skill.md").read_text() == result.best_skill
    assert slow.val_after == slow.val_before and slow.chars_after < slow.chars_before
    summary = json.loads((tmp_path / "slow" / "summary.json").read_text())
    assert SkillRunResult.from_dict(summary).slow == slow
    ledger = EditLedger(tmp_path / "ledger.jsonl")
    assert [e.kind for e in ledger.events() if e.run.endswith("slow")][-2:] == ["dropped", "slow"]
    # val (and test) items reach the analyst as scores only, never as text
    prompts = "\n".join(analyst_prompts(analyst))
    assert not any(text in prompts for text in held_out_inputs())
    # the same command again: the finished run is read back, the update not done twice
    again = run(tmp_path, "slow", analyst, skill, slow_every=1)
    assert again.slow == slow and again.best_skill == result.best_skill
    assert len(EditLedger(tmp_path / "ledger.jsonl").runs()) == 1


def accepted_twice(ledger: EditLedger, *rules: str) -> None:
    for n in range(2):
        ledger.append(
            [LedgerEvent.of_edit("accepted", f"/old/run{n}", 1, Edit("append", r)) for r in rules]
        )


def test_a_slow_rewrite_that_loses_val_is_rejected_by_the_gate(tmp_path):
    accepted_twice(EditLedger(tmp_path / "ledger.jsonl"), "rule alpha", "rule beta")
    merge = edits_json(
        {"op": "replace", "target": "rule alpha", "content": "rule ab"},
        {"op": "delete", "target": "rule beta"},
    )
    analyst = no_edits_analyst(merge)
    skill = "# Skill\nrule alpha\nrule beta\n"
    result = run(tmp_path, "merge", analyst, skill, slow_every=1)
    slow = result.slow
    assert slow is not None and slow.merged and slow.decision == "reject" and not slow.shipped
    assert slow.dropped == [] and slow.val_after < slow.val_before
    assert result.best_skill == skill  # the current skill ships
    merge_prompt = next(p for p in analyst_prompts(analyst) if MERGE in p)
    assert "rule alpha" in merge_prompt.split(MERGE, 1)[1]
    assert not any(text in merge_prompt for text in held_out_inputs())
    rows = [e for e in EditLedger(tmp_path / "ledger.jsonl").events() if e.kind == "slow"]
    assert rows and rows[-1].reason.startswith("reject")


def test_the_slow_update_is_due_every_nth_run_of_the_ledger(tmp_path):
    analyst = no_edits_analyst()
    skill = "# Skill\nrule alpha\nBe polite.\n"
    first = run(tmp_path, "one", analyst, skill, slow_every=2)
    second = run(tmp_path, "two", analyst, skill, slow_every=2)
    assert first.slow is not None and not first.slow.due and "run 1" in first.slow.reason
    assert first.best_skill == skill
    assert second.slow is not None and second.slow.due and second.slow.dropped == ["Be polite."]


def test_rule_units_keep_headings_continuations_and_protected_regions():
    rules = "# H\n- a\n  more a\n\n- b\n<!-- protected -->\n- c\n<!-- /protected -->\n- d\n"
    lines = rules.splitlines()
    units = ["\n".join(lines[a:b]) for a, b in rule_units(rules)]
    assert units == ["- a\n  more a", "- b", "- d"]


def test_slow_every_two_nights_fires_on_the_second_night_and_rollbacks_are_recorded(tmp_path):
    training = SkillOptConfig(epochs=1, batch_size=16, gate=GateConfig(), slow_every=2)
    fill_log(tmp_path, ALPHA_NIGHT)
    (one,) = run_night(config(tmp_path, training=training), models=models())
    assert one.status == "staged" and one.slow is not None and not one.slow.due
    staging.adopt("demo", home=tmp_path)
    staging.rollback("demo", home=tmp_path)
    fill_log(tmp_path, ALPHA_NIGHT, start=100)
    (two,) = run_night(config(tmp_path, training=training), models=models())
    assert two.slow is not None and two.slow.due
    assert any("slow update (2 nights)" in n for n in two.notes)
    ledger = EditLedger(edit_ledger_path("demo", tmp_path))
    assert len(ledger.runs("skill")) == 2
    alpha = next(e for e in ledger.summary("skill") if e.content == "rule alpha")
    assert alpha.rolled_back == 1 and alpha.accepted == 2  # night one's, undone by the rollback
    report = json.loads((two.night_dir / "report.json").read_text())
    assert report["phases"]["skill"]["slow"]["due"] is True
