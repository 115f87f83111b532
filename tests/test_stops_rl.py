"""Stops on `train --method grpo`: `--max-minutes` ends training after the optimizer step that
crosses it (a checkpoint is written there), the gate decides on what was learned, and the same
command trains on from that step; `--patience` is refused (GRPO gates once). One real TRL run
on a random 1-layer model with a fake clock."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("trl")

import selftaught.stops as stops_mod  # noqa: E402
from selftaught.errors import ConfigError  # noqa: E402
from selftaught.runs import RunDir  # noqa: E402
from selftaught.stops import StopReason, Stops  # noqa: E402
from selftaught.weights.config import BackendConfig, RLConfig  # noqa: E402
from tests.test_weights_rl import SumTask  # noqa: E402
from tests.tiny_model import save_tiny_model  # noqa: E402


def rl_config(stops: Stops) -> RLConfig:
    return RLConfig(
        steps=3,
        num_generations=2,
        prompts_per_step=1,
        max_completion_length=4,
        eval_max_tokens=4,
        backend=BackendConfig(lora_r=2, lora_alpha=4),
        stops=stops,
    )


def test_grpo_max_minutes_stops_after_a_step_and_a_rerun_trains_on(tmp_path, monkeypatch):
    from selftaught.weights.rl import RLTrainer

    t = [0.0]

    def clock():  # a minute passes at each read: started, then once per optimizer step
        t[0] += 60
        return t[0]

    monkeypatch.setattr(stops_mod, "now", clock)
    model, run = save_tiny_model(tmp_path / "tiny"), tmp_path / "run"
    result = RLTrainer(
        rl_config(Stops(max_minutes=1.5)), SumTask(), model, output_dir=run, progress=False
    ).train()
    assert result.stopped_by == StopReason("max_minutes", "1.5 min", "after optimizer step 2")
    assert [r["step"] for r in RunDir(run).history()] == [1, 2]
    assert result.gate and (run / "best" / "config.json").exists()  # gated and shipped
    assert any((run / "checkpoints").glob("checkpoint-2"))
    result = RLTrainer(rl_config(Stops()), SumTask(), model, output_dir=run, progress=False).train()
    assert result.stopped_by is None
    assert [r["step"] for r in RunDir(run).history()] == [1, 2, 3]  # from step 2 on
    assert not (run / "checkpoints").exists()


def test_grpo_refuses_patience():
    with pytest.raises(ConfigError, match="gates once, after training"):
        rl_config(Stops(patience=2))
