"""The benchmark protocol (benchmarks/protocol.py, bench_peers.py --report): design tools
refuse test and the report seeds; a report run takes its settings from the committed file
only, refuses uncommitted settings, keeps every row; its tables pair systems on the same test
items with two-sided tests. Plus the benchmark's task specs (bench_tasks.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_peers  # noqa: E402
import bench_tasks  # noqa: E402
import protocol  # noqa: E402

from tests.scripted import ScriptedModel  # noqa: E402

FROZEN = protocol.load_report_settings()


def test_design_tools_refuse_the_test_split_and_the_report_seeds():
    protocol.check_design_use("tool", seeds=FROZEN["dev_seeds"], splits=["train", "val"])
    with pytest.raises(SystemExit, match="never on test"):
        protocol.check_design_use("tool", splits=["val", "test"])
    with pytest.raises(SystemExit, match=f"seed\\(s\\) {FROZEN['report_seeds'][0]} are report"):
        protocol.check_design_use("tool", seeds=[0, FROZEN["report_seeds"][0]])


@pytest.mark.parametrize(
    "argv",
    [
        ["benchmarks/bench_demos.py", "--split", "test"],
        ["benchmarks/bench_demo_kinds.py", "--seeds", str(FROZEN["report_seeds"][1])],
    ],
)
def test_the_demo_design_tools_refuse_before_loading_any_model(argv):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode != 0
    assert "scores design choices" in out.stderr and "Traceback" not in out.stderr


def test_dev_runs_score_val_only_and_refuse_report_seeds():
    s = bench_peers.parse_args(["--seeds", "0", "1"])
    assert s.mode == "peers" and s.splits == ("val",)
    with pytest.raises(SystemExit, match="are report seeds"):
        bench_peers.parse_args(["--seeds", str(FROZEN["report_seeds"][0])])
    with pytest.raises(SystemExit, match="gym:NAME"):
        bench_peers.parse_args(["--tasks", "humaneval"])


def test_a_report_run_takes_every_setting_from_the_file():
    s = bench_peers.parse_args(["--report", "--round", "1"])
    assert (s.mode, s.splits) == ("report", ("val", "test"))
    assert s.seeds == FROZEN["report_seeds"] and s.tasks == FROZEN["tasks"]
    assert s.systems == FROZEN["systems"] and s.test == FROZEN["settings"]["test"]
    sub = bench_peers.parse_args(
        ["--report", "--round", "1", "--systems", "gepa", "--seeds", "101"]
    )
    assert (sub.systems, sub.seeds) == (["gepa"], [101])
    with pytest.raises(SystemExit, match="--budget would change them"):
        bench_peers.parse_args(["--report", "--round", "1", "--budget", "400"])
    with pytest.raises(SystemExit, match=r"seeds \[7\] are not in report_settings"):
        bench_peers.parse_args(["--report", "--round", "1", "--seeds", "7"])


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def test_a_report_refuses_settings_with_uncommitted_changes(tmp_path, monkeypatch):
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@t")
    _git(tmp_path, "config", "user.name", "t")
    settings = tmp_path / "report_settings.json"
    monkeypatch.setattr(protocol, "REPO", tmp_path)
    settings.write_text("{}")
    with pytest.raises(SystemExit, match="uncommitted changes"):
        protocol.settings_commit(settings)
    _git(tmp_path, "add", "report_settings.json")
    _git(tmp_path, "commit", "-qm", "freeze")
    assert protocol.settings_commit(settings) == _git(tmp_path, "rev-parse", "HEAD")
    settings.write_text('{"report_seeds": [7]}')
    with pytest.raises(SystemExit, match="commit the report settings"):
        protocol.settings_commit(settings)
    assert protocol.code_state()["dirty"] is True
    _git(tmp_path, "commit", "-qam", "settings")
    (tmp_path / protocol.RESULTS_DIR).mkdir(parents=True)
    (tmp_path / protocol.RESULTS_DIR / "report_t.json").write_text("{}")  # a report's output
    assert protocol.code_state()["dirty"] is False
    (tmp_path / "bench.py").write_text("")  # code
    assert protocol.code_state()["dirty"] is True


def _report_row(system: str, seed: int, date: str, shipped: dict, seed_items: dict) -> dict:
    from common import accuracy, compare_paired

    return {
        "system": system,
        "variant": system,
        "seed": seed,
        "version": "1",
        "run_id": f"{system}/s{seed}/{date}",
        "meta": {"date": date},
        "code": {"commit": "abcdef1234", "dirty": False},
        "test": {
            "seed": accuracy(seed_items),
            "shipped": accuracy(shipped),
            "paired": compare_paired(seed_items, shipped),
            "items": shipped,
            "seed_items": seed_items,
        },
        "usage": {"target": {"sent": 200, "calls": 200}},
        "wall_s": 10,
    }


def test_a_rerun_is_a_new_row_and_the_summary_counts_the_first_run(tmp_path):
    base = {f"i{k}": 0.0 for k in range(10)}
    st = {f"i{k}": float(k < 8) for k in range(10)}  # selftaught: 8 wins on the seed
    peer = {f"i{k}": float(k < 2) for k in range(10)}  # the peer: 2
    better_rerun = {f"i{k}": 1.0 for k in range(10)}
    path = tmp_path / "report_t.json"
    first = [_report_row("selftaught", 100, "2026-01-01", st, base),
             _report_row("gepa", 100, "2026-01-01", peer, base)]  # fmt: skip
    path.write_text(json.dumps({"runs": first}))
    rerun = [_report_row("gepa", 100, "2026-02-01", better_rerun, base)]
    runs = bench_peers.appended_runs(path, rerun)
    assert [r["run_id"] for r in runs] == [r["run_id"] for r in first + rerun]  # kept, added
    saved = {"task": "gym:t", "settings_commit": "0123456789ab", "runs": runs,
             "settings": {"train": 30, "val": 30, "test": 10, "budget": 200,
                          "serve_model": "local:q"}}  # fmt: skip
    md = bench_peers.report_task_table(saved)
    assert md.count("| gepa 1 | 100 |") == 2  # both runs shown
    assert "two-sided exact sign tests" in md and "10 test items cannot show" not in md
    # summary: gepa's FIRST run (2 wins) against the seed, and against selftaught (8 vs 2)
    assert "| gepa | 10 | +0.200 | 2/0 | 0.500 | -0.600 (0/6, p 0.031) |" in md
    assert "| selftaught | 10 | +0.800 | 8/0 | 0.008 | – |" in md
    # the re-run shown as its own row, not counted: against the seed and selftaught's first run
    again = "| gepa, re-run (not counted) | 10 | +1.000 | 10/0 | 0.002 | +0.200 (2/0, p 0.500) |"
    assert again in md
    assert md.count("re-run (not counted)") == 1  # selftaught has none
    third = _report_row("gepa", 100, "2026-03-01", base, base)  # a later re-run: shown only
    assert bench_peers.first_reruns([*runs, third])[("gepa", 100)] is runs[-1]
    # the targets, from the first runs: gepa's better re-run does not put it ahead
    assert "mean test gain +0.800, ≥ every peer's" in md and "beyond it: 0." in md
    # open until every frozen system ran every report seed, whatever the last sitting ran
    saved["settings"] |= {"systems": ["gepa"], "seeds": [100]}
    planned = f"of {len(FROZEN['systems'])} systems × {len(FROZEN['report_seeds'])} seeds planned"
    assert f"{planned}: **open**)" in bench_peers.report_task_table(saved)
    assert bench_peers.targets(runs, ["selftaught", "gepa"], [100])["verdict"] == "met"
    ahead = _report_row("skillrl", 100, "2026-01-01", better_rerun, base)
    assert "below skillrl's" in bench_peers.targets_line([*runs, ahead])
    assert bench_peers.targets([*runs, ahead])["verdict"] == "missed"
    slow = _report_row("selftaught", 100, "2026-01-01", peer, base)  # a gain, not beyond chance
    assert bench_peers.targets([slow, first[1]])["verdict"] == "missed"
    # selftaught alone: nothing to compare with, said so (not "≥ every peer's")
    alone = bench_peers.targets_line(first[:1])
    assert "+0.800 (no peer has run yet)" in alone and "every peer" not in alone


def test_the_report_status_lists_every_planned_task_with_its_verdict(tmp_path):
    base = {f"i{k}": 0.0 for k in range(10)}
    st = {f"i{k}": float(k < 8) for k in range(10)}
    spec = FROZEN["tasks"][0]
    rows = [_report_row("selftaught", 100, "2026-01-01", st, base)]
    (tmp_path / f"report_{bench_peers.task_slug(spec)}.json").write_text(json.dumps({"runs": rows}))
    status = bench_peers.report_status_table(tmp_path).splitlines()[2:]
    assert len(status) == len(FROZEN["tasks"])  # every planned task, in the file's order
    planned = len(FROZEN["systems"]) * len(FROZEN["report_seeds"])
    slug = bench_peers.task_slug(spec)
    assert status[0] == f"| {slug} | 1 / {planned} | +0.800 (1 seed) | – | 1 / 0 of 1 | open |"
    assert all(line.endswith("| not run yet |") for line in status[1:] if "judge:" not in line)
    assert any(line.endswith("no judge passed the judge check |") for line in status)


def test_the_report_table_states_the_smallest_detectable_difference():
    assert "**0.060** (6 items won" in bench_peers.detectable_line(100, "test")
    assert "cannot show any difference" in bench_peers.detectable_line(5, "test")


# ---- task specs ------------------------------------------------------------------------


def _fake_wheel(tmp_path: Path, n: int) -> Path:
    rows = [{"input": [{"role": "system", "content": "Write a title:"},
                       {"role": "user", "content": f"Abstract number {i}."}],
             "ideal": f"Title {i}"} for i in range(n)]  # fmt: skip
    wheel = tmp_path / bench_tasks.EVALS_WHEEL_NAME
    with zipfile.ZipFile(wheel, "w") as zf:
        body = "\n".join(json.dumps(r) for r in rows)
        zf.writestr(bench_tasks.JUDGE_SETS["abstract2title"].path, body)
    return wheel


def test_a_judge_task_is_a_seeded_jsonl_task_scored_by_the_judge(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_tasks, "TASK_FILES", tmp_path / "tasks")
    wheel = _fake_wheel(tmp_path, 20)
    judged = []

    def judge(messages):
        judged.append(messages[-1]["content"])
        return '{"score": 9, "reason": "names the subject"}'

    sizes = {"train_size": 5, "val_size": 4, "test_size": 6}
    judge_model = ScriptedModel(judge)
    task = bench_tasks.build_task(
        "judge:abstract2title", seed=3, judge_model=judge_model, wheel=wheel, **sizes
    )
    sizes = [len(task.examples(s)) for s in ("train", "val", "test")]
    assert sizes == [5, 4, 6]
    ex = task.examples("test")[0]
    assert ex.input.startswith("Write a title:\n\nAbstract number ")
    assert ex.reference == f"Title {ex.id.split('-')[-1]}"
    score = task.score("A title", ex)
    assert score.hard == 1.0 and "judge score 9" in score.feedback
    assert "Score 10 for a title" in judged[0] and ex.reference in judged[0]  # rubric, reference
    again = bench_tasks.judge_rows("abstract2title", 3, (5, 4, 6), wheel)
    other = bench_tasks.judge_rows("abstract2title", 4, (5, 4, 6), wheel)
    assert [r["id"] for r in again if r["split"] == "test"] == [e.id for e in task.examples("test")]
    assert again != other  # the seed draws the split
    with pytest.raises(SystemExit, match="20 rows"):
        bench_tasks.judge_rows("abstract2title", 0, (10, 10, 10), wheel)
    with pytest.raises(SystemExit, match="judge model"):
        bench_tasks.build_task("judge:abstract2title", seed=0, train_size=1, val_size=1,
                               test_size=1, wheel=wheel)  # fmt: skip


def test_gym_specs_pass_through_and_unknown_forms_are_refused():
    task = bench_tasks.build_task("gym:syllogism", seed=0, train_size=3, val_size=2, test_size=4)
    assert [len(task.examples(s)) for s in ("train", "val", "test")] == [3, 2, 4]
    assert not bench_tasks.needs_judge("gym:chain_sum") and bench_tasks.needs_judge(
        "judge:abstract2title"
    )
    with pytest.raises(SystemExit, match="unknown judge set"):
        bench_tasks.task_kind("judge:nope")


def test_the_task_devcheck_scores_the_seed_prompt_on_dev_data_only(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_tasks, "TASK_FILES", tmp_path / "tasks")
    wheel = _fake_wheel(tmp_path, 20)
    seen = []

    def model(messages):  # target and judge: one model, as in the benchmark
        seen.append(messages)
        text = messages[-1]["content"]
        return '{"score": 8, "reason": "ok"}' if "Score 10 for a title" in text else "Title 1"

    out = tmp_path / "check.jsonl"
    kwargs = {"sizes": (5, 4, 6), "out": out, "wheel": wheel}
    result = bench_tasks.devcheck(
        "judge:abstract2title", ScriptedModel(model), seed=0, split="val", **kwargs
    )
    assert (result.n, result.n_errors, result.hard) == (4, 0, 1.0)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["example_id"].startswith("abstract2title-") for r in rows] == [True] * 4
    targets = [m for m in seen if "Score 10 for a title" not in m[-1]["content"]]
    assert len(targets) == 4 and targets[0][0]["content"] == FROZEN["settings"]["seed_prompt"]
    for seed, split in ((100, "val"), (0, "test")):  # a report seed, the test split
        with pytest.raises(SystemExit, match="design choices"):
            bench_tasks.devcheck("judge:abstract2title", "local", seed=seed, split=split, **kwargs)


def _skill(rules: str, *replies: str) -> str:
    from selftaught.demos import Demo, join_skill

    return join_skill(rules, [Demo(f"d{i}", f"q{i}", r) for i, r in enumerate(replies)])


def test_the_label_report_names_labels_lost_from_demos_and_priors_in_rules():
    refs = ["Yes", "No", "no", "No.", "yes", "No"]
    report = bench_tasks.label_report(refs, _skill("Answer Yes or No.", "No", "no.", "So: No"))
    assert report.train == {"no": 4, "yes": 2} and report.demos == {"no": 3}
    assert (report.labels_lost, report.prior_labels, report.n_demos) == (["yes"], [], 3)
    fair = bench_tasks.label_report(refs, _skill("Think, then answer.", "No", "It follows: Yes"))
    assert (fair.labels_lost, fair.demos) == ([], {"no": 1, "yes": 1})
    prior = bench_tasks.label_report(refs, _skill("The conclusion usually does not follow: No."))
    assert (prior.prior_labels, prior.labels_lost, prior.n_demos) == (["no"], [], 0)
    letters = ["A", "B", "C", "(A)", "B", "C"] * 2  # options: "a" the article is no option A
    mc = bench_tasks.label_report(letters, _skill("Pick a letter; a careful reader picks C.",
                                                  "(A)", "The answer is A"))  # fmt: skip
    assert mc.train == {"a": 4, "b": 4, "c": 4} and mc.demos == {"a": 2}
    assert (mc.labels_lost, mc.prior_labels) == (["b", "c"], ["c"])
    assert bench_tasks.label_report(["4", "7", "4", "9"], _skill("x", "4")) is None  # 9 once
    many = [str(n) for n in range(9)] * 2  # nine distinct answers: not a closed set
    assert bench_tasks.label_report(many, "") is None


def test_the_devcheck_of_a_label_task_reports_its_labels(tmp_path):
    skill = _skill("Answer with Yes or No.", "No", "No")
    model = ScriptedModel(lambda m: "No")
    out = tmp_path / "devcheck.jsonl"
    bench_tasks.devcheck("gym:syllogism", model, seed=0, split="val", sizes=(12, 3, 3), out=out,
                         skill=skill)  # fmt: skip
    labels = json.loads((tmp_path / "devcheck.summary.json").read_text())["labels"]
    assert set(labels["train"]) == {"yes", "no"} and labels["demos"] == {"no": 2}
    assert (labels["labels_lost"], labels["prior_labels"]) == (["yes"], [])
    assert model.calls[0][0]["content"].startswith("Answer with Yes or No.")
    skill_file = tmp_path / "result.json"
    skill_file.write_text(json.dumps({"best_skill": skill}))
    assert bench_tasks.read_skill(skill_file) == skill


def _tomi_wheel(tmp_path: Path, stories: int) -> Path:
    rows = []
    for k in range(stories):  # two questions per story, with different places
        story = f"Ann entered room_{k}. The ball is in box_{k}. Ann moved the ball to bag_{k}."
        rows += [{"input": [{"role": "user", "content": f"{story} Where was the ball at first?"}],
                  "ideal": f"box_{k}"},
                 {"input": [{"role": "user", "content": f"{story} Where is the ball really?"}],
                  "ideal": f"bag_{k}"}]  # fmt: skip
    wheel = tmp_path / bench_tasks.EVALS_WHEEL_NAME
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(bench_tasks.JUDGE_SETS["tomi"].path, "\n".join(json.dumps(r) for r in rows))
    return wheel


def test_a_grouped_judge_set_keeps_one_question_per_story(tmp_path):
    wheel = _tomi_wheel(tmp_path, 12)
    rows = bench_tasks.judge_rows("tomi", 0, (4, 3, 5), wheel)
    stories = [bench_tasks._story(r["input"]) for r in rows]
    assert len(rows) == 12 and len(set(stories)) == 12  # no story in two splits
    assert bench_tasks.judge_rows("tomi", 0, (4, 3, 5), wheel) == rows
    with pytest.raises(SystemExit, match="12 groups"):
        bench_tasks.judge_rows("tomi", 0, (5, 5, 5), wheel)


def _check_rows(out):
    """A judge check file's judgements, after its header of settings."""
    header, *rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert set(header) == {bench_tasks.CHECK_HEADER}
    return rows


