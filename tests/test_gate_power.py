"""Power said before a run (issue 65): `optimize`, `train` and a night say, before their first
model call, the smallest gain the gate can accept on their val size and the val size the gain
they look for needs; `--val-size auto` picks that size for `--min-gain`; a night says how many
more tasks of the traffic it needs."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.gate import GateConfig
from selftaught.skill import SkillOptConfig, SkillTrainer
from selftaught.sleep.night.cycle import night_training_defaults, run_night
from tests.fault_server import FaultServer
from tests.scripted import (
    ScriptedModel,
    ToyTask,
    append,
    canned_analyst,
    edits_json,
    rule_answer,
)
from tests.test_sleep_cycle import config, fill_log, models


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=400), buf


def _watching(answer, buf: io.StringIO, seen: list[str]) -> ScriptedModel:
    """A model that records what the console held when it was first called."""

    def fn(messages):
        if not seen:
            seen.append(buf.getvalue())
        return answer(messages)

    return ScriptedModel(fn)


def test_optimize_says_its_power_before_the_first_model_call(tmp_path):
    console, buf = _console()
    seen: list[str] = []
    trainer = SkillTrainer(
        SkillOptConfig(epochs=1, batch_size=8, max_steps=1),
        ToyTask(),  # 11 val items
        _watching(rule_answer, buf, seen),
        optimizer_model=canned_analyst(failure=edits_json(append("rule alpha"))),
        output_dir=tmp_path / "run",
        console=console,
    )
    trainer.train()
    assert (
        seen
        and (
            "power: on 11 val items the gate can accept a gain of 3 net items (0.27 of val) at the "
            "least; a gain of 0.05 is out of reach: it needs at least 60 val items"
        )
        in seen[0]
    )


def _jsonl_task(path: Path, n_val: int) -> Path:
    lines = []
    for i in range(6):
        lines.append({"id": f"t{i}", "input": f"What is {i} + 3?", "reference": str(i + 3),
                      "split": "train"})  # fmt: skip
    for i in range(n_val):
        lines.append({"id": f"v{i}", "input": f"What is {100 + i} + 5?",
                      "reference": str(105 + i), "split": "val"})  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_val_size_auto_picks_the_fewest_items_that_can_see_min_gain(tmp_path):
    task = _jsonl_task(tmp_path / "task.jsonl", 40)
    with FaultServer(lambda messages: "8", models=("toy",)) as server:
        spec = f"{server.base_url}#toy"
        args = ["optimize", "--task", str(task), "--model", spec, "--api-key", "k",
                "--proposals", "0", "--max-steps", "1", "--no-test",
                "--val-size", "auto", "--min-gain", "0.1",
                "--output", str(tmp_path / "run")]  # fmt: skip
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    # the default gate needs 3 clean net wins: 3 / 0.1 = 30 val items, said and used
    assert "--val-size auto: 30 val items, the fewest on which the gate could accept a gain " \
        "of 0.1" in said  # fmt: skip
    assert "power: on 30 val items the gate can accept a gain of 3 net items" in said
    assert "a gain of 0.1 is within reach: it needs at least 30 val items" in said
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["val_initial"]["n"] == 30


def test_val_size_auto_refuses_without_min_gain_or_past_the_budget(tmp_path):
    task = _jsonl_task(tmp_path / "task.jsonl", 40)
    base = ["optimize", "--task", str(task), "--model", "http://127.0.0.1:9/v1#toy",
            "--val-size", "auto", "--output", str(tmp_path / "run")]  # fmt: skip
    result = CliRunner().invoke(app, base)
    assert result.exit_code == 2 and "--val-size auto needs --min-gain" in result.output
    result = CliRunner().invoke(app, [*base, "--min-gain", "0.1", "--budget-calls", "59"])
    assert result.exit_code == 2
    assert "--budget-calls 59 cannot score the starting skill and one candidate" in " ".join(
        result.output.split()
    )
    result = CliRunner().invoke(app, [*base[:-4], "--val-size", "many"])
    assert result.exit_code == 2 and "takes a number of items or auto" in result.output
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_night_says_how_many_more_tasks_it_needs_for_the_gain_it_looks_for(tmp_path):
    fill_log(tmp_path, ["alpha"] * 8 + ["beta"] * 4)
    console, buf = _console()
    seen: list[str] = []
    analyst = canned_analyst(failure=edits_json(append("rule alpha")))
    watched = _watching(analyst.fn, buf, seen)
    (night,) = run_night(config(tmp_path), models=models(analyst=watched), console=console)
    n_val = night.splits.val
    # the night's margin gate: 2 net wins; a gain of 0.05 needs 40 val tasks, and val takes
    # 30% of the checked tasks
    more = -(-(40 - n_val) * 10 // 3)
    said = f"power: on {n_val} val tasks the gate can accept a gain of 2 net items"
    assert seen and said in seen[0]  # before the analyst's first call
    assert f"about {more} more checked tasks of your traffic" in buf.getvalue()
    report = json.loads((night.night_dir / "report.json").read_text())
    assert report["gate"]["power"] == {
        "target_gain": 0.05, "needed_val": 40, "more_tasks": more, "val_fraction": 0.3
    }  # fmt: skip
    md = (night.night_dir / "report.md").read_text()
    assert (
        f"- to accept a gain of 5%: at least 40 val tasks, {40 - n_val} more than tonight's "
        f"{n_val}: about {more} more checked tasks of your traffic (val takes 30% of them)"
    ) in md


def test_a_night_whose_val_can_see_its_min_gain_says_so(tmp_path):
    fill_log(tmp_path, ["alpha"] * 8 + ["beta"] * 4)
    training = dataclasses.replace(night_training_defaults(), gate=GateConfig(min_gain=0.9))
    (night,) = run_night(config(tmp_path, training=training), models=models())
    md = (night.night_dir / "report.md").read_text()
    assert "- a gain of 90% is within reach of this val (it needs at least 3 val tasks)" in md
    assert night.gate.power.more_tasks == 0
