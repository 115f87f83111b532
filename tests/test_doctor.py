"""`selftaught doctor`: cores, busy estimate, threads, the raw decode rate and the README main
command's expected time here (the model measurement scripted; one real run, slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught import doctor
from selftaught.cli import app
from selftaught.models import threads as th
from selftaught.models.raw_rate import RawRate
from selftaught.models.threads import ThreadChoice

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> ThreadChoice:
    choice = ThreadChoice(usable=2, busy=1.0, setting=None, ceiling=2, threads=1)
    monkeypatch.setattr(doctor, "measure", lambda: choice)
    return choice


def test_the_expected_time_scales_the_recorded_one_by_the_raw_rates(machine):
    slow = RawRate(tokens=768, seconds=24.0, batch=8, threads=1)  # 32 tok/s
    report = doctor.DoctorReport(machine, slow, recorded_s=240.0, recorded_raw_tok_s=64.0)
    assert report.expected_s == pytest.approx(480.0)
    lines = doctor.report_lines(report)
    assert lines[:4] == [
        "usable cores: 2 (torch's default: 2)",
        "busy elsewhere: 1.0 cores",
        "threads: 1 (auto; SELFTAUGHT_THREADS=N fixes it)",
        "raw decode rate: 32.0 tok/s (batch 8, 768 tokens in 24.0 s, 1 threads)",
    ]
    assert lines[4] == (
        "the README's main command: 4m00s measured at 64.0 tok/s raw; about 8m00s here"
    )
    assert doctor.DoctorReport.from_dict(report.to_dict()) == report


def test_without_a_recorded_raw_rate_there_is_no_estimate(machine):
    report = doctor.DoctorReport(machine, RawRate(768, 12.0, 8, 2), recorded_raw_tok_s=None)
    assert report.expected_s is None
    assert "the raw rate of the measured run was not recorded" in doctor.report_lines(report)[-2]


def test_a_missing_local_model_is_reported_not_raised(machine):
    from selftaught.errors import MissingDependency

    def missing() -> RawRate:
        raise MissingDependency("the embedded model is not installed")

    report = doctor.diagnose(missing)
    assert report.raw is None and "not installed" in report.raw_note


def test_doctor_command_prints_the_report(machine, monkeypatch):
    monkeypatch.setattr(doctor, "MAIN_RAW_TOK_S", None)
    calls: list[str | None] = []

    def scripted(path: str | None = None, **_: object) -> RawRate:
        calls.append(path)
        return RawRate(tokens=768, seconds=10.0, batch=8, threads=1)

    monkeypatch.setattr(doctor, "measure_raw_rate", scripted)
    runner = CliRunner()
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "threads: 1 (auto" in result.output
    assert "raw decode rate: 76.8 tok/s" in result.output
    result = runner.invoke(app, ["doctor", "--json", "--model", "local:/m"])
    assert json.loads(result.output)["raw_decode"]["tok_per_s"] == 76.8
    assert calls == [None, "/m"]
    result = runner.invoke(app, ["doctor", "--model", "openai:gpt-4o"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["doctor", "--no-measure"])
    assert "not measured (--no-measure)" in result.output and len(calls) == 2


def test_the_setting_shows(monkeypatch):
    monkeypatch.setattr(th, "_override", None)
    monkeypatch.setenv(th.ENV, "3")
    report = doctor.diagnose(None)
    assert report.threads.threads == 3 and report.threads.busy is None
    assert "threads: 3 (fixed by SELFTAUGHT_THREADS=3)" in doctor.report_lines(report)


def test_the_recorded_figure_is_the_results_files():
    """doctor's copy of the README's figure is the one bench_quickstart.py wrote."""
    recorded = json.loads((RESULTS / doctor.MAIN_RESULTS).read_text())
    assert recorded["command"] == doctor.MAIN_COMMAND
    assert recorded["wall_s"] == doctor.MAIN_SECONDS
    assert (recorded.get("raw_decode") or {}).get("tok_per_s") == doctor.MAIN_RAW_TOK_S


@pytest.mark.slow
def test_doctor_measures_the_embedded_model():
    from selftaught.models.embedded import EmbeddedModelMissing, embedded_model_dir

    try:
        embedded_model_dir()
    except EmbeddedModelMissing:
        pytest.skip("embedded model not installed")
    report = doctor.diagnose(doctor.measure_raw_rate)
    assert report.raw is not None and report.raw.tokens == 8 * doctor.RAW_TOKENS
    assert report.raw.tok_per_s > 1
    assert report.raw.threads == report.threads.threads or report.threads.busy is not None


def test_measure_raw_rate_on_a_tiny_model_folder(tmp_path, monkeypatch):
    """The measuring path itself, on a tiny random model (fast): 8 rows forced to the length."""
    pytest.importorskip("transformers")
    from tests.test_local_engine import load_tokenizer, save_tiny

    monkeypatch.setenv(th.ENV, "1")
    folder = save_tiny(load_tokenizer(), tmp_path / "tiny", seed=0)
    rate = doctor.measure_raw_rate(str(folder), tokens=3)
    assert (rate.tokens, rate.batch, rate.threads) == (24, 8, 1)
    assert rate.seconds > 0
