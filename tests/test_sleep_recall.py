"""Recall: a capped pool of past tasks across nights; a task's split never changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selftaught.sleep.night import recall
from selftaught.sleep.night.cycle import NightModels, run_night
from selftaught.sleep.night.mine import MinedTask
from selftaught.sleep.night.split import SplitConfig, TooFewTasks, assign_splits
from tests.scripted import canned_analyst, rule_target
from tests.test_sleep_cycle import config, fill_log, models


def tasks_of(night_dir: Path) -> dict[str, dict]:
    rows = [json.loads(x) for x in (night_dir / "tasks.jsonl").read_text().splitlines()]
    return {r["id"]: r for r in rows}


def test_a_quiet_night_recalls_past_tasks_with_their_splits(tmp_path):
    fill_log(tmp_path, ["alpha"] * 12)
    (first,) = run_night(config(tmp_path), models=models())
    assert first.status == "staged" and first.recall.pool == 0
    before = tasks_of(first.night_dir)
    assert len(recall.load("demo", tmp_path)) == 12
    fill_log(tmp_path, ["alpha"] * 3, start=100)  # a quiet night: 3 requests, 6 needed
    (second,) = run_night(config(tmp_path), models=models())
    assert second.status in ("staged", "no_proposal"), second.reason
    after = tasks_of(second.night_dir)
    assert sum(1 for r in after.values() if not r["recalled"]) == 3
    for tid, row in before.items():  # every past task came back, on the same side
        assert after[tid]["recalled"] and after[tid]["split"] == row["split"]
    val_before = sum(1 for r in before.values() if r["split"] == "val")
    assert second.recall.recalled["val"] == val_before
    assert second.recall.pool_after == 15
    assert "recall: 12 past tasks" in (second.night_dir / "report.md").read_text()


def test_without_recall_the_quiet_night_has_too_few_tasks(tmp_path):
    fill_log(tmp_path, ["alpha"] * 12)
    run_night(config(tmp_path, recall_max=0), models=models())
    assert not recall.recall_path("demo", tmp_path).exists()
    fill_log(tmp_path, ["alpha"] * 3, start=100)
    (second,) = run_night(config(tmp_path, recall_max=0), models=models())
    assert second.status == "too_few_tasks"


def test_a_request_asked_again_keeps_its_split_and_the_pool_is_capped(tmp_path):
    fill_log(tmp_path, ["alpha"] * 12)
    (first,) = run_night(config(tmp_path, recall_max=8), models=models())
    pool = recall.load("demo", tmp_path)
    assert len(pool) == 8  # capped: the oldest dropped
    stamps = [r.task.created_at for r in pool]
    assert stamps == sorted(stamps, reverse=True)
    fill_log(tmp_path, ["alpha"] * 12)  # the same twelve requests again
    (second,) = run_night(config(tmp_path, recall_max=8), models=models())
    again = second.recall.mined_again
    assert again == 8
    one, two = tasks_of(first.night_dir), tasks_of(second.night_dir)
    assert {t: r["split"] for t, r in two.items()} == {t: r["split"] for t, r in one.items()}


def test_recalled_private_tasks_never_reach_a_remote_model(tmp_path):
    fill_log(tmp_path, ["alpha"] * 12, private=True)
    local = NightModels(rule_target(), "local", models().optimizer, "local")
    (first,) = run_night(config(tmp_path), models=local)  # local models see private rows
    pool = recall.load("demo", tmp_path)
    assert first.status == "staged" and len(pool) == 12 and all(r.private for r in pool)
    fill_log(tmp_path, ["alpha"] * 8, start=100)
    remote = NightModels(rule_target(), "openai:gpt-x", canned_analyst(), "openai:gpt-x")
    (second,) = run_night(config(tmp_path), models=remote)
    assert second.recall.withheld_private == 12
    assert not any(r["recalled"] for r in tasks_of(second.night_dir).values())


def _task(i: int, split: str | None) -> MinedTask:
    return MinedTask(f"t{i}", [{"role": "user", "content": f"q {i} + {i * 7}"}], split=split)


def test_assign_splits_never_moves_a_fixed_split():
    tasks = [_task(i, "train") for i in range(8)] + [_task(9, "val")]
    with pytest.raises(TooFewTasks):  # val needs 4; fixed train tasks may not fill it
        assign_splits(tasks, SplitConfig(min_val=4))
    assert [t.split for t in tasks] == ["train"] * 8 + ["val"]
    free = [_task(i, None) for i in range(20, 26)]
    splits = assign_splits(tasks + free, SplitConfig(min_val=4))
    assert len(splits["val"]) >= 4
    assert [t.split for t in tasks] == ["train"] * 8 + ["val"]


def test_a_malformed_pool_is_named(tmp_path):
    path = recall.recall_path("demo", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"night": "n", "task": {"id": "x"}}\n')
    with pytest.raises(recall.RecallError, match=r"recall.jsonl:1: not a recalled task"):
        recall.load("demo", tmp_path)
