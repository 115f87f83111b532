"""`selftaught report`: the adapters read what real (scripted-model) runs wrote, the page shows
it with every model-written text escaped, a run in progress is reported as far as it got, and
a directory that is not a run is a one-sentence error with exit code 2."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.report import render_report, write_report
from selftaught.report.html import diff_html
from selftaught.report.readers import (
    ReportError,
    RestRun,
    RLRun,
    SkillRun,
    load_rest_run,
    load_run,
    read_estimate,
)
from selftaught.report.svg import Chart, Point, Series, render_chart
from tests.report_fixtures import DECISIONS, optimize_run, optimize_trainer, rl_run
from tests.scripted import POISON

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


def points(page: str, chart_id: str, series: str) -> list[tuple[float, float]]:
    """(x, y) of the points of one series of one chart, as drawn in the page."""
    figure = page.split(f'id="{chart_id}"', 1)[1].split("</figure>", 1)[0]
    group = figure.split(f'data-series="{series}"', 1)[1].split("</g>", 1)[0]
    return [
        (float(x), float(y))
        for x, y in re.findall(r'<circle class="pt"[^>]*data-x="([^"]+)" data-y="([^"]+)"', group)
    ]


def body_rows(page: str, table_id: str) -> int:
    table = page.split(f'id="{table_id}"', 1)[1]
    return table.split("<tbody>", 1)[1].split("</tbody>", 1)[0].count("<tr")


@pytest.fixture(scope="module")
def optimize_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("optimize")
    optimize_run(root)
    return root


def test_optimize_adapter_reads_what_the_run_wrote(optimize_dir):
    run = load_run(optimize_dir)
    assert isinstance(run, SkillRun) and run.kind == "optimize" and run.status.finished
    rows = history(optimize_dir)
    assert [s.decision for s in run.steps] == DECISIONS
    assert run.baseline.value == rows[0]["val"]["hard"] == 0.0
    for step, row in zip(run.steps, rows[1:], strict=True):
        assert step.val.value == row["val"]["hard"]
        assert [step.val.lo, step.val.hi] == row["val"]["hard_ci"]
        assert step.batch.solved == row["batch"]["solved"]
    # the best skill so far only moves on accept_new_best: 0 → 0 → 6/11 → 6/11 → 8/11
    assert [s.best_val.solved for s in run.steps] == [0, 6, 6, 8]
    # step 4's candidate was built from v0002: v0003 was rejected
    assert [(d.old_version, d.new_version) for d in run.diffs][-2:] == [
        ("v0002", "v0003"),
        ("v0002", "v0004"),
    ]
    summary = json.loads((optimize_dir / "summary.json").read_text())
    assert run.usage == summary["usage"] and run.best_version == "v0004"
    assert (run.test_initial.solved, run.test_best.solved) == (0, 7)
    # edits with what happened to them and why
    by_content = {e.content: e for e in run.edits}
    assert by_content[POISON].outcome == "rejected" and "-6 items" in by_content[POISON].reason
    assert by_content["rule alpha"].outcome == "accepted_new_best"
    assert by_content["rule delta"].outcome == "accepted"
    # failures carry the scorer's feedback; the shipped skill's test failures come first
    test_failures = [f for f in run.failures if f.where == "test · shipped skill"]
    assert len(test_failures) == 10 - 7
    assert all("lacks 'rule beta'" in f.feedback for f in test_failures)
    assert any(f.where == "train batch · step 1" for f in run.failures)
    assert run.notes == []


def test_optimize_page_shows_curves_decisions_diffs_usage_failures_config(optimize_dir):
    page = render_report(optimize_dir)
    rows = history(optimize_dir)
    best = points(page, "learning-curve", "val · best skill so far")
    assert [x for x, _ in best] == [r["step"] for r in rows]
    assert best[-1][1] == pytest.approx(8 / 11)
    cand = points(page, "learning-curve", "val · candidate of the step")
    assert [y for _, y in cand] == pytest.approx([r["val"]["hard"] for r in rows[1:]])
    kinds = re.findall(r'class="mark mark-[a-z_]+" data-x="[^"]+" data-kind="([a-z_]+)"', page)
    assert kinds == DECISIONS
    for section in ("curve", "gate", "edits", "diffs", "usage", "failures", "config"):
        assert f'<section id="{section}">' in page
    assert page.count('<table class="diff">') == 4
    assert '<tr class="add">' in page and "rule gamma" in page
    assert body_rows(page, "gate-table") == len(rows) - 1
    assert "scripted-analyst" in page and "expected 2059" in page
    assert "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )


def test_model_written_text_is_escaped(tmp_path):
    evil = '<script>alert("skill")</script>\n<img src=x onerror=alert(1)>\n'
    optimize_run(tmp_path, initial_skill=f"# Skill\n{evil}")
    page = render_report(tmp_path)
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;alert(&quot;skill&quot;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_a_run_in_progress_is_reported_as_far_as_it_got(tmp_path):
    trainer = optimize_trainer(tmp_path)
    target = trainer.target.inner
    target.fail_after, target.interrupt = 40, RuntimeError("killed")  # in step 2's val
    with pytest.raises(RuntimeError, match="killed"):
        trainer.train()
    run = load_run(tmp_path)
    assert not run.status.finished and "1 of 4 steps done" in run.status.text
    assert [s.step for s in run.steps] == [1]
    assert any("No test results yet" in n for n in run.notes)
    page = render_report(tmp_path)
    assert "not finished" in page and 'id="learning-curve"' in page

    only_config = tmp_path / "only-config"
    only_config.mkdir()
    shutil.copy(tmp_path / "config.json", only_config / "config.json")
    run = load_run(only_config)
    assert run.status.text.startswith("not started") and run.steps == []
    assert any("No step has finished yet" in n for n in run.notes)
    assert "No step has finished yet" in render_report(only_config)


def test_backend_error_is_shown_as_why_the_run_stopped(tmp_path):
    from tests.scripted import fatal

    trainer = optimize_trainer(tmp_path)
    trainer.target.inner.fail_at[20] = fatal()
    with pytest.raises(Exception, match="401"):
        trainer.train()
    run = load_run(tmp_path)
    assert not run.status.finished and "401" in (run.status.error or "")
    assert 'class="status error"' in render_report(tmp_path)


def test_cli_writes_the_page_and_refuses_what_is_not_a_run(tmp_path, optimize_dir, monkeypatch):
    runner = CliRunner()
    out = tmp_path / "page.html"
    result = runner.invoke(app, ["report", str(optimize_dir), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("<!DOCTYPE html>")

    opened = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    copy = tmp_path / "run"
    shutil.copytree(optimize_dir, copy)
    result = runner.invoke(app, ["report", str(copy), "--open"])
    assert result.exit_code == 0 and (copy / "report.html").is_file()
    assert opened == [(copy / "report.html").resolve().as_uri()]

    empty = tmp_path / "empty"
    empty.mkdir()
    for bad in (empty, tmp_path / "missing"):
        result = runner.invoke(app, ["report", str(bad)])
        assert result.exit_code == 2
        message = result.output.strip()
        assert message.startswith("error:") and str(bad) in message and "\n" not in message

    # a torn last line (a kill mid-write) is left out with a note; a malformed one before it
    # is an error naming file and line
    lines = (copy / "history.jsonl").read_text().splitlines()
    (copy / "history.jsonl").write_text("\n".join(lines[:-1] + [lines[-1][:20]]) + "\n")
    run = load_run(copy)
    assert len(run.steps) == len(lines) - 2 and "incomplete" in run.notes[0]
    (copy / "history.jsonl").write_text("\n".join([lines[0], lines[1][:20]] + lines[2:]) + "\n")
    result = runner.invoke(app, ["report", str(copy)])
    assert result.exit_code == 2 and "history.jsonl:2" in result.output


def test_read_estimate_reads_every_accuracy_summary_shape():
    from selftaught.evaluation import EvalResult as EvalSummary

    # the skill trainer's shape before it moved onto the evaluation summary (old runs)
    skill = {"n": 3, "errors": 1, "hard": 2 / 3, "hard_ci95": [0.2077, 0.9385], "solved": 2}
    # the weight trainers' shape before they moved onto the evaluation summary (old runs)
    weights = {"split": "val", "n": 3, "solved": 2, "accuracy": 2 / 3, "ci": [0.2077, 0.9385]}
    weights["mean_soft"] = 0.83
    evaluation = EvalSummary(
        task="t",
        model="m",
        split="val",
        n=3,
        n_errors=1,
        n_scorer_errors=0,
        hard=2 / 3,
        hard_ci=(0.2077, 0.9385),
        soft=0.83,
        soft_ci=(0.5, 1.0),
        prompt_tokens=0,
        completion_tokens=0,
        truncated=0,
        retries=0,
        wall_s=0.0,
        skill_hash="h",
    ).summary()
    for shape in (skill, weights, evaluation):
        e = read_estimate(shape)
        assert e.value == pytest.approx(2 / 3) and e.n == 3 and e.solved == 2
        assert e.lo == pytest.approx(0.2077) and e.hi == pytest.approx(0.9385)
    assert read_estimate(evaluation, "soft").value == pytest.approx(0.83)
    assert read_estimate(None) is None and read_estimate({"n": 3}) is None


def test_rest_report_from_a_real_rest_run(tmp_path, tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("trl")
    from tests.report_fixtures import shared_rest_run

    root = tmp_path / "rest"
    shutil.copytree(shared_rest_run(tmp_path_factory), root)
    result = json.loads((root / "result.json").read_text())
    run = load_run(root)
    assert isinstance(run, RestRun) and run.status.finished and run.method == "rest"
    rows = history(root)
    assert [r.val.value for r in run.rounds] == [row["val"]["hard"] for row in rows]
    assert [r.new_best for r in run.rounds] == [False, True, False]
    assert run.best_round == result["best_round"] == 1 and run.shipped == "round 1"
    assert run.shipped_test.value == pytest.approx(result["shipped_test"]["hard"])
    assert run.rounds[1].sample_solved.n == rows[1]["samples"]
    page = render_report(root)
    assert [y for _, y in points(page, "learning-curve", "val")] == [0.25, 0.75, 0.5]
    assert body_rows(page, "rounds-table") == 3

    # a run written before the weights moved onto the evaluation summary reads the same
    def to_old(d):
        solved = round(d["hard"] * d["n"])
        return {"n": d["n"], "solved": solved, "accuracy": d["hard"], "ci": d["hard_ci"]}

    rows2 = [{**r, "val": to_old(r["val"]), "test": to_old(r["test"])} for r in rows]
    (root / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows2))
    again = load_rest_run(root)
    assert [(r.val, r.test) for r in again.rounds] == [(r.val, r.test) for r in run.rounds]


def test_rl_report_shows_reward_kl_truncation_and_warnings(tmp_path):
    pytest.importorskip("transformers")
    rl_run(tmp_path / "grpo")
    run = load_run(tmp_path / "grpo")
    assert isinstance(run, RLRun) and run.status.finished and run.shipped == "trained"
    assert [s.values["reward"] for s in run.steps] == [0.0, 0.25, 0.5]
    assert [s.all_rewards_equal for s in run.steps] == [True, False, False]
    assert run.trained_val.solved == 5 and run.base_test.solved == 2
    page = render_report(tmp_path / "grpo")
    assert [
        y for _, y in points(page, "learning-curve", "mean reward (band: ± std within groups)")
    ] == [0.0, 0.25, 0.5]
    assert [y for _, y in points(page, "kl", "KL")] == [0.0, 0.004, 0.011]
    assert "no learning signal" in page and "max_completion_length 64" in page
    # each reward function's mean per step (TRL's rewards/<name>/mean), labelled with its weight
    assert [s.values["rewards/format"] for s in run.steps] == [0.0, 0.5, 0.5]
    assert "rewards/correctness/std" not in history(tmp_path / "grpo")[0]
    curve = points(page, "learning-curve", "mean correctness (weight 1)")
    assert [y for _, y in curve] == [0.0, 0.0, 0.25]
    assert [y for _, y in points(page, "learning-curve", "mean format (weight 0.5)")] == [
        0,
        0.5,
        0.5,
    ]
    header = page.split('id="steps-table"', 1)[1].split("</thead>", 1)[0]
    assert "correctness (weight 1)" in header and "format (weight 0.5)" in header

    rl_run(tmp_path / "unfinished", finished=False)
    run = load_run(tmp_path / "unfinished")
    assert not run.status.finished and "3 of 3 steps logged" in run.status.text
    assert run.trained_val is None and "0.182" in render_report(tmp_path / "unfinished")


def test_write_report_refuses_a_directory_as_output(tmp_path, optimize_dir):
    with pytest.raises(ReportError, match="is a directory"):
        write_report(optimize_dir, tmp_path)


def test_chart_breaks_the_line_at_missing_values_and_fits_flat_data():
    nan = float("nan")
    svg = render_chart(
        Chart(
            "t",
            "x",
            "y",
            [Series("s", [Point(0, 1.0), Point(1, nan), Point(2, 1.0), Point(3, 1.0)])],
            y_range=None,
        )
    )
    assert svg.count('class="pt"') == 3 and svg.count("<polyline") == 1  # 0 alone, 2–3 joined
    assert "nan" not in svg


def test_diff_marks_removed_and_added_lines_and_escapes():
    html = diff_html("a\n<b>\nc\n", "a\n<B>\nc\nd\n")
    assert '<tr class="del">' in html and '<tr class="add">' in html
    assert "&lt;b&gt;" in html and "&lt;B&gt;" in html and "<b>" not in html
    assert "no change" in diff_html("same\n", "same\n")


def test_missing_diagnostics_and_skill_files_are_notes(tmp_path, optimize_dir):
    run_dir = tmp_path / "run"
    shutil.copytree(optimize_dir, run_dir)
    (run_dir / "diagnostics" / "step_0003.json").unlink()
    (run_dir / "skills" / "v0001.md").unlink()
    run = load_run(run_dir)
    assert any("step(s) 3" in n for n in run.notes)
    assert any("v0001.md" in n for n in run.notes)
    # step 3's edit is still known from history.jsonl, with the gate's reason
    step3 = [e for e in run.edits if e.step == 3]
    assert [(e.content, e.outcome) for e in step3] == [(POISON, "rejected")]
    assert [d.step for d in run.diffs] == [3, 4]  # steps 1 and 2 need v0001
    assert "v0001.md" in render_report(run_dir)


def test_a_sleep_night_is_reported_as_its_skill_phase_with_the_night_first(tmp_path):
    from selftaught.sleep.night.cycle import run_night
    from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models

    fill_log(tmp_path, ALPHA_NIGHT)
    (night,) = run_night(config(tmp_path), models=models())
    run = load_run(night.night_dir)
    assert isinstance(run, SkillRun) and run.kind == "sleep" and run.status.finished
    assert run.notes[0].startswith(f"Night {night.night} of project demo: staged")
    assert run.notes[1].startswith("Memory phase (memory/): val ")
    assert [s.decision for s in run.steps] == ["accept_new_best"]
    assert run.best_skill is not None and run.best_skill.strip() == "rule alpha"
    page = render_report(night.night_dir)
    assert "selftaught sleep · sleep:demo" in page and "rule alpha" in page
    # a night that never trained (too few tasks, no recall of past ones) is still a night
    fill_log(tmp_path, ["alpha"] * 3, start=500)
    quiet = config(tmp_path, since=night.window.until, recall_max=0)
    (few,) = run_night(quiet, models=models())
    assert few.status == "too_few_tasks"
    thin = load_run(few.night_dir)
    assert thin.kind == "sleep" and "too_few_tasks" in thin.notes[0]