def _grading_judge(fair: bool):
    def judge(messages):  # judges/compare.md: the item's reference, then its reply, come last
        text = messages[-1]["content"]
        reference = text.rsplit("Reference answer: ", 1)[1].split("\n")[0]
        reply = text.rsplit("Reply: ", 1)[1].split("\n")[0]
        score = 10 if (reference in reply or not fair) else 0
        return json.dumps({"score": score, "reason": "compared"})

    return judge


def test_the_judge_check_tells_a_grading_judge_from_a_yes_sayer(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_tasks, "TASK_FILES", tmp_path / "tasks")
    wheel = _tomi_wheel(tmp_path, 12)
    kwargs = {"seed": 0, "split": "val", "sizes": (4, 3, 5), "wheel": wheel}
    out = tmp_path / "judged.jsonl"
    fair = bench_tasks.judgecheck("judge:tomi", ScriptedModel(_grading_judge(True)), out=out,
                                  **kwargs)  # fmt: skip
    assert (fair["reference"], fair["wrong"], fair["errors"], fair["grades"]) == (
        (3, 3), (0, 3), 0, True
    )  # fmt: skip
    rows = _check_rows(out)
    for row in (r for r in rows if r["case"] == "wrong"):  # the same story's other place
        k = row["example_id"]  # tomi-ROW: rows 2k and 2k+1 are story k
        assert row["reply"].endswith(f"_{int(k.rsplit('-', 1)[1]) // 2}")
    saved = json.loads((tmp_path / "judged.summary.json").read_text())
    assert (saved["spec"], saved["grades"], saved["wrong"]) == ("judge:tomi", True, [0, 3])
    judge = saved["judge"]  # the scripted model's name: what a report's judge is matched on
    assert bench_tasks.passing_judge_check("judge:tomi", judge, tmp_path) is None  # its name
    (tmp_path / "judged.summary.json").rename(tmp_path / "judgecheck_tomi.summary.json")
    assert bench_tasks.passing_judge_check("judge:tomi", judge, tmp_path).name.startswith("judge")
    assert bench_tasks.passing_judge_check("judge:tomi", "another-model", tmp_path) is None
    assert bench_tasks.passing_judge_check("judge:abstract2title", judge, tmp_path) is None
    out = tmp_path / "judgecheck_tomi.jsonl"  # the same check again, by a yes-sayer
    yes = bench_tasks.judgecheck("judge:tomi", ScriptedModel(_grading_judge(False)), out=out,
                                 **kwargs)  # fmt: skip
    assert yes["wrong"] == (3, 3) and not yes["grades"]
    assert bench_tasks.passing_judge_check("judge:tomi", judge, tmp_path) is None
    with pytest.raises(SystemExit, match="not a judge task"):
        bench_tasks.judgecheck("gym:chain_sum", ScriptedModel(_grading_judge(True)), out=out,
                               **kwargs)  # fmt: skip
    with pytest.raises(SystemExit, match="design choices"):
        bench_tasks.judgecheck("judge:tomi", "local", out=out, **(kwargs | {"split": "test"}))


