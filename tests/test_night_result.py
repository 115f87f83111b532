"""The typed night result (issue 50): report.json's sections as frozen records, read from
reports written today and before, written back key for key; `sleep adopt`, `rollback`,
`status` and `history` still read an older night's report."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from selftaught.gate import GateResult
from selftaught.results import Score
from selftaught.sleep.adoption import staging
from selftaught.sleep.night import summary
from selftaught.sleep.night.records import ProposalRecord, Summary, WeightsRecord
from selftaught.sleep.night.result import NightResult
from selftaught.stops import StopReason
from tests.night_reports import round_trip

FIXTURES = Path(__file__).parent / "fixtures" / "nights"
SAVED = ("text/report.json", "weights.json", "skills.json", "old.json")


def _read(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name", SAVED)
def test_a_saved_report_reads_and_writes_back_key_for_key(name: str) -> None:
    round_trip(_read(name))


def test_the_weight_phase_is_typed_down_to_each_candidate_score_and_gate() -> None:
    night = NightResult.from_report("demo", None, _read("weights.json"))
    assert isinstance(night.weights, WeightsRecord)
    sft = night.weights.candidates["sft"]
    assert isinstance(sft, Summary) and isinstance(sft.score, Score)
    assert sft.score.hard == sft.hard and sft.score.split == "val"
    gate = night.weights.gates["sft"].result
    assert isinstance(gate, GateResult) and gate.decision == night.weights.gates["sft"].decision
    assert night.weights.trained["sft"].steps > 0
    assert night.proposal is not None and night.proposal.adapter is not None
    assert night.proposal.adapter.method == "sft" and night.proposal.candidate == "sft"
    with pytest.raises(dataclasses.FrozenInstanceError):
        night.weights.winner = "current"  # type: ignore[misc]


def test_provenance_and_phases_are_typed() -> None:
    night = NightResult.from_report("demo", None, _read("text/report.json"))
    assert isinstance(night.proposal, ProposalRecord)
    line = night.proposal.lines[0]
    assert line.tasks and line.sources and line.clients  # what the trust model reads
    assert night.proofread is not None and night.proofread.kept[0].text == line.text
    skill = night.phases["skill"]
    assert skill.ran and skill.val_initial is not None and skill.val_initial.n > 0
    assert night.base_score == skill.val_initial.score
    assert night.shipped_score == night.proposal.val_after.score  # type: ignore[union-attr]
    assert night.window is not None and night.window.clients["unknown"].read > 0
    assert night.mining is not None and night.mining.tasks == sum(night.mining.by_check.values())
    assert night.models is not None and night.models.target
    skills = NightResult.from_report("demo", None, _read("skills.json"))
    assert skills.skills and skills.skills[0].own_val is not None and skills.skill_set


def test_an_older_report_reads_through_the_one_decoder() -> None:
    old = _read("old.json")
    night = NightResult.from_report("demo", None, old)
    assert night.proposal is not None and night.proposal.val_before is not None
    before = night.proposal.val_before.score  # {n, errors, hard, hard_ci95, ...}
    assert before.hard_ci == tuple(old["proposal"]["val_before"]["hard_ci95"])
    assert night.stopped_by == StopReason.read(old["stopped_by"])
    assert night.phase_seconds == {} and night.recall is None
    assert night.report_dict()["stopped_by"] == old["stopped_by"]  # its words, kept


def test_a_night_built_in_code_writes_its_set_fields() -> None:
    night = NightResult(project="demo", night_dir=None, night="n1", status="no_proposal")
    assert night.report_dict() == {
        "kind": staging.NIGHT_KIND,
        "project": "demo",
        "night": "n1",
        "status": "no_proposal",
        "reason": None,
        "notes": [],
        "consumed_until": None,
        "phases": {},
    }


def _home_with_old_night(tmp_path: Path) -> tuple[Path, str]:
    home = tmp_path / "home"
    old = _read("old.json")
    night_dir = staging.nights_dir("demo", home) / old["night"]
    night_dir.mkdir(parents=True)
    (night_dir / "report.json").write_text(json.dumps(old))
    shutil.copytree(FIXTURES / "text" / "proposal", night_dir / "proposal")
    return home, old["night"]


def test_adopt_rollback_status_and_history_read_an_older_report(tmp_path: Path) -> None:
    home, night = _home_with_old_night(tmp_path)
    status = "\n".join(summary.status_lines("demo", home))
    assert night in status
    adoption = staging.adopt("demo", night, home=home)
    assert adoption.version == 1
    assert staging.read_adopted_files("demo", home).skill.strip()
    rows = summary.history_rows("demo", home)
    versions = [r["version"] for r in rows if r["kind"] == "version"]
    (read,) = [r for r in rows if r["kind"] == "night"]
    assert max(versions) == 1 and read["status"] == "adopted"
    assert read["val_after"]["hard_ci95"]  # the older summary, shown as it was written
    back = staging.rollback("demo", 0, home=home)
    assert back.version == 0 and staging.current_version("demo", home) == 0
    adopted = NightResult.from_report("demo", None, staging.read_report(home / "projects" /
                                      "demo" / "nights" / night))  # fmt: skip
    assert adopted.status == "adopted" and adopted.adopted_version == 1
