"""A night staged by an older version (tests/fixtures/nights/before-records/: a real night
folder a scripted night wrote with the commit before the typed records, see the README
there) is read by today's `sleep status`, `history`, `adopt` and `rollback`, through the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from selftaught import cli
from selftaught.sleep.adoption import staging
from selftaught.sleep.result import NightResult

SAVED = Path(__file__).parent / "fixtures" / "nights" / "before-records"
NIGHT = "20261128-143008"


def _home(tmp_path: Path, monkeypatch) -> Path:
    home = tmp_path / "home"
    night_dir = staging.nights_dir("demo", home) / NIGHT
    shutil.copytree(SAVED / NIGHT, night_dir)
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(tmp_path / "log.db"))
    return home


def _sleep(*args: str) -> str:
    done = CliRunner().invoke(cli.app, ["sleep", *args, "--project", "demo"])
    assert done.exit_code == 0, done.output
    return done.output


def _history() -> list[dict]:
    return [json.loads(line) for line in _sleep("history", "--json").splitlines() if line]


def test_status_history_adopt_and_rollback_read_a_night_an_older_version_staged(
    tmp_path, monkeypatch
):
    home = _home(tmp_path, monkeypatch)
    night_dir = staging.nights_dir("demo", home) / NIGHT
    staged = NightResult.from_report("demo", night_dir, staging.read_report(night_dir))
    assert staged.status == "staged" and staged.proposal is not None and staged.tasks()
    status = _sleep("status")
    assert f"last night {NIGHT}: staged" in status
    assert f"waiting to be adopted: night {NIGHT}" in status
    (night_row,) = [r for r in _history() if r["kind"] == "night"]
    assert night_row["night"] == NIGHT and night_row["status"] == "staged"
    assert "adopted night " + NIGHT + " as version 1" in _sleep("adopt")
    proposed = (night_dir / "proposal" / "skill.md").read_text()
    assert staging.read_adopted_files("demo", home).skill == proposed
    assert "adopted version 1" in _sleep("status")
    rows = _history()
    (v1,) = [r for r in rows if r["kind"] == "version" and r["version"] == 1]
    assert v1["night"] == NIGHT and v1["current"] and v1["val_after"]["hard"] == 0.5
    assert [r["status"] for r in rows if r["kind"] == "night"] == ["adopted"]
    adopted = NightResult.from_report("demo", night_dir, staging.read_report(night_dir))
    assert adopted.status == "adopted" and adopted.adopted_version == 1
    assert "version 0 is adopted again (was 1)" in _sleep("rollback", "0")
    assert staging.current_version("demo", home) == 0
    assert staging.read_adopted_files("demo", home).skill != proposed
    (v0,) = [r for r in _history() if r["kind"] == "version" and r["version"] == 0]
    assert v0["current"]


def _key_paths(value: object, at: str = "") -> set[str]:
    """Every key path of a JSON value (list items merged: `a[].b`)."""
    if isinstance(value, dict):
        out = set()
        for key, inner in value.items():
            path = f"{at}.{key}" if at else str(key)
            out |= {path} | _key_paths(inner, path)
        return out
    if isinstance(value, list):
        return set().union(*(_key_paths(v, at + "[]") for v in value)) if value else set()
    return set()


def test_todays_night_writes_every_key_the_older_version_wrote(tmp_path) -> None:
    """The same scripted night the saved folder came from (its README), run by today's code:
    report.json holds every key path the older version wrote (old tooling reads them)."""
    from selftaught.sleep.night.cycle import run_night
    from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models

    home = tmp_path / "home"
    home.mkdir()
    fill_log(home, ALPHA_NIGHT)
    (night,) = run_night(config(home), models=models())
    assert night.status == "staged", night.reason
    old = json.loads((SAVED / NIGHT / "report.json").read_text())
    assert night.night_dir is not None
    new = staging.read_report(night.night_dir)
    missing = sorted(_key_paths(old) - _key_paths(new))
    assert not missing, f"keys the older version wrote and today's night does not: {missing}"