def test_a_report_run_skips_a_judge_task_until_its_judge_passes_the_judge_check(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(bench_peers, "RESULTS", tmp_path)
    s = bench_peers.parse_args(["--report", "--round", "1"])
    judge_tasks = [spec for spec in s.tasks if bench_tasks.needs_judge(spec)]
    assert judge_tasks, "the report plans a judge task"
    spec = judge_tasks[0]
    assert "--judge-check" in bench_peers.unchecked_judge(s, spec)
    assert bench_peers.unchecked_judge(s, FROZEN["tasks"][0]) is None  # no judge, no check
    record = {"spec": spec, "judge": s.serve_model, "grades": False}
    path = tmp_path / "judgecheck_x_val_seed0.summary.json"
    path.write_text(json.dumps(record))
    assert bench_peers.unchecked_judge(s, spec) is not None  # checked, but cannot grade
    path.write_text(json.dumps(record | {"grades": True}))
    assert bench_peers.unchecked_judge(s, spec) is None
    dev = bench_peers.parse_args(["--seeds", "0", "--tasks", spec])
    assert bench_peers.unchecked_judge(dev, spec) is None  # dev runs are design tools


def test_report_results_keep_every_row_with_its_commits(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_peers, "RESULTS", tmp_path)
    s = bench_peers.parse_args(["--report", "--round", "1", "--tasks", FROZEN["tasks"][1]])
    meta = {"settings_commit": "c0ffee", "date": "2026-01-01T00:00:00+00:00"}
    row = bench_peers.stamp(s, meta, {"system": "gepa", "variant": "gepa", "seed": 100})
    assert row["code"]["commit"] and row["meta"]["settings_commit"] == "c0ffee"
    started = {**meta, "code": {"commit": "f00d", "dirty": False}}  # HEAD when it started
    assert (
        bench_peers.stamp(s, started, {"variant": "gepa", "seed": 100})["code"]["commit"] == "f00d"
    )
    (path,) = bench_peers.write_results(s, meta, {FROZEN["tasks"][1]: [row]})
    again = {**row, "run_id": "gepa/s100/later"}  # the same system and seed, run again
    bench_peers.write_results(s, meta, {FROZEN["tasks"][1]: [again]})
    saved = json.loads(path.read_text())
    assert saved["settings_commit"] == "c0ffee" and path.name == "report_chain_sum.json"
    assert [r["run_id"] for r in saved["runs"]] == [row["run_id"], "gepa/s100/later"]


def test_a_report_sitting_skips_finished_runs_and_retries_failed_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_peers, "RESULTS", tmp_path)
    spec = FROZEN["tasks"][1]
    base = {"i0": 0.0}
    failed = {**_report_row("gepa", 101, "2026-01-01", base, base), "error": "crashed"}
    del failed["test"]
    runs = [_report_row("selftaught", 100, "2026-01-01", base, base), failed]
    (tmp_path / "report_chain_sum.json").write_text(json.dumps({"runs": runs}))
    s = bench_peers.parse_args(["--report", "--round", "1", "--tasks", spec])
    assert bench_peers.finished_report_runs(s, spec) == {("selftaught", 100)}  # gepa 101 again
    rerun = bench_peers.parse_args(["--report", "--round", "1", "--rerun", "--tasks", spec])
    assert bench_peers.finished_report_runs(rerun, spec) == set()
    with pytest.raises(SystemExit, match="--rerun is for --report"):
        bench_peers.parse_args(["--rerun"])


