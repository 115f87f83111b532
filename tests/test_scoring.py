"""One scoring path: the paired comparison, the per-item score cache, the one summary shape a
skill run, a night and evaluate write, typed history rows, and old run directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selftaught.evaluation import EvalResult, ScoreCache, ascore, evaluate_split, summarize
from selftaught.gate import GateConfig, gate, paired_comparison
from selftaught.models.base import run_sync
from selftaught.policy import Policy
from selftaught.report import render_report
from selftaught.report.readers import ReportError, SkillRun, load_run, read_estimate
from selftaught.skill.rows import BaselineRow, StepRow, row_from_dict
from selftaught.stats import sign_test_pvalue
from tests.report_fixtures import optimize_run
from tests.scripted import ToyTask, rule_target

SUMMARY_KEYS = set(
    summarize([], task="t", model="m", split="val", wall_s=0.0, skill_hash="h").summary()
)


# ---- the paired comparison ------------------------------------------------------------------
def test_paired_comparison_counts_wins_losses_ties_on_items_both_scored():
    new = {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0, "e": None, "f": 1.0}
    old = {"a": 0.0, "b": 1.0, "c": 1.0, "d": 0.0, "e": 0.0, "g": 0.0}
    p = paired_comparison(new, old)
    # e: new errored, f / g: scored on one side only -> not paired
    assert (p.wins, p.losses, p.ties) == (2, 1, 1)
    assert p.sign_test_p == pytest.approx(sign_test_pvalue(2, 1)) == pytest.approx(0.5)
    assert p.to_dict() == {"wins": 2, "losses": 1, "ties": 1, "sign_test_p": 0.5}
    back = paired_comparison(old, new)
    assert (back.wins, back.losses, back.ties) == (1, 2, 1)
    assert paired_comparison({}, {}).sign_test_p == 1.0


def test_the_gate_takes_its_sign_test_from_the_paired_comparison():
    cand = {f"x{i}": 1.0 for i in range(7)} | {"y": 0.0}
    base = {f"x{i}": 0.0 for i in range(7)} | {"y": 1.0}
    result = gate(cand, base, base, GateConfig(margin=0, confidence=0.9))
    assert result.pvalue == paired_comparison(cand, base).sign_test_p == sign_test_pvalue(7, 1)
    assert result.decision == "accept_new_best"


# ---- per-item cache ---------------------------------------------------------------------------
def test_ascore_reads_cached_items_and_rolls_out_only_the_rest(tmp_path):
    task, target = ToyTask(), rule_target()
    val = task.examples("val")  # 11 items: alpha 5, beta 3, gamma 2, delta 1
    policy = Policy(skill="rule alpha")
    cache = ScoreCache(tmp_path / "val_cache.json")
    first = run_sync(ascore(task, target, policy, val[:4], split="val", cache=cache))
    assert len(target.calls) == 4 and first.n_cached == 0 and not first.all_cached
    again = run_sync(ascore(task, target, policy, val, split="val", cache=cache))
    assert len(target.calls) == 11  # the 4 scored before were read, not rolled out
    assert again.n == 11 and again.n_cached == 4 and len(again.rollouts) == 7
    assert again.solved == 5 and again.hard == pytest.approx(5 / 11)
    assert again.prompt_tokens == sum(r.prompt_tokens for r in again.rollouts)
    # a resumed run reads the file back; nothing is rolled out for an unchanged policy
    back = ScoreCache.load(tmp_path / "val_cache.json")
    third = run_sync(ascore(task, target, policy, val, split="val", cache=back))
    assert len(target.calls) == 11 and third.all_cached
    assert third.val_scores(GateConfig()) == again.val_scores(GateConfig())
    assert {k: v for k, v in third.summary().items() if k not in ("prompt_tokens",
        "completion_tokens", "wall_s", "n_cached")} == {
        k: v for k, v in again.summary().items() if k not in ("prompt_tokens",
        "completion_tokens", "wall_s", "n_cached")}  # fmt: skip


def test_evaluate_writes_the_one_summary_shape():
    result = evaluate_split(ToyTask(), rule_target(), Policy(skill="rule alpha"), split="test")
    assert set(result.summary()) == SUMMARY_KEYS and result.solved == 5
    assert EvalResult.from_summary(result.summary()).summary() == result.summary()


# ---- a skill run writes the same shape; typed rows -------------------------------------------
@pytest.fixture(scope="module")
def skill_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run")
    optimize_run(root)
    return root


def test_a_skill_run_writes_the_evaluation_summary_for_base_val_and_test(skill_run):
    summary = json.loads((skill_run / "summary.json").read_text())
    for key in ("val_initial", "val_best"):
        assert set(summary[key]) == SUMMARY_KEYS, key
    for key in ("initial", "best"):
        assert set(summary["test"][key]) == SUMMARY_KEYS, key
    assert summary["test"]["paired"] == {"wins": 7, "losses": 0, "ties": 3, "sign_test_p": 0.007812}
    assert summary["test"]["versions"] == {"initial": "v0000", "best": "v0004"}
    rows = [json.loads(x) for x in (skill_run / "history.jsonl").read_text().splitlines()]
    assert set(rows[0]["val"]) == SUMMARY_KEYS and set(rows[1]["batch"]) == SUMMARY_KEYS
    assert rows[0]["val"]["n"] == 11 and rows[0]["val"]["n_cached"] == 11  # read from the cache


def test_history_rows_are_typed_and_round_trip(skill_run):
    rows = [json.loads(x) for x in (skill_run / "history.jsonl").read_text().splitlines()]
    typed = [row_from_dict(r) for r in rows]
    assert isinstance(typed[0], BaselineRow) and all(isinstance(t, StepRow) for t in typed[1:])
    assert [t.to_dict() for t in typed] == rows
    assert [t.gate.decision for t in typed[1:]] == [
        "accept",
        "accept_new_best",
        "reject",
        "accept_new_best",
    ]
    # a row written before a key existed reads with its default
    old = {k: v for k, v in rows[1].items() if k not in ("demos", "pool", "candidates")}
    back = row_from_dict(old)
    assert isinstance(back, StepRow) and (back.demos, back.pool, back.candidates) == ({}, [], [])


# ---- old run directories ----------------------------------------------------------------------
def _old_summary(n: int, solved: int, lo: float, hi: float) -> dict:
    """The skill trainer's summary before one shape."""
    return {
        "n": n,
        "errors": 0,
        "hard": solved / n,
        "hard_ci95": [lo, hi],
        "solved": solved,
        "soft": solved / n,
        "soft_ci95": [lo, hi],
    }


