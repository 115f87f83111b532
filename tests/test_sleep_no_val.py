"""The daily-use night (`sleep run --no-val`): the user opted out of a held-out val set, so
every task trains, the gate is off, the report says so at its top, and a version adopted
from such a night is on probation with auto-rollback by default."""

from __future__ import annotations

import json

import pytest

from selftaught.errors import ConfigError
from selftaught.sleep.adoption import staging
from selftaught.sleep.night.cycle import NightConfig, run_night
from selftaught.sleep.night.split import SplitConfig
from selftaught.sleep.night.summary import NO_VAL_BANNER
from tests.scripted import POISON, append, canned_analyst, edits_json
from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models


def test_a_no_val_night_trains_on_every_task_with_the_gate_off(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    # a poison edit: a gated night would reject it; with no val nothing can
    poison = canned_analyst(failure=edits_json(append(POISON)))
    (night,) = run_night(config(tmp_path, val_split=False), models=models(analyst=poison))
    assert night.status == "staged" and "gate off" in night.reason
    report = json.loads((night.night_dir / "report.json").read_text())
    assert report["splits"] == {"train": 12, "val": 0, "test": 0}
    assert report["gate"]["mode"] == "off" and report["gate"]["no_val"] is True
    assert POISON in (night.night_dir / "proposal" / "skill.md").read_text()
    md = (night.night_dir / "report.md").read_text()
    assert md.split("\n")[2] == NO_VAL_BANNER  # the first thing under the title
    tasks = [json.loads(line) for line in (night.night_dir / "tasks.jsonl").open()]
    assert {t["split"] for t in tasks} == {"train"}


def test_a_gated_night_still_holds_val_out_and_says_nothing_of_it(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    (night,) = run_night(config(tmp_path), models=models())
    report = json.loads((night.night_dir / "report.json").read_text())
    assert report["splits"]["val"] > 0 and report["gate"]["no_val"] is False
    assert NO_VAL_BANNER not in (night.night_dir / "report.md").read_text()


def test_a_recalled_val_task_stays_out_of_a_no_val_night(tmp_path):
    fill_log(tmp_path, ALPHA_NIGHT)
    (gated,) = run_night(config(tmp_path), models=models())
    held = {t["id"] for t in map(json.loads, (gated.night_dir / "tasks.jsonl").open())
            if t["split"] == "val"}  # fmt: skip
    assert held
    fill_log(tmp_path, ["beta"] * 4, start=100)
    (night,) = run_night(config(tmp_path, val_split=False), models=models())
    trained = {t["id"] for t in map(json.loads, (night.night_dir / "tasks.jsonl").open())}
    assert trained and not trained & held  # never trained on: it validates a later night


def test_no_val_refuses_what_needs_val():
    with pytest.raises(ConfigError, match="--no-val trains the project's skill and memory only"):
        NightConfig(val_split=False, weights="sft")
    with pytest.raises(ConfigError, match="min_val 0 holds nothing out"):
        SplitConfig(min_val=0)


def test_a_version_adopted_from_a_no_val_night_is_rolled_back_on_a_drop(tmp_path):
    from selftaught.sleep.intake.probation import auto_rollback_on, maybe_roll_back

    fill_log(tmp_path, ALPHA_NIGHT)
    run_night(config(tmp_path), models=models())
    staging.adopt("demo", home=tmp_path)
    fill_log(tmp_path, ALPHA_NIGHT, start=200)
    run_night(config(tmp_path, val_split=False), models=models())
    done = staging.adopt("demo", home=tmp_path)
    assert staging.version_meta("demo", done.version, tmp_path)["probation"] == "auto_rollback"
    assert auto_rollback_on("demo", done.version, tmp_path)
    assert not auto_rollback_on("demo", done.version - 1, tmp_path)
    drop = drop_of(done.version, done.version - 1)
    rolled = maybe_roll_back("demo", drop, home=tmp_path, by="cli", asked=False)
    assert rolled is not None and staging.current_version("demo", tmp_path) == done.version - 1
    # a gated night's version is rolled back only when asked (--auto-rollback)
    gated = drop_of(done.version - 1, 0)
    assert maybe_roll_back("demo", gated, home=tmp_path, by="cli", asked=False) is None


def drop_of(new: int, old: int):
    """A probation result whose verdict is a drop of `new` against `old`."""
    from selftaught.sleep.intake.probation import Comparison, Probation, Tally

    tallies = [
        Tally(str(new), outcomes=30, successes=5),
        Tally(str(old), outcomes=30, successes=28),
    ]
    comp = Comparison("adopted", *tallies, -0.77, (-0.9, -0.6), "drop", 20, 0.99)
    return Probation(project="demo", current=str(new), tallies=tallies, adopted=comp)