def test_a_resumed_sitting_reuses_the_seed_prompts_saved_scores(tmp_path, monkeypatch):
    from dataclasses import asdict

    monkeypatch.setattr(bench_peers, "RESULTS", tmp_path)
    monkeypatch.setattr(bench_peers, "settings_commit", lambda *_: "c0ffee")
    spec = FROZEN["tasks"][1]
    s = bench_peers.parse_args(["--report", "--round", "1", "--tasks", spec])
    val, test = {"v0": 1.0, "v1": 0.0}, {"t0": 0.0, "t1": 1.0}
    row = _report_row("selftaught", 100, "2026-01-01", test, test)
    row["val"] = {"items": val, "seed_items": val}
    row["meta"]["settings_commit"] = "c0ffee"
    failed = {**_report_row("gepa", 101, "2026-01-01", test, test), "error": "crashed"}
    failed["val"], failed["meta"]["settings_commit"] = row["val"], "c0ffee"
    path = tmp_path / "report_chain_sum.json"
    path.write_text(json.dumps({"settings": asdict(s), "runs": [row, failed]}))
    assert bench_peers.saved_baseline(s, spec, 100) == {"val": val, "test": test}
    assert bench_peers.saved_baseline(s, spec, 101) is None  # a failed run's scores are not kept
    rerun = bench_peers.parse_args(["--report", "--round", "1", "--rerun", "--tasks", spec])
    assert bench_peers.saved_baseline(rerun, spec, 100) is None
    monkeypatch.setattr(bench_peers, "settings_commit", lambda *_: "later")  # other settings file
    assert bench_peers.saved_baseline(s, spec, 100) is None
    monkeypatch.setattr(bench_peers, "settings_commit", lambda *_: "c0ffee")
    other = {**asdict(s), "max_tokens": 64}  # the file's settings differ from this sitting's
    path.write_text(json.dumps({"settings": other, "runs": [row]}))
    assert bench_peers.saved_baseline(s, spec, 100) is None


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}\n\n", 1)[1].split("\n\n## ", 1)[0].strip()


