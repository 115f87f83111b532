"""Stops on `train --method rest`: patience over rounds (its count survives resume) and
`--max-minutes` (the run ends after the round that crosses it, a re-run resumes), on the tiny
random model of tests/test_weights_rest.py with scripted val scores and a fake clock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("trl")

import selftaught.stops as stops_mod  # noqa: E402
from selftaught.stops import StopReason, Stops  # noqa: E402
from selftaught.weights.rest import RestTrainer  # noqa: E402
from tests import test_weights_rest  # noqa: E402
from tests.test_weights_rest import EchoTask, config, scripted_eval  # noqa: E402

tiny_dir = test_weights_rest.tiny_dir  # the fixture: a tiny random model on disk


def rest_trainer(model_dir: Path, run: Path, stops: Stops) -> RestTrainer:
    cfg = config(3)
    cfg.stops = stops
    return RestTrainer(cfg, EchoTask(), model_dir, output_dir=run, progress=False)


def test_rest_patience_stops_after_k_rounds_and_survives_resume(tiny_dir, tmp_path, monkeypatch):
    # val: base 0.5, then rounds that never beat it: patience 2 stops after round 2 of 3
    scripted_eval(monkeypatch, [0.5, 0.25, 0.25, 0.25])
    run = tmp_path / "run"
    result = rest_trainer(tiny_dir, run, Stops(patience=2)).train()
    assert result.stopped_by == StopReason.patience(2, "rounds", "after round 2")
    assert [h.round for h in result.rounds] == [0, 1, 2] and result.best_round == 0
    assert result.rounds[-1].stopped_by.kind == "patience"  # in history
    # the count survives resume: the same patience stops before round 3, no round redone
    result = rest_trainer(tiny_dir, run, Stops(patience=2)).train()
    assert result.stopped_by.at == "before round 3" and len(result.rounds) == 3


def test_rest_max_minutes_ends_after_a_round_and_a_rerun_resumes(tiny_dir, tmp_path, monkeypatch):
    t = [0.0]
    monkeypatch.setattr(stops_mod, "now", lambda: t[0])
    calls = scripted_eval(monkeypatch, [0.25, 0.75, 0.75, 0.75])
    fake = RestTrainer._eval

    def slow_eval(self, model, r, split):  # each evaluation takes ten minutes of the clock
        t[0] += 600
        return fake(self, model, r, split)

    monkeypatch.setattr(RestTrainer, "_eval", slow_eval)
    run = tmp_path / "run"
    result = rest_trainer(tiny_dir, run, Stops(max_minutes=25)).train()
    # base val + test (20 min), round 1's val (30 min): past 25 min after round 1
    assert result.stopped_by == StopReason("max_minutes", "25 min", "after round 1")
    assert result.best_round == 1 and len(result.rounds) == 2
    result = rest_trainer(tiny_dir, run, Stops(max_minutes=1000)).train()
    assert result.stopped_by is None and [h.round for h in result.rounds] == [0, 1, 2, 3]
    assert calls["val"] == 4  # round 0 and round 1 were not evaluated again
