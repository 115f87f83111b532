"""report.md, diagnostics.json and the no-proposal reason render from a typed `NightResult`
exactly as they rendered from the raw report dict (issue 50).

The expected files under fixtures/nights/rendered/ were written by the code before the change
(the dict version), from the saved reports and from nights the night tests stage (each case:
its report.json, the files rendering reads under night/, and what that code wrote), so these
tests guard behaviour, not a snapshot of the new code's output. "@NIGHT@" stands for the night
folder's path.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from selftaught.sleep.night import summary
from selftaught.sleep.records import PhaseRecord
from selftaught.sleep.result import NightResult

NIGHTS = Path(__file__).parent / "fixtures" / "nights"
RENDERED = NIGHTS / "rendered"
SAVED = ("text", "weights", "skills")  # fixtures/nights/<name>(.json | /report.json)
STAGED = sorted(p.name for p in RENDERED.iterdir() if p.is_dir())
PLACE = "@NIGHT@"


@pytest.fixture(autouse=True)
def _utc(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The expected files show times in UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _staged(name: str, tmp_path: Path) -> tuple[Path, NightResult]:
    """A captured night copied to `tmp_path`, read as its NightResult."""
    case = RENDERED / name
    night_dir = tmp_path / "night"
    if (case / "night").is_dir():
        shutil.copytree(case / "night", night_dir)
    night_dir.mkdir(exist_ok=True)
    report = json.loads((case / "report.json").read_text().replace(PLACE, str(night_dir)))
    return night_dir, NightResult.from_report(report["project"], night_dir, report)


@pytest.mark.parametrize("name", SAVED)
def test_a_saved_report_renders_the_markdown_it_rendered_before(name: str, tmp_path: Path) -> None:
    night_dir = tmp_path / "night"
    night_dir.mkdir()
    path = NIGHTS / name / "report.json" if (NIGHTS / name).is_dir() else NIGHTS / f"{name}.json"
    if (path.parent / "proposal").is_dir() and path.parent != NIGHTS:
        shutil.copytree(path.parent / "proposal", night_dir / "proposal")
    report = json.loads(path.read_text())
    night = NightResult.from_report(report["project"], night_dir, report)
    md = summary.render_markdown(night_dir, night).replace(str(night_dir), PLACE)
    assert md == (RENDERED / f"{name}.md").read_text()


@pytest.mark.parametrize("name", STAGED)
def test_a_staged_night_renders_the_markdown_it_rendered_before(name: str, tmp_path: Path) -> None:
    night_dir, night = _staged(name, tmp_path)
    summary.write_markdown(night_dir, night)
    md = (night_dir / "report.md").read_text().replace(str(night_dir), PLACE)
    assert md == (RENDERED / name / "report.md").read_text()


@pytest.mark.parametrize(
    "name", [n for n in STAGED if (RENDERED / n / "diagnostics.json").is_file()]
)
def test_a_staged_night_writes_the_diagnostics_it_wrote_before(name: str, tmp_path: Path) -> None:
    night_dir, night = _staged(name, tmp_path)
    errors = json.loads((RENDERED / name / "evidence_errors.json").read_text())
    summary.write_diagnostics(night_dir, night, SimpleNamespace(errors=errors))  # type: ignore[arg-type]
    written = (night_dir / "diagnostics.json").read_text().replace(str(night_dir), PLACE)
    assert written == (RENDERED / name / "diagnostics.json").read_text()


def _no_edit(name: str) -> bool:
    report = json.loads((RENDERED / name / "report.json").read_text())
    return report["status"] == "no_proposal" and str(report["reason"]).startswith("nothing to")


@pytest.mark.parametrize("name", [n for n in STAGED if _no_edit(n)])
def test_why_nothing_reads_the_typed_phases_as_it_read_the_dicts(name: str, tmp_path: Path) -> None:
    night_dir, night = _staged(name, tmp_path)
    phases: dict[str, PhaseRecord] = dict(night.phases)
    assert summary.why_nothing(night_dir, phases) == night.reason


def test_an_older_report_renders_too(tmp_path: Path) -> None:
    # the dict code raised KeyError on it (no `mining.negative`, no `proposal.paired`)
    old = json.loads((NIGHTS / "old.json").read_text())
    md = summary.render_markdown(tmp_path, NightResult.from_report("demo", tmp_path, old))
    assert f"# Night {old['night']} · project demo" in md
    assert "**Stopped by max-minutes (30 min) after the skill phase**" in md
    assert "with the proposal: 0.500 (2/4, 95% CI 0.15–0.85).\n" in md
    assert "0 from negative feedback" in md


def test_a_report_of_odd_shape_is_refused_by_name_and_left_out_of_the_list(tmp_path: Path) -> None:
    from selftaught.sleep.adoption import staging

    night_dir = staging.nights_dir("demo", tmp_path) / "n1"
    night_dir.mkdir(parents=True)
    report = {"kind": staging.NIGHT_KIND, "project": "demo", "night": "n1", "status": "staged"}
    (night_dir / "report.json").write_text(json.dumps({**report, "phases": {"skill": "oops"}}))
    with pytest.raises(staging.StagingError, match="report.json is malformed"):
        staging.read_night(night_dir)
    assert staging.list_nights("demo", tmp_path) == []
    (night_dir / "report.json").unlink()  # conftest round-trips every report a test leaves