def _variant_judge(fair: bool, first: str = "A"):
    """A judge for every variant's prompt: compare.md, the reference-guided and the pairwise
    one; `fair` compares places, else it says yes to any reply (pairwise: always `first`)."""

    def judge(messages):
        text = messages[-1]["content"]
        if "## Reply A" in text:
            ref = _section(text, "Reference answer")
            better = ("A" if _section(text, "Reply A") == ref else "B") if fair else first
            return json.dumps({"reason": "compared", "better": better})
        if "## Reference answer (correct)" in text:
            same = _section(text, "Reference answer (correct)") == _section(text, "Reply to grade")
            return json.dumps({"reason": "compared", "score": 10 if same or not fair else 0})
        return _grading_judge(fair)(messages)

    return judge


def test_the_judge_check_reports_each_variant_with_intervals(tmp_path, monkeypatch):
    from selftaught.stats import wilson_interval

    monkeypatch.setattr(bench_tasks, "TASK_FILES", tmp_path / "tasks")
    wheel = _tomi_wheel(tmp_path, 12)
    kwargs = {"seed": 0, "split": "val", "sizes": (4, 3, 5), "wheel": wheel}
    out = tmp_path / "judgecheck_tomi.jsonl"
    model = ScriptedModel(_variant_judge(True))
    variants = ["absolute", "k3", "reference", "pairwise"]
    fair = bench_tasks.judgecheck("judge:tomi", model, out=out, variants=variants, **kwargs)
    assert len(model.calls) == 6 + 18 + 6 + 6  # k3: three judge calls per judgement
    assert sorted(p.temperature for p in model.params)[-18:] == [0.7] * 18
    assert list(fair["variants"]) == variants
    for v in fair["variants"].values():
        assert (v["reference"], v["wrong"], v["errors"], v["grades"]) == ((3, 3), (0, 3), 0, True)
        assert v["agreement"] == {"k": 6, "n": 6, "rate": 1.0,
                                  "ci95": [round(x, 4) for x in wilson_interval(6, 6)]}  # fmt: skip
        assert v["pairs"]["k"] == v["pairs"]["n"] == 3
    rows = _check_rows(out)
    pairwise = [r for r in rows if r["variant"] == "pairwise"]
    assert {(r["case"], r["reply"] != r["baseline"]) for r in pairwise} == {
        ("reference", True), ("wrong", True)}  # fmt: skip
    saved = json.loads((tmp_path / "judgecheck_tomi.summary.json").read_text())
    assert (saved["grades"], saved["reference"], saved["wrong"]) == (True, [3, 3], [0, 3])
    assert saved["variants"]["pairwise"]["wrong_rate"]["ci95"] == [0.0, round(
        wilson_interval(0, 3)[1], 4)]  # fmt: skip
    judge = saved["judge"]
    for variant in variants:
        assert bench_tasks.passing_judge_check("judge:tomi", judge, tmp_path, variant)
    assert bench_tasks.passing_judge_check("judge:tomi", judge, tmp_path, "pairwise+k3") is None