def write_old_run(root: Path) -> None:
    """An optimize run directory as the trainer wrote it before one shape (by hand)."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(
        json.dumps({"task": "toy", "optimizer_model": "m", "gate": {"metric": "hard"}})
    )
    (root / "skills").mkdir()
    (root / "skills" / "v0000.md").write_text("# Skill\n")
    (root / "skills" / "v0001.md").write_text("# Skill\nrule alpha\n")
    (root / "best_skill.md").write_text("# Skill\nrule alpha\n")
    base = {"step": 0, "stage": "baseline", "skill_version": "v0000", "skill_hash": "h0"}
    step = {
        "step": 1,
        "epoch": 1,
        "stage": "step",
        "batch": {**_old_summary(4, 1, 0.0456, 0.6994), "truncated": 2},
        "budget": 3,
        "edits": {"proposed": 1, "applied": 1},
        "gate": {"decision": "accept_new_best", "reason": "beats best by +5 items"},
        "val": _old_summary(10, 6, 0.3127, 0.8318),
        "val_cached": False,
        "skill_version": "v0001",
        "current_version": "v0001",
        "best_version": "v0001",
        "usage": {},
        "step_time_s": 1.5,
    }
    rows = [{**base, "val": _old_summary(10, 1, 0.0179, 0.4042)}, step]
    (root / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "state.json").write_text(
        json.dumps({"step": 1, "total_steps": 1, "finished": True, "best_version": "v0001"})
    )
    test = {
        "initial": {**_old_summary(10, 2, 0.0567, 0.5098), "skill_version": "v0000"},
        "best": {**_old_summary(10, 7, 0.3968, 0.8922), "skill_version": "v0001"},
        "paired": {"wins": 5, "losses": 0, "sign_test_p": 0.03125},
        "gain": 0.5,
    }
    (root / "test_results.json").write_text(json.dumps(test))
    summary = {
        "steps": 1,
        "best_version": "v0001",
        "val_initial": rows[0]["val"],
        "val_best": step["val"],
        "test": test,
        "usage": {"target": {"calls": 40, "prompt_tokens": 800, "completion_tokens": 90}},
        "elapsed_s": 3.0,
    }
    (root / "summary.json").write_text(json.dumps(summary))


def test_an_old_shape_run_directory_still_renders(tmp_path):
    write_old_run(tmp_path / "old")
    run = load_run(tmp_path / "old")
    assert isinstance(run, SkillRun) and run.status.finished
    assert (run.baseline.value, run.baseline.solved, run.baseline.n) == (0.1, 1, 10)
    (step,) = run.steps
    assert (step.val.solved, step.val.lo, step.val.hi) == (6, 0.3127, 0.8318)
    assert (step.batch.solved, step.batch.n, step.truncated) == (1, 4, 2)
    assert (run.test_initial.solved, run.test_best.solved) == (2, 7)
    assert (run.test_best.lo, run.test_best.hi) == (0.3968, 0.8922)
    page = render_report(tmp_path / "old")
    assert "0.700 (7/10" in page and "0.600 (6/10" in page


def test_read_estimate_reads_the_one_shape_and_translates_the_old_ones():
    one = summarize([], task="t", model="m", split="val", wall_s=0.0, skill_hash="h")
    one.n, one.hard, one.hard_ci, one.soft, one.soft_ci = (
        3,
        2 / 3,
        (0.2077, 0.9385),
        0.83,
        (0.5, 1.0),
    )
    skill_old = {"n": 3, "errors": 1, "solved": 2, "hard": 2 / 3, "hard_ci95": [0.2077, 0.9385]}
    weights_old = {
        "n": 3,
        "solved": 2,
        "accuracy": 2 / 3,
        "ci": [0.2077, 0.9385],
        "mean_soft": 0.83,
    }
    for shape in (one.summary(), skill_old, weights_old):
        e = read_estimate(shape)
        assert e.value == pytest.approx(2 / 3) and e.n == 3 and e.solved == 2
        assert (e.lo, e.hi) == (0.2077, 0.9385)
    assert read_estimate(one.summary(), "soft").value == read_estimate(weights_old, "soft").value
    assert read_estimate(None) is None and read_estimate({"n": 3}) is None


def test_a_summary_no_shape_explains_fails_in_one_sentence(tmp_path):
    write_old_run(tmp_path / "bad")
    rows = (tmp_path / "bad" / "history.jsonl").read_text().splitlines()
    row = json.loads(rows[1])
    row["val"]["hard"] = "most"
    rows[1] = json.dumps(row)
    (tmp_path / "bad" / "history.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.raises(ReportError, match=r"^an accuracy summary has a non-numeric 'hard'"):
        load_run(tmp_path / "bad")


# ---- a night keeps its val scores in memory ---------------------------------------------------
def test_a_night_pairs_before_and_after_from_memory_not_val_cache_json(tmp_path, monkeypatch):
    from selftaught.skill.config import SkillOptConfig
    from selftaught.sleep.night.cycle import run_night
    from tests.scripted import POISON, append, canned_analyst, edits_json
    from tests.test_sleep_cycle import ALPHA_NIGHT, config, fill_log, models

    def no_reread(path):
        raise AssertionError(f"a night re-read {path}")

    monkeypatch.setattr(ScoreCache, "load", classmethod(lambda cls, path: no_reread(path)))
    fill_log(tmp_path, ALPHA_NIGHT)
    adopted = tmp_path / "projects" / "demo" / "adopted"
    adopted.mkdir(parents=True)
    (adopted / "skill.md").write_text("rule alpha")
    poison = canned_analyst(failure=edits_json(append(POISON)))
    training = SkillOptConfig(epochs=1, batch_size=16, gate=GateConfig(accept_all=True))
    (night,) = run_night(config(tmp_path, training=training), models=models(analyst=poison))
    assert night.status == "staged", night.reason
    proposal = night.proposal
    assert proposal is not None and proposal.val_before and proposal.val_after and proposal.paired
    paired, n_val = proposal.paired, proposal.val_before.score.n
    assert paired.wins == 0 and paired.losses == proposal.val_before.score.solved > 0
    assert paired.wins + paired.losses + paired.ties == n_val
    assert set(proposal.val_before.to_dict()) == set(proposal.val_after.to_dict()) == SUMMARY_KEYS
