"""A night's results stay the same through refactors of how the night is run (issue 64): four
scripted-model nights (text staged, too few tasks, weights, many skills) against the
report.json, report.md and tasks.jsonl main's code wrote before the night became a pipeline of
phases, with what varies run to run (times, pids, the night id, the home folder) masked.

`SELFTAUGHT_WRITE_GOLDEN=1` writes the fixtures anew (only where a change of results is meant)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from selftaught.sleep.night.cycle import NightConfig, night_training_defaults, run_night
from selftaught.sleep.result import NightResult
from tests.scripted import canned_analyst
from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models
from tests.test_sleep_skills import fill_two_intents, two_rule_models
from tests.test_sleep_weights import MIXED, FakeTrainer, always_right, weight_config

GOLDEN = Path(__file__).parent / "fixtures" / "nights" / "golden"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
VOLATILE = {"pid", "started_at", "ended_at", "since", "until", "consumed_until", "wall_s",
            "seconds", "adopted_at", "created_at"}  # fmt: skip


def _mask(value: Any, subs: dict[str, str], key: str = "") -> Any:
    if key in VOLATILE and isinstance(value, int | float):
        return "<volatile>"
    if key in ("phase_seconds", "seconds") and isinstance(value, dict):
        return {k: "<volatile>" for k in value}
    if isinstance(value, dict):
        return {k: _mask(v, subs, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, subs) for v in value]
    if isinstance(value, str):
        for old, new in subs.items():
            value = value.replace(old, new)
        return UUID.sub("<uuid>", value)
    return value


def _masked_markdown(text: str, subs: dict[str, str]) -> str:
    for old, new in subs.items():
        text = text.replace(old, new)
    text = UUID.sub("<uuid>", text)
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<time>", text)
    text = re.sub(r"(\d+ steps in )\d+(\.\d+)? s\b", r"\1<seconds> s", text)  # training time
    return re.sub(r"(?m)^- mine .*$", "- <time spent>", text)


def _files(night: NightResult, home: Path) -> dict[str, str]:
    assert night.night_dir is not None
    subs = {str(home): "<home>", night.night: "<night>"}
    d = night.night_dir
    report = _mask(json.loads((d / "report.json").read_text()), subs)
    out = {"report.json": json.dumps(report, indent=1) + "\n"}
    out["report.md"] = _masked_markdown((d / "report.md").read_text(), subs)
    if (d / "tasks.jsonl").is_file():
        rows = [json.loads(line) for line in (d / "tasks.jsonl").read_text().splitlines()]
        out["tasks.jsonl"] = "".join(json.dumps(_mask(r, subs)) + "\n" for r in rows)
    # what the night returned is what it wrote
    assert night.report_dict() == json.loads((d / "report.json").read_text())
    return out


def _text(home: Path) -> NightResult:
    fill_log(home, ALPHA_NIGHT)
    (night,) = run_night(config(home), models=models())
    return night


def _too_few(home: Path) -> NightResult:
    fill_log(home, ["alpha"] * 3)
    (night,) = run_night(config(home), models=models())
    return night


def _weights(home: Path) -> NightResult:
    fill_log(home, MIXED)
    m = models(analyst=canned_analyst())
    m.adapter_trainer = FakeTrainer(sft=always_right)
    (night,) = run_night(weight_config(home), models=m)
    return night


def _skills(home: Path) -> NightResult:
    fill_two_intents(home, home / "log.db")
    cfg = NightConfig(home=home, log_path=home / "log.db", training=night_training_defaults(),
                      many_skills=True)  # fmt: skip
    (night,) = run_night(cfg, models=two_rule_models())
    return night


NIGHTS = {"text": _text, "too_few": _too_few, "weights": _weights, "skills": _skills}


@pytest.mark.parametrize("name", sorted(NIGHTS))
def test_a_scripted_night_writes_what_it_wrote_before_the_pipeline(tmp_path, name):
    home = tmp_path / "home"
    home.mkdir()
    night = NIGHTS[name](home)
    files = _files(night, home)
    folder = GOLDEN / name
    if os.environ.get("SELFTAUGHT_WRITE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for file, text in files.items():
            (folder / file).write_text(text)
    want = {p.name: p.read_text() for p in sorted(folder.iterdir())}
    assert files == want