def test_a_position_biased_pairwise_judge_agrees_half_the_time_and_never_grades(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(bench_tasks, "TASK_FILES", tmp_path / "tasks")
    wheel = _tomi_wheel(tmp_path, 12)
    kwargs = {"seed": 0, "split": "val", "sizes": (4, 3, 5), "wheel": wheel}
    for first in ("A", "B"):  # each pair judged both ways round: the bias passes one of two
        out = tmp_path / f"judgecheck_tomi_{first}.jsonl"  # one file per check (one resumes)
        model = ScriptedModel(_variant_judge(False, first))
        c = bench_tasks.judgecheck("judge:tomi", model, out=out, variants=["pairwise"], **kwargs)
        v = c["variants"]["pairwise"]
        assert v["reference"][0] == v["wrong"][0] and v["agreement"]["k"] == 3
        assert (v["agreement"]["n"], v["pairs"]["k"], v["grades"]) == (6, 0, False)
    assert "grades" not in c  # no absolute variant ran: no top-level verdict for it
    assert bench_tasks.passing_judge_check("judge:tomi", "scripted", tmp_path) is None
    assert bench_tasks.passing_judge_check("judge:tomi", "scripted", tmp_path, "pairwise") is None


def test_a_killed_judge_check_resumes_with_no_row_lost_or_duplicated(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_tasks, "TASK_FILES", tmp_path / "tasks")
    wheel = _tomi_wheel(tmp_path, 12)
    kwargs = {"seed": 0, "split": "val", "sizes": (4, 3, 5), "wheel": wheel,
              "variants": ["absolute", "pairwise"]}  # fmt: skip
    whole = tmp_path / "whole.jsonl"  # the same check, never interrupted
    bench_tasks.judgecheck("judge:tomi", ScriptedModel(_variant_judge(True)), out=whole, **kwargs)
    out = tmp_path / "killed.jsonl"
    killed = ScriptedModel(_variant_judge(True))
    killed.fail_after = 5  # a kill after five judgements (threads in flight die with it)
    with pytest.raises(KeyboardInterrupt):
        bench_tasks.judgecheck("judge:tomi", killed, out=out, **kwargs)
    kept = _check_rows(out)
    assert 0 < len(kept) <= 5  # every judgement made was on disk at once
    with open(out, "a") as f:
        f.write('{"variant": "absolute", "example_id": "tom')  # torn by the kill mid-append
    again = ScriptedModel(_variant_judge(True))
    resumed = bench_tasks.judgecheck("judge:tomi", again, out=out, **kwargs)
    assert len(again.calls) == 12 - len(kept)  # only the missing judgements
    rows, want = _check_rows(out), _check_rows(whole)
    key = bench_tasks._row_key
    assert sorted(map(key, rows)) == sorted(map(key, want)) and len(set(map(key, rows))) == 12
    assert rows[: len(kept)] == kept
    saved = json.loads((tmp_path / "killed.summary.json").read_text())
    assert saved == json.loads((tmp_path / "whole.summary.json").read_text())
    assert resumed["variants"]["pairwise"]["grades"] is True
    done = ScriptedModel(_variant_judge(True))  # a finished check run again judges nothing
    bench_tasks.judgecheck("judge:tomi", done, out=out, **kwargs)
    assert done.calls == [] and len(_check_rows(out)) == 12
    # a re-run naming one variant still reports the other, held in full on disk
    one = bench_tasks.judgecheck("judge:tomi", done, out=out, **(kwargs | {"variants": ["k3"]}))
    assert list(one["variants"]) == ["k3", "absolute", "pairwise"] and len(done.calls) == 18
    with pytest.raises(SystemExit, match=r"other settings \(sizes \[4, 3, 5\] there, \[4, 4, 4\]"):
        bench_tasks.judgecheck("judge:tomi", done, out=out, **(kwargs | {"sizes": (4, 4, 4)}))
    old = tmp_path / "old.jsonl"  # a file written before checks resumed: no header
    old.write_text(json.dumps({"example_id": "tomi-1", "case": "wrong", "passed": False}) + "\n")
    with pytest.raises(SystemExit, match="without recorded settings"):
        bench_tasks.judgecheck("judge:tomi", done, out=old, **kwargs)


def test_an_unreadable_verdict_keeps_the_judges_whole_reply(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_tasks, "TASK_FILES", tmp_path / "tasks")
    wheel = _tomi_wheel(tmp_path, 12)
    kwargs = {"seed": 0, "split": "val", "sizes": (4, 3, 5), "wheel": wheel}
    ramble = "I think the place is " + "quite possibly the green box, or not, " * 20 + "END"
    out = tmp_path / "judgecheck_tomi.jsonl"
    c = bench_tasks.judgecheck("judge:tomi", ScriptedModel(lambda m: ramble), out=out, **kwargs)
    assert c["errors"] == 6 and c["reference"] == (0, 0)
    for row in _check_rows(out):
        assert row["judge_reply"] == ramble  # the whole last reply, after the repair request
        assert "no readable score" in row["error"] and len(row["error"]) < 200
        assert "END" not in row["error"]  # the message itself stays short


def test_the_judge_check_counts_errors_apart_and_reads_old_rows():
    rows = [  # rows of a check before variants: no `variant`, the absolute variant's
        {"example_id": "a", "case": "reference", "passed": True},
        {"example_id": "a", "case": "wrong", "passed": False},
        {"example_id": "b", "case": "reference", "passed": True},
        {"example_id": "b", "case": "wrong", "error": "judge gave no readable score"},
        {"example_id": "c", "case": "reference", "passed": False},
        {"example_id": "c", "case": "wrong", "passed": True},
    ]
    s = bench_tasks.judge_check_summary(rows, ["absolute"])
    assert (s["errors"], s["reference"], s["wrong"], s["grades"]) == (1, (2, 3), (1, 2), False)
    v = s["variants"]["absolute"]
    assert (v["agreement"]["k"], v["agreement"]["n"]) == (3, 5)
    assert (v["pairs"]["k"], v["pairs"]["n"]) == (1, 2)  # b's wrong answer was never judged
    assert v["reference_rate"]["rate"] == 0.6667


def test_judge_variant_names():
    parse = bench_tasks.JudgeVariant.parse
    assert [parse(n).name for n in ("absolute", "k5", "absolute+k5", "pairwise+k3")] == [
        "absolute", "k5", "k5", "pairwise+k3"]  # fmt: skip
    assert parse("reference+k5") == bench_tasks.JudgeVariant("reference", 5)
    for bad in ("k0", "ranked", "k"):
        with pytest.raises(SystemExit, match="judge variant"):
            parse(bad)


# ---- report rounds ---------------------------------------------------------------------

ROUND2 = protocol.round_settings(2)


def test_a_later_round_takes_fresh_seeds_its_own_file_and_its_own_systems():
    assert not set(ROUND2["report_seeds"]) & set(FROZEN["report_seeds"])
    for seed in ROUND2["report_seeds"]:  # no design tool may score a seed of any round
        with pytest.raises(SystemExit, match="are report seeds"):
            protocol.check_design_use("tool", seeds=[seed])
    s = bench_peers.parse_args(["--report"])  # the latest round
    assert (s.report_round, s.seeds, s.tasks) == (2, ROUND2["report_seeds"], ROUND2["tasks"])
    first = bench_peers.parse_args(["--report", "--round", "1"])
    assert (first.report_round, first.seeds) == (1, FROZEN["report_seeds"])
    for spec in s.tasks:
        planned = bench_peers.variants(s, spec)
        assert [system for system, _ in planned] == protocol.planned_systems(ROUND2, spec)
        assert all(system == variant for system, variant in planned)  # rows: "selftaught"
    assert s.selftaught_config == ROUND2["settings"].get("selftaught_config", {})
    arithmetic = next(spec for spec in s.tasks if "basic_arithmetic" in spec)
    assert len(bench_peers.variants(s, arithmetic)) < len(s.systems)  # selftaught + a peer
    assert bench_peers.report_file(2, "gym:chain_sum") == "report2_chain_sum.json"
    assert bench_peers.report_file(1, "gym:chain_sum") == "report_chain_sum.json"
    with pytest.raises(SystemExit, match="round 3 is unknown"):
        bench_peers.parse_args(["--report", "--round", "3"])
    with pytest.raises(SystemExit, match="--round is for --report"):
        bench_peers.parse_args(["--round", "2"])


def test_a_round_reusing_an_earlier_rounds_seed_is_refused(tmp_path, monkeypatch):
    again = {**ROUND2, "report_seeds": [FROZEN["report_seeds"][0], 900]}
    (tmp_path / "round2.json").write_text(json.dumps(again))
    monkeypatch.setitem(protocol.ROUNDS, 2, tmp_path / "round2.json")
    with pytest.raises(SystemExit, match=f"seed\\(s\\) \\[{FROZEN['report_seeds'][0]}\\] were"):
        protocol.round_settings(2)
    stray = {**ROUND2, "systems_per_task": {"gym:nope": ["selftaught"]}}
    (tmp_path / "round2.json").write_text(json.dumps(stray))
    with pytest.raises(SystemExit, match="names a task or system"):
        protocol.round_settings(2)


def test_a_round_runs_only_on_its_tagged_commit(tmp_path, monkeypatch):
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@t")
    _git(tmp_path, "config", "user.name", "t")
    monkeypatch.setattr(protocol, "REPO", tmp_path)
    (tmp_path / "code.py").write_text("1")
    _git(tmp_path, "add", "code.py")
    _git(tmp_path, "commit", "-qm", "round")
    frozen = {"code_tag": "round-x"}
    with pytest.raises(SystemExit, match="no such tag"):
        protocol.check_round_commit(frozen)
    _git(tmp_path, "tag", "round-x")
    protocol.check_round_commit(frozen)  # HEAD is the tagged commit
    (tmp_path / "code.py").write_text("2")
    with pytest.raises(SystemExit, match="as committed"):
        protocol.check_round_commit(frozen)
    _git(tmp_path, "commit", "-qam", "a change landing meanwhile")
    with pytest.raises(SystemExit, match="git worktree add"):
        protocol.check_round_commit(frozen)
    protocol.check_round_commit({})  # round 1 names no tag


def test_round_two_targets_ask_two_seeds_and_no_peer_ahead_beyond_chance():
    base = {f"i{k}": 0.0 for k in range(10)}
    st = {f"i{k}": float(k < 7) for k in range(10)}  # 7 wins: p 0.016
    rows = [_report_row("selftaught", 200, "2026-01-01", st, base),
            _report_row("selftaught", 201, "2026-01-01", base, base)]  # fmt: skip
    wanted = bench_peers.round_targets(ROUND2)
    assert wanted == {"min_gain_seeds": 2, "no_peer_ahead_beyond_chance": True}
    assert bench_peers.round_targets(FROZEN)["min_gain_seeds"] == 1  # round 1 as it was
    one_seed = bench_peers.targets(rows, ["selftaught"], [200, 201], **wanted)
    assert (one_seed["gains"], one_seed["verdict"]) == (1, "missed")
    assert bench_peers.targets(rows, ["selftaught"], [200, 201])["verdict"] == "met"
    rows.append(_report_row("selftaught", 202, "2026-01-01", st, base))
    assert bench_peers.targets(rows, ["selftaught"], [200, 201, 202], **wanted)["verdict"] == "met"
    # a peer ahead on the mean gain and beyond chance on the same items (pooled: 16 / 0)
    allw = {f"i{k}": 1.0 for k in range(10)}
    peer = [_report_row("gepa", seed, "2026-01-01", allw, base) for seed in (200, 201, 202)]
    t = bench_peers.targets(rows + peer, ["selftaught", "gepa"], [200, 201, 202], **wanted)
    assert t["ahead_beyond_chance"] == t["behind"] == ["gepa"] and t["verdict"] == "missed"
    assert "ahead of it beyond chance on the same items: gepa" in bench_peers.targets_line(
        rows + peer, **wanted
    )


def test_two_systems_that_gained_the_same_items_tie_whatever_the_float_sums_say():
    def solved(n: int) -> dict:
        return {f"i{k}": float(k < n) for k in range(100)}

    rows = []
    for seed, base, ours, theirs in ((200, 31, 61, 70), (201, 31, 72, 67), (202, 24, 83, 79)):
        for system, shipped in (("selftaught", ours), ("dspy-bfrs", theirs)):
            rows.append(_report_row(system, seed, "2026-01-01", solved(shipped), solved(base)))
    deltas = {v: [r["test"]["paired"]["delta"] for r in rows if r["variant"] == v]
              for v in ("selftaught", "dspy-bfrs")}  # fmt: skip
    assert sum(deltas["selftaught"]) != sum(deltas["dspy-bfrs"])  # as floats they differ
    t = bench_peers.targets(rows, ["selftaught", "dspy-bfrs"], [200, 201, 202])
    assert t["behind"] == [] and t["ours"] == t["best_peer"][1] and t["verdict"] == "met"


def test_the_many_comparisons_line_counts_the_tests_and_applies_holm():
    assert bench_peers.holm_passes([0.001, 0.03, 0.04]) == 1  # 0.03 > 0.05 / 2 stops it
    assert bench_peers.holm_passes([0.001, 0.02, 0.04]) == 3
    assert bench_peers.holm_passes([0.02, 0.02, 0.02]) == 0  # 0.02 > 0.05 / 3
    base = {f"i{k}": 0.0 for k in range(10)}
    st = {f"i{k}": float(k < 8) for k in range(10)}
    rows = [_report_row("selftaught", 200, "2026-01-01", st, base),
            _report_row("gepa", 200, "2026-01-01", base, base)]  # fmt: skip
    ps = bench_peers.round_comparisons([rows])
    assert len(ps) == 2  # selftaught's seed, gepa against selftaught
    line = bench_peers.many_comparisons_line([rows])
    assert "2 two-sided tests" in line and "2 pass" in line and "0.1 would pass" in line


def test_the_label_check_reads_every_dev_runs_shipped_skill_without_a_model(tmp_path):
    spec = "gym:syllogism"
    sizes = {"train": 30, "val": 4, "test": 4}
    task = bench_tasks.build_task(spec, seed=1, train_size=30, val_size=4, test_size=4)
    labels = sorted({str(ex.reference).lower() for ex in task.examples("train")})
    assert labels == ["no", "yes"]
    runs = [{"task": spec, "seed": 1, "system": "selftaught", "variant": "selftaught",
             "shipped_prompt": _skill("Think.", "Yes", "No")},
            {"task": spec, "seed": 1, "system": "gepa", "variant": "gepa",
             "shipped_prompt": _skill("Usually the answer is No.", "No")},
            {"task": spec, "seed": 2, "variant": "skillrl", "error": "x"}]  # fmt: skip
    results = tmp_path / "peers_syllogism.json"
    results.write_text(json.dumps({"settings": sizes, "runs": runs}))
    out = tmp_path / "labelcheck.json"
    checked = bench_tasks.label_check(results, out)
    assert [(r["variant"], r["labels"]["labels_lost"]) for r in checked] == [
        ("selftaught", []), ("gepa", ["yes"])]  # fmt: skip
    assert checked[1]["labels"]["prior_labels"] == ["no"]
    assert json.loads(out.read_text())["runs"] == checked
    runs[0]["seed"] = FROZEN["report_seeds"][0]  # a report run is no design input
    results.write_text(json.dumps({"settings": sizes, "runs": runs}))
    with pytest.raises(SystemExit, match="design choices"):
        bench_tasks.label_check(results, out)


def test_a_judge_check_is_not_resumed_with_another_judge_prompt(tmp_path, monkeypatch):
    from dataclasses import replace

    monkeypatch.setattr(bench_tasks, "TASK_FILES", tmp_path / "tasks")
    wheel = _tomi_wheel(tmp_path, 12)
    kwargs = {"seed": 0, "split": "val", "sizes": (4, 3, 5), "wheel": wheel,
              "out": tmp_path / "check.jsonl", "variants": ["absolute"]}  # fmt: skip
    bench_tasks.judgecheck("judge:tomi", ScriptedModel(_variant_judge(True)), **kwargs)
    before = bench_tasks.judge_prompts_digest("tomi")
    js = bench_tasks.JUDGE_SETS["tomi"]
    monkeypatch.setitem(bench_tasks.JUDGE_SETS, "tomi", replace(js, rubric=js.rubric + " Be kind."))
    assert bench_tasks.judge_prompts_digest("tomi") != before
    with pytest.raises(SystemExit, match="other settings \\(prompts "):
        bench_tasks.judgecheck("judge:tomi", ScriptedModel(_variant_judge(True)), **kwargs)
