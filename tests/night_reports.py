"""The round trip every night report.json must survive: `NightResult.from_report` then
`report_dict()` gives the file back, key for key and in order, and so does the result's
`to_dict()` read back by `RunResult.from_dict` (used by tests/conftest.py and
tests/test_night_result.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from selftaught.results import RunResult
from selftaught.sleep.adoption import staging
from selftaught.sleep.result import NightResult


def round_trip(report: dict[str, Any], night_dir: Path | None = None) -> None:
    night = NightResult.from_report(str(report.get("project", "demo")), night_dir, report)
    again = night.report_dict()
    assert again == report and list(again) == list(report)
    back = RunResult.from_dict(json.loads(json.dumps(night.to_dict())))
    assert isinstance(back, NightResult) and back.report_dict() == report


def check_round_trip(root: Path) -> int:
    """Round-trip every night report.json under `root`; how many there were."""
    n = 0
    for path in root.rglob("report.json"):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a test's broken file: not a report
        if isinstance(report, dict) and report.get("kind") == staging.NIGHT_KIND:
            round_trip(report, path.parent)
            n += 1
    return n
