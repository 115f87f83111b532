"""Sleep's state cannot be read or redirected by others (issue #30): everything under the home
is private (0600 files, 0700 folders) even where the home already existed; `sleep schedule`
refuses values that would add crontab lines; project names are checked at every entry point;
an imported file's trust fields are not taken as given, and no row picks the night's model;
live files are touched only when their block is well formed, symlinks only when asked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.cli import app
from selftaught.sleep.adoption import staging
from selftaught.sleep.night.cycle import run_night
from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models


@pytest.fixture
def loose_umask():
    """The umask most machines have (022): without care, new files are 0644."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _loose(home: Path) -> list[str]:
    """Paths under `home` (and `home` itself) that anyone but the owner may read or enter."""
    found = [str(home)] if stat.S_IMODE(home.stat().st_mode) & 0o077 else []
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            path = Path(root, name)
            if not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) & 0o077:
                found.append(f"{path.relative_to(home)} {oct(stat.S_IMODE(path.stat().st_mode))}")
    return found


def test_everything_a_night_and_an_adopt_write_under_an_existing_home_is_private(
    tmp_path, loose_umask
):
    home = tmp_path / "home"
    (home / "projects" / "demo").mkdir(parents=True, mode=0o755)  # made by an older version
    fill_log(home, ALPHA_NIGHT)
    (night,) = run_night(config(home), models=models())
    assert night.status == "staged"
    staging.adopt("demo", home=home)
    staging.rollback("demo", home=home)
    evidence = night.night_dir / "evidence.jsonl"
    assert stat.S_IMODE(evidence.stat().st_mode) == 0o600  # every prompt and reply of a night
    events = home / "projects" / "demo" / "events.jsonl"
    assert stat.S_IMODE(events.stat().st_mode) == 0o600
    assert _loose(home) == []


# ---- the crontab (#30.7) ---------------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    home, log = tmp_path / "home", tmp_path / "log.db"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(log))
    monkeypatch.setattr(cli.out, "width", 250)
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, " ".join(result.output.split())

    return home, log, invoke


@pytest.fixture
def crontab(tmp_path, monkeypatch):
    """A stand-in `crontab` on PATH that keeps the table in a file."""
    from tests.test_sleep_night_cli import crontab as make

    return make.__wrapped__(tmp_path, monkeypatch)


@pytest.mark.parametrize(
    "extra",
    [
        ["--project", "demo\n* * * * * touch /tmp/pwned"],
        ["--preferences", "Be brief.\n* * * * * touch /tmp/pwned #"],
        ["--preferences", "Be brief.\r* * * * * touch /tmp/pwned"],
        ["--preferences", "Answer 100% in English"],  # cron turns % into a newline
    ],
)
def test_schedule_refuses_values_that_would_add_crontab_lines(cli_env, crontab, extra):
    _, _, run = cli_env
    crontab.write_text("0 1 * * * backup.sh\n")
    code, text = run("sleep", "schedule", "--at", "03:17", *extra)
    assert code == 2, text
    assert "break the crontab line" in text or "invalid project name" in text
    assert crontab.read_text() == "0 1 * * * backup.sh\n"  # untouched


def test_a_scheduled_night_logs_privately(cli_env, crontab):
    _, _, run = cli_env
    code, text = run("sleep", "schedule", "--at", "03:17", "--project", "demo")
    assert code == 0, text
    (line,) = crontab.read_text().splitlines()
    assert "umask 077" in line  # cron.log holds the night's output: 0600, not 0644


@pytest.mark.parametrize(
    "command",
    [
        ["sleep", "schedule", "--at", "03:17", "--project"],
        ["sleep", "unschedule", "--project"],
        ["sleep", "log", "--project"],
        ["sleep", "harvest", "--project"],
        ["sleep", "import", "rows.jsonl", "--project"],
        ["sleep", "run", "--model", "local", "--project"],
        ["sleep", "adopt", "--project"],
        ["sleep", "rollback", "--project"],
        ["sleep", "history", "--project"],
        ["sleep", "status", "--project"],
        ["sleep", "probation", "--project"],
    ],
)
def test_every_sleep_command_checks_the_project_name(cli_env, crontab, command):
    _, _, run = cli_env
    crontab.write_text("")
    code, text = run(*command, "../../etc")
    assert code == 2 and "invalid project name" in text, text
    assert crontab.read_text() == ""
