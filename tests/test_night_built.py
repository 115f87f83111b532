"""The night builds its typed `NightResult` phase by phase (issue 50, item 1): the result a
night returns is the one it built, not its report.json read back, and that file reads back
into an equal result (sections, notes, timings, the stop, val before / after)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from selftaught.sleep.adoption import staging
from selftaught.sleep.night.cycle import run_night
from selftaught.sleep.records import AdapterRecord, WeightsRecord
from selftaught.sleep.result import NightDraft, NightResult
from selftaught.stops import StopReason
from tests.scripted import canned_analyst
from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models
from tests.test_sleep_weights import MIXED, FakeTrainer, always_right, weight_config


def _read_back(night: NightResult) -> NightResult:
    assert night.night_dir is not None
    report = json.loads((night.night_dir / "report.json").read_text())
    assert night.report_dict() == report  # the file is the night, key for key
    return NightResult.from_report(night.project, night.night_dir, report)


def test_a_night_returns_the_night_it_built_and_its_report_reads_back_equal(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    (night,) = run_night(config(tmp_path), models=models())
    assert night.status == "staged" and night.report_keys is None  # built, not read back
    read = _read_back(night)
    assert dataclasses.replace(read, report_keys=None) == night
    assert night.proposal is not None and night.proposal.val_after is not None
    assert night.shipped_score == night.proposal.val_after.score == read.shipped_score
    assert night.seconds > 0 and night.seconds == read.seconds
    assert {"mine", "text", "proofread", "weights"} <= set(night.phase_seconds)
    assert night.splits is not None and night.gate is not None and night.gate.smallest_gain


def test_a_night_returns_a_frozen_result_and_adopting_it_writes_a_new_one(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    (night,) = run_night(config(tmp_path), models=models())
    assert night.status == "staged" and isinstance(night, NightResult)
    with pytest.raises(dataclasses.FrozenInstanceError):
        night.status = "adopted"
    with pytest.raises(dataclasses.FrozenInstanceError):
        night.shipped_score = night.base_score
    staging.adopt(night.project, night.night, home=tmp_path)
    adopted = staging.read_night(night.night_dir)
    assert (adopted.status, adopted.adopted_version) == ("adopted", 1)
    assert night.status == "staged" and night.adopted_version is None  # what the night returned
    assert adopted.shipped_score == night.shipped_score and adopted.notes == night.notes


def test_the_draft_has_every_field_the_night_fills_under_its_name_and_type():
    derived = {"run_dir", "method", "task", "base_score", "shipped_score", "seconds"}
    read_only = {"extra", "report_keys"}  # a night read back from its report.json
    result = {f.name: f.type for f in dataclasses.fields(NightResult)}
    draft = {f.name: f.type for f in dataclasses.fields(NightDraft)}
    assert draft == {k: v for k, v in result.items() if k not in derived | read_only}


def test_a_night_too_small_to_gate_still_reports_what_it_mined(tmp_path):
    fill_log(tmp_path, ["alpha"] * 3)
    (night,) = run_night(config(tmp_path), models=models())
    assert night.status == "too_few_tasks" and night.report_keys is None
    assert night.mining is not None and night.mining.tasks == 3 and night.recall is not None
    assert night.splits is None and night.proposal is None
    assert dataclasses.replace(_read_back(night), report_keys=None) == night


def test_a_weight_night_builds_its_weights_and_adapter_as_records(tmp_path):
    fill_log(tmp_path, MIXED)
    m = models(analyst=canned_analyst())
    m.adapter_trainer = FakeTrainer(sft=always_right)
    (night,) = run_night(weight_config(tmp_path), models=m)
    assert night.status == "staged", night.reason
    assert isinstance(night.weights, WeightsRecord) and night.weights.winner == "sft"
    assert night.proposal is not None and isinstance(night.proposal.adapter, AdapterRecord)
    assert night.training is not None and night.training.weights == "sft"
    assert dataclasses.replace(_read_back(night), report_keys=None) == night


def test_notes_and_phase_seconds_accumulate_on_the_night_being_built():
    night = NightDraft(project="demo", night_dir=None)
    night.note("first")
    night.note("second", "third")
    night.add_seconds("mine", 1.004)
    night.add_seconds("mine", 2.0)
    assert night.notes == ("first", "second", "third")
    assert night.phase_seconds == {"mine": 3.0}
    assert night.result().notes == night.notes and night.result().phase_seconds == {"mine": 3.0}


def test_a_failed_night_keeps_a_stop_that_is_not_its_reason():
    # --max-minutes passed, then a phase failed: the stop is written (a failed night's stop
    # read from its reason is not: the reason already says it)
    stop = StopReason.max_minutes(1, "after mining")
    night = NightResult(project="demo", night_dir=None, night="n1", status="failed",
                        reason="ValueError: boom", stopped_by=stop)  # fmt: skip
    assert night.report_dict()["stopped_by"] == stop.to_dict()
    assert NightResult.from_report("demo", None, night.report_dict()).stopped_by == stop
    failed = NightResult(project="demo", night_dir=None, night="n1", status="failed",
                         reason="ValueError: boom")  # fmt: skip
    assert "stopped_by" not in failed.report_dict()
