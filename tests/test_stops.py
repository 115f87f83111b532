"""Stops (`--max-minutes`, `--patience`): a skill run, a ReST run and a night end cleanly at
their first safe point with the best so far, say which stop fired, keep it in their history
and resume; a schedule pauses after K nights without an accepted proposal. Scripted models
and a fake clock: no timed assertions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import selftaught.stops as stops_mod
from selftaught.errors import ConfigError
from selftaught.results import RunResult
from selftaught.stops import Deadline, StopReason, Stops
from tests.scripted import canned_analyst
from tests.test_skill_trainer import EXPECTED, decisions, make


class FakeClock:
    """A clock that moves `step` seconds each time a deadline reads it."""

    def __init__(self, step: float = 60.0):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(stops_mod, "now", fake)
    return fake


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


# ---- the types ------------------------------------------------------------------------------


def test_stop_reason_round_trips_and_reads_older_text():
    stop = StopReason.max_minutes(30, "after step 4")
    assert str(stop) == "max-minutes (30 min) after step 4"
    assert StopReason.read(stop.to_dict()) == stop
    old = StopReason.read("budget (5 of 5 calls used) during step 1")
    assert old == StopReason("budget", "5 of 5 calls used", "during step 1")
    assert str(old) == "budget (5 of 5 calls used) during step 1"
    # a result keeps its stop typed through to_dict / from_dict
    back = RunResult.from_dict(RunResult(stopped_by=stop).to_dict())
    assert back.stopped_by == stop


def test_stops_are_validated():
    with pytest.raises(ConfigError, match="max_minutes must be > 0"):
        Stops(max_minutes=0)
    with pytest.raises(ConfigError, match="patience must be >= 1"):
        Stops(patience=0)


def test_a_deadline_reads_the_clock(clock):
    d = Deadline.start(1.5)  # t = 60
    assert not d.passed()  # t = 120: 60 s of 90 spent
    assert d.passed()  # t = 180
    assert not Deadline.start(None).passed()


# ---- optimize --------------------------------------------------------------------------------


def test_max_minutes_ends_a_skill_run_after_a_step_and_a_rerun_resumes(tmp_path, clock):
    # the clock moves a minute at each read: started, checked before step 1, after step 1
    result = make(tmp_path, stops=Stops(max_minutes=1.5)).train()
    assert result.steps == 1 and result.total_steps == 4
    assert result.stopped_by == StopReason("max_minutes", "1.5 min", "after step 1")
    assert result.test is not None  # the best so far is shipped and tested, as at any end
    assert decisions(tmp_path) == EXPECTED[:1]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped_by"]["kind"] == "max_minutes"
    assert rows(tmp_path)[1]["stopped_by"]["at"] == "after step 1"  # in history
    # the same command with a new time budget continues from step 2, nothing redone
    result = make(tmp_path, stops=Stops(max_minutes=1000)).train()
    assert result.stopped_by is None and result.steps == 4
    assert decisions(tmp_path) == EXPECTED
    assert rows(tmp_path)[1]["stopped_by"]["kind"] == "max_minutes"  # kept


def test_patience_stops_after_exactly_k_steps_without_acceptance_and_survives_resume(tmp_path):
    nothing = canned_analyst()  # proposes no edit: every step is rejected
    result = make(tmp_path, analyst=nothing, stops=Stops(patience=2)).train()
    assert decisions(tmp_path) == ["reject", "reject"]
    assert result.steps == 2
    assert result.stopped_by == StopReason.patience(2, "steps", "after step 2")
    assert str(result.stopped_by) == (
        "patience (2 steps without an accepted candidate) after step 2"
    )
    # the count is in the run's state: a re-run stops at once, a larger patience goes on
    calls = len(nothing.calls)
    result = make(tmp_path, analyst=nothing, stops=Stops(patience=2)).train()
    assert result.steps == 2 and result.stopped_by.at == "before step 3"
    assert len(nothing.calls) == calls
    result = make(tmp_path, analyst=nothing, stops=Stops(patience=3)).train()
    assert decisions(tmp_path) == ["reject"] * 3 and result.stopped_by.kind == "patience"


def test_an_accepted_step_resets_patience(tmp_path):
    # EXPECTED: accept, accept_new_best, reject, accept_new_best: never 2 rejects in a row
    result = make(tmp_path, stops=Stops(patience=2)).train()
    assert result.stopped_by is None and decisions(tmp_path) == EXPECTED
