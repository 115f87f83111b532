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
from selftaught.report import render_report
from selftaught.results import RunResult
from selftaught.stops import Deadline, StopReason, Stops
from tests.scripted import canned_analyst
from tests.test_skill_trainer import EXPECTED, decisions, make
from tests.test_sleep_night_cli import crontab, env  # noqa: F401 (fixtures)


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
    html = render_report(tmp_path)  # the report says so
    assert "stopped early by max-minutes (1.5 min) after step 1" in html
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


# ---- sleep run -------------------------------------------------------------------------------


def night_setup(tmp_path: Path, clock_at=None, **kw):
    from selftaught.sleep.night.cycle import run_night
    from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models

    fill_log(tmp_path, ALPHA_NIGHT, **kw)
    return run_night, config, models


def test_max_minutes_ends_a_night_after_its_phase_and_stages_only_what_was_gated(
    tmp_path, monkeypatch
):
    from selftaught.gate import GateConfig
    from selftaught.skill.config import SkillOptConfig
    from tests.scripted import ScriptedModel, append, edits_json

    t = [0.0]
    monkeypatch.setattr(stops_mod, "now", lambda: t[0])
    inner = canned_analyst(failure=edits_json(append("rule alpha")))

    def slow_analyst(messages):  # each analyst call takes ten minutes of the fake clock
        t[0] += 600
        return inner.fn(messages)

    run_night, config, models = night_setup(tmp_path)
    training = SkillOptConfig(epochs=3, batch_size=4, gate=GateConfig())
    analyst = ScriptedModel(slow_analyst)
    (night,) = run_night(
        config(tmp_path, training=training, stops=Stops(max_minutes=5)),
        models=models(analyst=analyst),
    )
    skill, memory = night.phases["skill"], night.phases["memory"]
    # the skill trainer ended after its step; the memory phase never started
    assert skill.steps == 1 < skill.total_steps
    assert skill.stopped_by.reason.kind == "max_minutes"
    assert not memory.ran and memory.stopped_by.at == "before the memory phase"
    # what the gate accepted is staged; the night says which stop fired
    assert night.status == "staged"
    assert (night.night_dir / "proposal" / "skill.md").read_text().strip() == "rule alpha"
    assert night.stopped_by == StopReason("max_minutes", "5 min", "after the text phase")
    report = json.loads((night.night_dir / "report.json").read_text())
    assert report["stopped_by"]["kind"] == "max_minutes"
    assert "Stopped by max-minutes (5 min)" in (night.night_dir / "report.md").read_text()


def test_patience_pauses_the_schedule_after_k_nights_and_status_says_so(tmp_path, capsys):
    from rich.console import Console

    from selftaught.sleep import pause
    from selftaught.sleep.night.summary import status_lines

    run_night, config, models = night_setup(tmp_path)
    nothing = canned_analyst()  # proposes nothing: every night ends no_proposal
    cfg = config(tmp_path, stops=Stops(patience=2), scheduled=True)
    (first,) = run_night(cfg, models=models(analyst=nothing))
    assert first.status == "no_proposal" and first.stopped_by is None
    assert pause.read("demo", tmp_path).without_accept == 1
    assert not any("paused" in line for line in status_lines("demo", tmp_path))
    night_setup(tmp_path, start=100)
    (second,) = run_night(cfg, models=models(analyst=nothing))
    assert second.stopped_by == StopReason.patience(2, "nights", f"after night {second.night}")
    assert pause.read("demo", tmp_path).paused.night == second.night
    text = "\n".join(status_lines("demo", tmp_path))
    assert f"schedule paused since night {second.night}" in text
    assert "2 nights in a row without an accepted proposal" in text
    assert "selftaught sleep resume --project demo" in text
    assert "stopped by patience (2 nights" in text
    # the scheduled night skips the paused project, saying why; its rows wait
    night_setup(tmp_path, start=200)
    console = Console(file=None, force_terminal=False, width=200)
    with console.capture() as seen:
        assert run_night(cfg, models=models(analyst=nothing), console=console) == []
    assert "demo: skipped, the schedule is paused" in seen.get()
    # resumed: the next scheduled night runs and counts from zero
    pause.resume("demo", tmp_path)
    assert "paused" not in "\n".join(status_lines("demo", tmp_path))
    (third,) = run_night(cfg, models=models(analyst=nothing))
    assert third.window.read == 12 and pause.read("demo", tmp_path).without_accept == 1


def test_a_staged_night_resets_the_count_and_lifts_a_pause(tmp_path):
    from selftaught.sleep import pause

    run_night, config, models = night_setup(tmp_path)
    pause.count_night("demo", "n0", "no_proposal", 1, tmp_path)
    assert pause.read("demo", tmp_path).paused is not None
    (night,) = run_night(config(tmp_path, stops=Stops(patience=1)), models=models())
    assert night.status == "staged" and night.stopped_by is None
    assert pause.read("demo", tmp_path) == pause.NightPatience(0, night.night, None)
    # nights that could not learn neither count nor reset
    assert pause.count_night("demo", "n2", "too_few_tasks", 1, tmp_path) is None
    assert pause.read("demo", tmp_path).without_accept == 0


def test_the_cli_pauses_a_schedule_and_resumes_it(env, crontab):  # noqa: F811 (fixtures)
    from tests.fake_upstream import FakeUpstream
    from tests.scripted import prompt_kind, rule_answer
    from tests.test_sleep_night_cli import fill

    home, log, run = env
    nothing = canned_analyst()

    def answer(messages):
        return rule_answer(messages) if prompt_kind(messages) == "other" else nothing.fn(messages)

    code, text = run("sleep", "schedule", "--at", "03:17", "--project", "demo", "--patience", "1")
    assert code == 0, text
    assert "sleep run --project demo --patience 1 --scheduled" in crontab.read_text()
    with FakeUpstream(answer) as server:
        fill(log)
        args = ("sleep", "run", "--model", f"{server.base_url}#fake-model", "--max-tokens", "32")
        code, text = run(*args, "--patience", "1", "--max-minutes", "600")
        assert code == 0, text
        assert "demo: no_proposal" in text
        assert "stopped by patience (1 night without an accepted candidate) after night" in text
        code, text = run("sleep", "status")
        assert "schedule paused since night" in text and "sleep resume --project demo" in text
        fill(log, start=100)
        code, text = run(*args, "--patience", "1", "--scheduled")
        assert code == 0 and "demo: skipped, the schedule is paused since night" in text
        code, text = run("sleep", "resume")
        assert code == 0 and "demo: schedule resumed" in text
        code, text = run("sleep", "status")
        assert "paused" not in text
        code, text = run("sleep", "resume", "--project", "demo")
        assert "no paused schedule to resume" in text
    code, text = run("sleep", "run", "--patience", "0")
    assert code == 2 and "patience must be >= 1" in text
