"""The nightly cycle through the CLI against an OpenAI-compatible loopback server answering as
a scripted target and analyst: run → status → adopt → history → rollback, dry-run, the
model inferred from proxy rows, exit codes (1 backend failed, 2 bad input, 3 another night),
and the crontab schedule through a stand-in `crontab` command. On both log backends (SQLite,
Postgres: `log_at` in tests/conftest.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.cli import app
from selftaught.sleep.adoption import staging
from selftaught.sleep.intake.log import Feedback, Interaction, TaskLog
from selftaught.sleep.lock import night_lock
from selftaught.sleep.paths import read_adopted
from tests.fake_upstream import FakeUpstream
from tests.scripted import append, canned_analyst, edits_json, prompt_kind, rule_answer

ANALYST = canned_analyst(failure=edits_json(append("rule alpha")))


def answer(messages: list[dict]) -> str:
    """The analyst's reply to an analyst prompt, the rule target's to a replayed task."""
    return rule_answer(messages) if prompt_kind(messages) == "other" else ANALYST.fn(messages)


@pytest.fixture
def env(tmp_path, monkeypatch, log_at):
    home, log = tmp_path / "home", log_at
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(log))
    monkeypatch.setattr(cli.out, "width", 250)
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, " ".join(result.output.split())

    return home, log, invoke


def fill(log_path: Path, n: int = 12, upstream: str | None = None, start: int = 0) -> None:
    log = TaskLog(log_path)
    for i in range(start, start + n):
        rule = "alpha" if i % 3 else "beta"
        a, b = i + 1, 7 * i + 3
        log.add(
            Interaction(
                messages=[{"role": "user", "content": f"[needs {rule}] What is {a} + {b}?"}],
                reply="Answer: 0",
                project="demo",
                source="proxy",
                meta={"upstream": upstream} if upstream else {},
                feedback=Feedback(thumb="down", reference=str(a + b)),
            )
        )
    log.close()


def test_run_status_adopt_history_rollback(env, crontab):
    home, log, run = env
    with FakeUpstream(answer) as server:
        spec = f"{server.base_url}#fake-model"
        fill(log, upstream=spec)  # the model is the upstream the proxy logged
        code, text = run("sleep", "run", "--max-tokens", "32")
        assert code == 0, text
        assert "demo: staged" in text and "report.md" in text
    night = staging.list_nights("demo", home)[-1][0].name
    code, text = run("sleep", "status")
    assert code == 0 and f"waiting to be adopted: night {night}" in text
    assert "adopted version 0" in text and "no night is scheduled" in text
    code, text = run("sleep", "adopt", "--project", "demo")
    assert code == 0 and f"adopted night {night} as version 1 (was 0" in text
    assert read_adopted("demo", home).skill.strip() == "rule alpha"
    code, text = run("sleep", "history", "--project", "demo")
    assert code == 0 and "current" in text and night in text and "adopted" in text
    code, text = run("sleep", "rollback", "--project", "demo")
    assert code == 0 and "version 0 is adopted again (was 1)" in text
    assert read_adopted("demo", home).empty
    code, text = run("sleep", "adopt", "--project", "demo")
    assert code == 2 and "no staged proposal" in text
    code, text = run("sleep", "rollback", "7", "--project", "demo")
    assert code == 2 and "no adopted version 7" in text


def test_dry_run_prints_the_report_and_leaves_no_trace(env):
    home, log, run = env
    fill(log)
    with FakeUpstream(answer) as server:
        code, text = run("sleep", "dry-run", "--model", f"{server.base_url}#fake-model")
    assert code == 0, text
    assert "Status: staged" in text and "+rule alpha" in text
    assert not staging.nights_dir("demo", home).exists()
    code, text = run("sleep", "dry-run", "--help")
    assert code == 0 and "One project" in text and "--dry-run" not in text


def test_plan_says_what_a_night_costs_and_calls_nothing(env):
    home, log, run = env
    fill(log)
    with FakeUpstream(answer) as server:
        spec = f"{server.base_url}#fake-model"
        code, text = run("sleep", "plan", "--project", "demo", "--model", spec)
        assert code == 0, text
        assert "12 interactions read" in text and "12 mined tonight" in text
        assert "skill: baseline" in text and "demo modes" in text and "leave-one-out" in text
        assert "power: on" in text and "to gate one candidate: at least" in text
        assert f"no known price for {spec}" in text
        code, raw = run("sleep", "run", "--plan", "--json", "--project", "demo", "--model", spec)
        assert code == 0, raw
        assert not server.calls  # no model was called, no night made
    plan = json.loads(raw)
    assert plan["project"] == "demo" and plan["tasks"]["mined"] == 12
    assert plan["totals"]["calls"] == sum(p["calls"] for p in plan["phases"]) > 0
    assert plan["smallest_gain"]["n_val"] == plan["tasks"]["val"]
    assert not staging.nights_dir("demo", home).exists()
    code, text = run("sleep", "plan", "--help")
    assert code == 0 and "calls no model" in text.lower() and "--plan " not in text
    code, text = run("sleep", "run", "--json", "--model", spec)
    assert code == 2 and "--json goes with --plan" in text


def test_a_budget_that_cannot_gate_one_candidate_exits_2_before_any_call(env):
    home, log, run = env
    fill(log)
    with FakeUpstream(answer) as server:
        spec = f"{server.base_url}#fake-model"
        code, text = run("sleep", "run", "--model", spec, "--budget-calls", "5")
        assert not server.calls
    assert code == 2, text
    assert "--budget-calls 5 (at least" in text and "val replays of the starting skill" in text
    assert not staging.nights_dir("demo", home).exists()


def test_a_failed_backend_exits_1_and_says_so(env):
    _, log, run = env
    fill(log)
    with FakeUpstream(answer) as server:
        server.faults.extend(["401"] * 50)
        code, text = run("sleep", "run", "--model", f"{server.base_url}#fake-model")
    assert code == 1 and "demo: backend_failed" in text and "401" in text
    assert "nothing to propose" not in text


def test_bad_input_exits_2_and_a_second_night_exits_3_naming_the_first(env):
    home, log, run = env
    fill(log)
    code, text = run("sleep", "run", "--gate", "maybe", "--model", "local")
    assert code == 2 and "--gate must be on or off" in text
    code, text = run("sleep", "run", "--retrieval", "maybe", "--model", "local")
    assert code == 2 and "retrieval must be one of auto, on, off" in text
    code, text = run("sleep", "run", "--recall-max", "-1", "--model", "local")
    assert code == 2 and "recall_max must be >= 0" in text
    code, text = run("sleep", "run")  # proxy rows without an upstream, and no --model
    assert code == 2 and "no --model given" in text
    with night_lock(home, "20260101-031700"):
        code, text = run("sleep", "run", "--model", "http://127.0.0.1:9/v1#m")
    assert code == 3 and "another night is running: night 20260101-031700" in text
    code, text = run("sleep", "status")
    assert code == 0 and "running now" not in text


@pytest.fixture
def crontab(tmp_path, monkeypatch):
    """A stand-in `crontab` on PATH that keeps the table in a file."""
    bin_dir, table = tmp_path / "bin", tmp_path / "crontab.txt"
    bin_dir.mkdir()
    script = bin_dir / "crontab"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-l" ]; then [ -f {table} ] && cat {table} && exit 0; '
        'echo "no crontab for tester" >&2; exit 1; fi\n'
        f'if [ "$1" = "-" ]; then cat > {table}; exit 0; fi\nexit 2\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return table


def test_schedule_status_unschedule_through_crontab(env, crontab):
    _, _, run = env
    crontab.write_text("0 1 * * * backup.sh\n")
    code, text = run(
        "sleep",
        "schedule",
        "--at",
        "03:17",
        "--project",
        "demo",
        "--model",
        "local",
        "--auto-adopt",
    )
    assert code == 0, text
    lines = crontab.read_text().splitlines()
    assert lines[0] == "0 1 * * * backup.sh"  # the user's own lines stay
    assert lines[1].startswith("17 3 * * * umask 077 && cd ") and lines[1].endswith("project=demo")
    assert "sleep run --project demo --model local --auto-adopt" in lines[1]
    assert "OPENAI_API_KEY" not in lines[1]
    code, text = run("sleep", "status")
    assert code == 0 and "next scheduled night:" in text and "every day at 03:17" in text
    code, text = run("sleep", "schedule", "--at", "04:00", "--project", "demo")
    assert code == 0 and len(crontab.read_text().splitlines()) == 2  # replaced, not added
    code, text = run("sleep", "schedule", "--at", "03:00", "--bogus-option")
    assert code == 2 and "bogus" in text and len(crontab.read_text().splitlines()) == 2
    code, text = run("sleep", "schedule", "--at", "25:00")
    assert code == 2 and "HH:MM" in text
    code, text = run("sleep", "unschedule", "--project", "demo")
    assert code == 0 and "removed 1" in text
    assert crontab.read_text().splitlines() == ["0 1 * * * backup.sh"]


def test_schedule_without_crontab_says_what_to_do(env, tmp_path, monkeypatch):
    _, _, run = env
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    code, text = run("sleep", "schedule", "--at", "03:00")
    assert code == 6 and "no `crontab` command" in text  # a missing program and "sleep run" in text
    code, text = run("sleep", "status")
    assert code == 0 and "schedule: unknown (no `crontab` command" in text


def test_the_report_command_renders_a_night(env):
    home, log, run = env
    fill(log)
    with FakeUpstream(answer) as server:
        assert run("sleep", "run", "--model", f"{server.base_url}#fake-model")[0] == 0
    night_dir = staging.list_nights("demo", home)[-1][0]
    code, text = run("report", str(night_dir))
    assert code == 0, text
    html = (night_dir / "report.html").read_text()
    assert "selftaught sleep" in html and "staged" in html and "rule alpha" in html
    assert json.loads((night_dir / "report.json").read_text())["kind"] == "sleep-night"


def test_a_scheduled_night_reads_a_log_password_from_a_private_file(tmp_path, monkeypatch, crontab):
    from selftaught.sleep import cron

    home = tmp_path / "home"
    url = "postgresql://app:Ab/Se%cret9@db.internal:5432/selftaught"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    monkeypatch.setenv("SELFTAUGHT_LOG", url)
    entry = cron.schedule("03:00", "demo", [], home)
    line = crontab.read_text()
    assert "Se%cret9" not in line and "Ab/" not in line and "Ab/" not in entry.command
    stash = home / "hook-log-url"
    assert stash.read_text().strip() == url and stat.S_IMODE(stash.stat().st_mode) == 0o600
    assert f'SELFTAUGHT_LOG="$(cat {stash.resolve()})"' in line


def test_a_scheduled_night_carries_the_agent_login_opt_in(tmp_path, monkeypatch, crontab):
    from selftaught.sleep import cron

    home = tmp_path / "home"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex home"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-never-in-the-crontab-1234")
    monkeypatch.delenv("SELFTAUGHT_AGENT_LOGIN", raising=False)
    assert "CODEX_HOME" not in cron.schedule("03:00", "demo", [], home).command
    monkeypatch.setenv("SELFTAUGHT_AGENT_LOGIN", "1")
    cron.schedule("03:00", "demo", [], home)
    line = crontab.read_text()
    assert "SELFTAUGHT_AGENT_LOGIN=1" in line
    assert f"CODEX_HOME='{tmp_path / 'codex home'}'" in line
    assert "sk-never" not in line


def test_sleep_run_runs_each_projects_night_as_build_trainer_train(env, monkeypatch):
    # issue 64: `sleep run` takes the one path a night has, run_night's loop of
    # build_trainer(NightConfig(project=...), log, models).train()
    import selftaught.sleep.night.cycle as cycle
    from selftaught.sleep.night.cycle import NightTrainer

    home, log, run = env
    fill(log)
    built: list[NightTrainer] = []
    real = cycle.build_night_trainer  # what build_trainer builds a NightConfig with

    def recording(*args, **kw):
        trainer = real(*args, **kw)
        built.append(trainer)
        return trainer

    monkeypatch.setattr(cycle, "build_night_trainer", recording)
    with FakeUpstream(answer) as server:
        code, text = run("sleep", "run", "--model", f"{server.base_url}#fake-model")
    assert code == 0, text
    (trainer,) = built
    assert isinstance(trainer, NightTrainer) and trainer.config.project == "demo"
    assert [p.name for p in trainer.phases][:3] == ["window", "mine", "split"]
    report = json.loads((trainer.run.root / "report.json").read_text())
    assert report["status"] == "staged" and report["night"] == trainer.night
