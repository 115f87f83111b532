"""The trust model's provenance, read from a `NightResult` (issue 50, item 1): each task's
sources, origins, clients and `no_demo` (tasks.jsonl as `TaskRecord`s) and the night's
evidence log; and the report sections that were raw dicts, typed down to their leaves."""

from __future__ import annotations

import json
from pathlib import Path

from selftaught.gate import Paired
from selftaught.skill.result import ParseStats
from selftaught.sleep.night.cycle import run_night
from selftaught.sleep.records import (
    AgentRunsRecord,
    ConversationRecord,
    DreamRecord,
    MinerRecord,
    TaskRecord,
    WeakRecord,
)
from selftaught.sleep.result import NightResult
from tests.test_sleep_cycle import config, fill_log, models

FIXTURES = Path(__file__).parent / "fixtures" / "nights"
END_USER = "key:end-user"


def test_a_task_from_an_end_users_correction_is_no_demo_in_the_nights_tasks(tmp_path):
    fill_log(tmp_path, ["alpha"] * 8)  # corrected by the operator; the rest by an end user
    fill_log(tmp_path, ["alpha"] * 4, start=8, feedback_by=END_USER, client=END_USER)
    cfg = config(tmp_path, max_client_share=1.0)  # all four end-user rows are read
    (night,) = run_night(cfg, models=models())
    assert night.status == "staged", night.reason
    tasks = night.tasks()
    assert len(tasks) == 12 and all(isinstance(t, TaskRecord) for t in tasks)
    by_user = [t for t in tasks if END_USER in t.clients]
    by_operator = [t for t in tasks if END_USER not in t.clients]
    assert len(by_user) == 4 and len(by_operator) == 8
    assert all(t.no_demo == "checked by an end user's correction" for t in by_user)
    assert all(t.no_demo is None for t in by_operator)
    assert {t.trust for t in by_user} == {"end_user"} and {t.trust for t in by_operator} == {
        "operator"
    }
    assert all(t.sources and t.origins == ("proxy",) for t in tasks)
    rows = [json.loads(x) for x in (night.night_dir / "tasks.jsonl").read_text().splitlines()]
    assert [TaskRecord.from_dict(r).to_dict() for r in rows] == rows  # key for key
    evidence = night.evidence_path
    assert evidence is not None and evidence.parent == night.night_dir
    roles = {json.loads(line)["role"] for line in evidence.read_text().splitlines()}
    assert {"target", "optimizer"} <= roles


def test_a_night_without_tasks_or_evidence_on_disk_has_none(tmp_path):
    night = NightResult(project="demo", night_dir=tmp_path, night="n1", status="no_tasks")
    assert night.tasks() == () and night.evidence_path is None
    assert NightResult(project="demo", night_dir=None).tasks() == ()


def test_the_sections_that_were_dicts_are_records_down_to_their_leaves() -> None:
    report = json.loads((FIXTURES / "weights.json").read_text())
    night = NightResult.from_report("demo", None, report)
    mining = night.mining
    assert mining is not None and isinstance(mining.conversation, ConversationRecord)
    assert mining.conversation.threads == report["mining"]["conversation"]["threads"]
    assert isinstance(mining.miner, MinerRecord) and not mining.miner.ran  # `{}`: none ran
    assert isinstance(mining.agent, AgentRunsRecord) and mining.agent.notes == ()
    analyst = night.phases["skill"].analyst
    assert analyst is not None and isinstance(analyst.stats, ParseStats)
    assert analyst.stats.rate() == analyst.parse_rate == 1.0
    proposal = night.proposal
    assert proposal is not None and proposal.paired is not None
    assert proposal.paired.paired == Paired(6, 0, 0, 0.015625)
    adapter = proposal.adapter
    assert adapter is not None and adapter.files == ("adapter_config.json",
                                                     "adapter_model.safetensors")  # fmt: skip
    assert adapter.data is not None and adapter.data.replays is not None
    assert adapter.data.replays.samples == 36 and adapter.data.corrections == 18
    assert adapter.training is not None and adapter.training.steps == 3
    assert night.weights is not None and night.weights.data == adapter.data
    assert night.budget is not None and night.budget.roles is None


def test_weak_dream_slow_and_vs_adopted_read_typed_and_write_back_key_for_key() -> None:
    report = json.loads((FIXTURES / "text" / "report.json").read_text())
    used = {"demos": ["d-1"], "lines": 1, "adapter_tasks": 0}
    report["weak"] = {
        "k": 3, "agree": 0.8, "verified": {"right": 1, "wrong": 0}, "notes": ["n"],
        "tasks": [{"id": "t-1", "answer": "105", "agreement": 1.0, "answers": {"105": 3},
                   "outcome": "labelled"}],
        "shipped": used, "accuracy": 1.0, "a key from a newer version": 1,
    }  # fmt: skip
    report["dream"] = {
        "n": 1, "made": {"renumbered": 1}, "shipped": {},
        "tasks": [{"id": "d-1", "from": "t-1", "how": "renumbered", "reference": "12",
                   "prompt_head": "What is 5 + 7?", "split": "train", "no_demo": False,
                   "notes": []}],
    }  # fmt: skip
    skill = report["phases"]["skill"]
    skill["slow"] = {
        "due": True, "reason": "every 2 nights", "runs": 2, "every": 2,
        "trials": [{"rule": "r", "verdict": "dropped", "why": "earned nothing"}],
        "merged": [["replace", "a", "b"]], "decision": "accept", "val_before": 0.5,
        "val_after": 0.75, "chars_before": 10, "chars_after": 8, "version": "v0002",
        "shipped": True,
    }  # fmt: skip
    skill["demo_modes"] = {
        **(skill.get("demo_modes") or {}),
        "vs_adopted": {"mode": "static", "decision": "reject", "reason": "no gain"},
    }
    night = NightResult.from_report("demo", None, report)
    assert night.report_dict() == report and list(night.report_dict()) == list(report)
    assert isinstance(night.weak, WeakRecord) and night.weak.tasks[0].answers == {"105": 3}
    assert night.weak.shipped is not None and night.weak.shipped.demos == ("d-1",)
    assert night.weak.extra == {"a key from a newer version": 1}
    assert isinstance(night.dream, DreamRecord) and night.dream.tasks[0].from_task == "t-1"
    assert night.slow is not None and night.slow.dropped == ["r"] and night.slow.shipped
    assert night.slow.merged == (("replace", "a", "b"),)
    modes = night.phases["skill"].demo_modes
    assert modes is not None and modes.vs_adopted is not None
    assert modes.vs_adopted.mode == "static" and modes.vs_adopted.result.decision == "reject"
