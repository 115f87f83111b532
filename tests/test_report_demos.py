"""The report of an optimize run that searches demonstrations and keeps a pool: each step's
candidates with their fate, the shipped skill's worked examples and the leaks refused, the
parent the run recorded, rules diffed apart from demos; model-written demos escaped; a run
written before any of this still renders."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from selftaught.demos import split_skill
from selftaught.report import render_report
from selftaught.report.readers import load_run
from tests.report_fixtures import demo_optimize_run
from tests.scripted import ScriptedModel
from tests.test_skill_demos import format_learner

os.environ.setdefault("HF_HUB_OFFLINE", "1")

GATE_FATE = {"accept_new_best": "accepted_new_best", "accept": "accepted", "reject": "rejected"}


def history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


def table_of(page: str, table_id: str) -> str:
    return page.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo-run")
    demo_optimize_run(root)
    return root


def test_every_candidate_is_read_with_its_fate(demo_dir):
    run = load_run(demo_dir)
    rows = history(demo_dir)[1:]
    assert sum(len(r["candidates"]) for r in rows) > len(rows)  # several per step
    for step, row in zip(run.steps, rows, strict=True):
        assert step.parent == row["parent_version"] and step.pool == row["pool"]
        for c, raw in zip(step.candidates, row["candidates"], strict=True):
            assert (c.version, c.kind, c.demos) == (raw["version"], raw["kind"], raw["demos"])
            if raw["chosen"]:
                assert c.fate == GATE_FATE[row["gate"]["decision"]]
                assert c.reason == row["gate"]["reason"]
            elif raw["val"] is not None:
                assert c.fate == "outscored"
            else:
                assert raw["screen"] is not None and c.fate == "screened_out"
    # the analyst's rule edit built a candidate that screening dropped: the edit is reported
    # as screened out, not as the gate's decision on the demo set that won the step
    (rules,) = [c for c in run.steps[0].candidates if c.kind == "rules"]
    assert rules.fate == "screened_out" and run.steps[0].decision == "accept_new_best"
    (edit,) = [e for e in run.edits if e.content == "- Reply as Answer: N."]
    assert edit.outcome == "screened_out" and rules.version in edit.reason


def test_candidates_worked_examples_and_leaks_render(demo_dir):
    page = render_report(demo_dir)
    rows = history(demo_dir)[1:]
    for section in ("candidates", "demos"):
        assert f'<section id="{section}">' in page
    cands = table_of(page, "candidates-table")
    assert cands.count("<tr") - 1 == sum(len(r["candidates"]) for r in rows)
    assert "screened out" in cands and "kept · new best" in cands
    # the shipped skill's demos, each with its train id, source, input and reply
    shipped = split_skill((demo_dir / "best_skill.md").read_text()).demos
    demos = table_of(page, "demos-table")
    assert shipped and demos.count("<tr") - 1 == len(shipped)
    for d in shipped:
        assert d.id in demos and d.source in demos and d.reply in demos and d.input in demos
    # a shipped demo is marked where candidates carried it
    assert cands.count("shipped") >= 1
    leaks = table_of(page, "leaks-table")
    assert "train-copy" in leaks and "val-000" in leaks and ">val<" in leaks


def test_a_candidate_diff_shows_rules_only_and_lists_demos(demo_dir):
    run = load_run(demo_dir)
    by_version = {d.new_version: d for d in run.diffs}
    assert set(by_version) == {c.version for s in run.steps for c in s.candidates}
    chosen = run.steps[0].candidate
    d = by_version[chosen]
    assert "selftaught:demos" not in d.new_text and d.old_text.strip() == d.new_text == "# Skill"
    assert [x.id for x in d.demos_added] == run.steps[0].demo_stats["best"]
    page = render_report(demo_dir)
    diffs = page.split('<section id="diffs">', 1)[1].split("</section>", 1)[0]
    assert "selftaught:demos" not in diffs  # neither in a diff nor in the shipped skill
    assert "+ demo" in diffs and d.demos_added[0].label in diffs


def test_the_recorded_parent_is_used_not_the_previous_current(demo_dir, tmp_path):
    """With a pool the parent is drawn from its front: a step may start from an older member."""
    run_dir = tmp_path / "run"
    shutil.copytree(demo_dir, run_dir)
    rows = history(run_dir)
    assert rows[2]["parent_version"] == rows[1]["current_version"] != "v0000"
    rows[2]["parent_version"] = "v0000"
    (run_dir / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = load_run(run_dir)
    assert run.steps[1].parent == "v0000"
    assert {d.old_version for d in run.diffs if d.step == 2} == {"v0000"}
    assert f"v0000 → {rows[2]['skill_version']}" in render_report(run_dir)


def test_a_malicious_demo_reply_is_escaped(tmp_path):
    evil = '<script>alert("demo")</script><img src=x onerror=alert(1)>'

    def target(messages):
        reply = format_learner(messages)
        return f"{reply} {evil}" if reply.startswith("Answer:") else reply

    demo_optimize_run(tmp_path, ScriptedModel(target, "evil-learner"))
    shipped = split_skill((tmp_path / "best_skill.md").read_text()).demos
    assert shipped and all(evil in d.reply for d in shipped)  # the scorer passed them
    page = render_report(tmp_path)
    assert "<script" not in page and "<img" not in page
    demos = table_of(page, "demos-table")
    assert "&lt;script&gt;alert(&quot;demo&quot;)&lt;/script&gt;" in demos


def test_a_run_written_before_candidates_and_demos_still_renders(demo_dir, tmp_path):
    run_dir = tmp_path / "old"
    shutil.copytree(demo_dir, run_dir)
    rows = history(run_dir)
    for r in rows:
        for key in ("parent_version", "pool", "candidates", "demos"):
            r.pop(key, None)
    (run_dir / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "demo_pool.json").unlink()
    (run_dir / "best_skill.md").write_text("# Skill\n- old rules\n")
    run = load_run(run_dir)
    # the parent is the previous step's current skill, as before pools
    assert [s.parent for s in run.steps] == ["v0000", rows[1]["current_version"]]
    assert all(s.candidates == [] for s in run.steps)
    assert [d.new_version for d in run.diffs] == [r["skill_version"] for r in rows[1:]]
    page = render_report(run_dir)
    assert "recorded no candidates per step" in page
    assert "The shipped skill has no worked examples." in page
    assert 'id="leaks-table"' not in page and "- old rules" in page


def test_an_unreadable_demos_block_is_a_note(demo_dir, tmp_path):
    run_dir = tmp_path / "bad"
    shutil.copytree(demo_dir, run_dir)
    text = (run_dir / "best_skill.md").read_text()
    (run_dir / "best_skill.md").write_text(text.replace('{"id"', "not json {", 1))
    run = load_run(run_dir)
    assert run.shipped_demos == []
    assert any("best_skill.md: the demos block cannot be read" in n for n in run.notes)
    assert "not json" in render_report(run_dir)
