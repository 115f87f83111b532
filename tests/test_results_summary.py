"""One summary type, one decoder: every accuracy summary shape a run directory (or a saved
benchmark result) holds reads through `SplitScore.from_dict`, the same way in evaluation, results
and the report; the typed history rows and results read files written before they were typed
and write them back unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from selftaught.evaluation import EvalResult
from selftaught.gate import GateResult
from selftaught.report import render_report
from selftaught.report.readers import ReportError, load_run, read_estimate
from selftaught.results import LEGACY_KEYS, RunResult, SplitScore, SummaryError
from selftaught.skill.result import SkillRunResult
from selftaught.skill.rows import BaselineRow, StepRow, row_from_dict
from selftaught.weights.rest import RestResult
from selftaught.weights.rl import RLResult
from selftaught.weights.rows import RestRound, RLStepRow

ROOT = Path(__file__).resolve().parents[1]
OLD_RUNS = Path(__file__).parent / "fixtures" / "old_runs"  # written by the code before
CI = [0.2077, 0.9385]  # Wilson 95% of 2/3

# every shape an accuracy summary was ever written in: n 3, 2 solved (hard 2/3), soft 0.8
SHAPES: dict[str, dict[str, Any]] = {
    "evaluation": {  # EvalResult.summary(): what every trainer writes now
        **{"task": "t", "model": "m", "split": "val", "n": 3, "n_errors": 1},
        **{"n_scorer_errors": 0, "hard": 2 / 3, "hard_ci": CI, "soft": 0.8},
        **{"soft_ci": [0.5, 1.0], "prompt_tokens": 7, "completion_tokens": 9, "truncated": 1},
        **{"retries": 0, "wall_s": 0.5, "skill_hash": "h", "usage": {}, "tool_use": None},
        **{"n_cached": 0, "solved": 2},
    },
    "score": {"split": "val", "n": 3, "hard": 2 / 3, "hard_ci": CI, "soft": 0.8},
    "skill trainer": {
        **{"n": 3, "errors": 1, "solved": 2, "hard": 2 / 3, "hard_ci95": CI},
        **{"soft": 0.8, "soft_ci95": [0.5, 1.0]},
    },
    "skill trainer test": {
        **{"n": 3, "errors": 1, "solved": 2, "hard": 2 / 3, "hard_ci95": CI, "soft": 0.8},
        **{"soft_ci95": [0.5, 1.0], "skill_hash": "h", "skill_version": "v0001"},
    },
    "night held-out": {
        **{"n": 3, "errors": 1, "hard": 2 / 3, "hard_ci95": CI, "soft": 0.8, "tokens": 40},
        **{"adopted_version": 2, "adapter": None},
    },
    "weight trainers": {
        **{"split": "val", "n": 3, "solved": 2, "accuracy": 2 / 3, "ci": CI},
        **{"mean_soft": 0.8, "truncated": 1, "seconds": 0.5},
    },
    "peers benchmark": {"n": 3, "errors": 1, "solved": 2, "hard": 2 / 3, "ci95": CI, "soft": 0.8},
    "no interval": {"n": 3, "solved": 2, "hard": 2 / 3, "soft": 0.8},  # Wilson from the counts
}


@pytest.mark.parametrize("name", SHAPES)
def test_every_summary_shape_decodes_once_the_same_everywhere(name):
    shape = SHAPES[name]
    score = SplitScore.from_dict(shape, "val")
    assert (score.split, score.n, score.solved) == ("val", 3, 2)
    assert score.hard == pytest.approx(2 / 3) and score.soft == pytest.approx(0.8)
    assert score.hard_ci == pytest.approx(tuple(CI), abs=1e-4)
    # evaluation, results and the report read it through that decoder: the same numbers
    evaluation = EvalResult.from_summary(shape)
    assert evaluation.score("val") == score
    assert SplitScore.from_dict(SplitScore.from_dict(shape, "val").to_dict()) == score
    estimate = read_estimate(shape)
    assert (estimate.value, estimate.n, estimate.solved) == (score.hard, 3, 2)
    assert (estimate.lo, estimate.hi) == score.hard_ci
    assert read_estimate(shape, "soft").value == pytest.approx(0.8)


def test_an_interval_a_summary_did_not_store_stays_unknown():
    weights = SHAPES["weight trainers"]
    assert SplitScore.from_dict(weights).soft_ci is None  # old weight runs stored no soft interval
    assert read_estimate(weights, "soft").lo is None
    assert SplitScore.from_dict({"hard": 0.5}).hard_ci == (0.0, 1.0)  # Wilson of no item
    assert (
        SplitScore.read({"n": 3}) is None
        and SplitScore.read(None) is None
        and SplitScore.read([1]) is None
    )
    assert set(LEGACY_KEYS.values()) <= {"hard_ci", "soft_ci", "n_errors", "hard", "soft", "wall_s"}


def test_a_summary_no_shape_explains_is_one_error():
    with pytest.raises(SummaryError, match=r"^an accuracy summary has a non-numeric 'n'"):
        SplitScore.from_dict({"n": "three", "hard": 0.5})
    with pytest.raises(ReportError, match=r"non-numeric 'hard'"):
        read_estimate({"accuracy": "most"})


def _summaries(value: Any) -> list[dict[str, Any]]:
    """Every dict in `value` that looks like an accuracy summary (a count and a score)."""
    out: list[dict[str, Any]] = []
    if isinstance(value, dict):
        if "n" in value and ({"hard", "accuracy"} & set(value)):
            out.append(value)
        for v in value.values():
            out += _summaries(v)
    elif isinstance(value, list):
        for v in value:
            out += _summaries(v)
    return out


def test_every_saved_summary_in_the_repository_still_reads():
    files = sorted((ROOT / "benchmarks" / "results").rglob("*.json"))
    files += sorted(OLD_RUNS.rglob("*.json"))
    found = 0
    for path in files:
        for d in _summaries(json.loads(path.read_text(encoding="utf-8"))):
            if not isinstance(d.get("n"), int):
                continue  # a table's row that only names a count, not a summary
            score = SplitScore.from_dict(d)
            assert score.hard == pytest.approx(d.get("hard", d.get("accuracy"))), path
            assert score.n == d["n"], path
            found += 1
    assert found > 100  # benchmarks/results holds hundreds, in five shapes


# ---- typed results and rows read what the code before wrote, and write it back ------------
def _rows(kind: str) -> list[dict[str, Any]]:
    text = (OLD_RUNS / kind / "history.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def _json(kind: str, name: str) -> dict[str, Any]:
    return json.loads((OLD_RUNS / kind / name).read_text(encoding="utf-8"))


def test_a_saved_rest_result_and_history_round_trip_typed():
    saved = _json("rest", "result.json")
    result = RunResult.from_dict(saved)
    assert isinstance(result, RestResult) and all(isinstance(r, RestRound) for r in result.rounds)
    assert result.rounds[1].gate is not None and result.rounds[1].gate.decision == "accept_new_best"
    assert result.rounds[1].val is not None and result.rounds[1].val.n == 4
    assert result.to_dict() == saved
    rows = _rows("rest")
    assert [RestRound.from_dict(r).to_dict() for r in rows] == rows
    assert [r.to_dict() for r in result.rounds] == rows


def test_a_saved_rl_result_and_history_round_trip_typed():
    saved = _json("rl", "result.json")
    result = RunResult.from_dict(saved)
    assert isinstance(result, RLResult) and isinstance(result.gate, GateResult)
    assert result.gate.decision == "accept_new_best" and result.gate.n_paired == 3
    assert all(isinstance(s, RLStepRow) for s in result.steps)
    assert result.steps[0].all_rewards_equal and result.steps[0].warnings
    assert result.steps[2].metrics["rewards/format"] == 0.5
    assert result.to_dict() == saved
    rows = _rows("rl")
    assert [RLStepRow.from_dict(r).to_dict() for r in rows] == rows


def test_a_saved_skill_summary_and_history_round_trip_typed():
    saved = _json("optimize", "summary.json")
    result = RunResult.from_dict(saved)
    assert isinstance(result, SkillRunResult)
    assert result.to_dict() == saved
    rows = _rows("optimize")
    typed = [row_from_dict(r) for r in rows]
    assert isinstance(typed[0], BaselineRow) and all(isinstance(t, StepRow) for t in typed[1:])
    assert isinstance(typed[0].val, EvalResult) and isinstance(typed[1].gate, GateResult)
    assert [t.to_dict() for t in typed] == rows


@pytest.mark.parametrize("kind", ["optimize", "rest", "rl"])
def test_the_report_renders_saved_runs_from_their_typed_rows(kind, tmp_path):
    run_dir = tmp_path / kind
    shutil.copytree(OLD_RUNS / kind, run_dir)
    run = load_run(run_dir)
    page = render_report(run_dir)
    if kind == "rest":
        rows = [RestRound.from_dict(r) for r in _rows("rest")]
        assert [r.val.value for r in run.rounds] == [r.val.hard for r in rows if r.val]
        assert run.rounds[1].new_best and not run.rounds[2].new_best
        assert run.shipped_test is not None and run.shipped_test.n == 4
    elif kind == "rl":
        assert [s.step for s in run.steps] == [1, 2, 3] and run.steps[0].all_rewards_equal
        assert run.trained_val is not None and run.trained_val.solved == 5
    else:
        decisions = [s.decision for s in run.steps]
        assert decisions == ["accept", "accept_new_best", "reject", "accept_new_best"]
        assert run.test_best is not None and run.baseline is not None
    assert "<html" in page


def test_a_weight_run_written_before_one_shape_reads_and_reports(tmp_path):
    """A ReST run whose summaries are the weight trainers' old {accuracy, ci, mean_soft}."""
    run_dir = tmp_path / "old-rest"
    shutil.copytree(OLD_RUNS / "rest", run_dir)
    old = SHAPES["weight trainers"]
    rows = _rows("rest")
    for row in rows:
        row["val"] = {**old, "split": "val"}
        row.pop("test", None)
    (run_dir / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _json("rest", "result.json")
    result.update(base_test={**old, "split": "test"}, shipped_test={**old, "split": "test"})
    result["rounds"] = rows
    for key in ("base_score", "shipped_score"):  # written since results were typed
        result.pop(key)
    (run_dir / "result.json").write_text(json.dumps(result))
    back = RunResult.from_dict(result)
    assert isinstance(back, RestResult) and back.base_test.hard == pytest.approx(2 / 3)
    assert back.shipped_score == SplitScore.from_dict(old, "test")
    run = load_run(run_dir)
    assert [r.val.solved for r in run.rounds] == [2, 2, 2]
    assert run.base_test.lo == pytest.approx(CI[0])
    assert "0.667 (2/3" in render_report(run_dir)


def test_the_old_name_score_reads_as_split_score_with_a_deprecation_warning():
    """`tasks.base.Score` is the one class named Score; the accuracy summary's old name, which
    docs/report.md named, still imports, and says what it is now."""
    from selftaught import results

    with pytest.warns(DeprecationWarning, match="now SplitScore"):
        old = results.Score
    assert old is SplitScore
    with pytest.raises(AttributeError):
        results.NoSuchName  # noqa: B018
