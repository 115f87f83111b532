"""A night's weight training is capped: SFT and DPO stop at `max_steps` and after the step
that crosses the run's deadline (`--max-minutes`); DPO on a LoRA model trains the adapter
(tiny random model)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from selftaught.stops import Deadline, Stops  # noqa: E402
from selftaught.weights.config import BackendConfig, ConfigError, SFTTrainConfig  # noqa: E402
from selftaught.weights.dpo import PreferencePair, dpo_train  # noqa: E402
from selftaught.weights.scratch import build_scratch_model, scratch_tokenizer  # noqa: E402
from selftaught.weights.sft import prepare_trainable, sft_train  # noqa: E402
from tests.test_weights_sft import samples  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return scratch_tokenizer()


def tiny_lora(tok):
    model = build_scratch_model(
        tok, BackendConfig(scratch_layers=2, scratch_width=32, scratch_heads=2), seed=0
    )
    return prepare_trainable(model, BackendConfig(lora_r=4, lora_alpha=8))


def test_sft_stops_at_max_steps(tok):
    cfg = SFTTrainConfig(epochs=5, batch_size=2, max_steps=2)  # 5 epochs would be 10 steps
    stats = sft_train(tiny_lora(tok), tok, samples(4), cfg, backend="lora", progress=False)
    assert stats["steps"] == 2 and "stopped_by" not in stats


def test_sft_stops_after_the_step_that_crosses_the_deadline(tok):
    cfg = SFTTrainConfig(epochs=5, batch_size=2)
    deadline = Deadline.start(1e-9)
    model = tiny_lora(tok)
    stats = sft_train(
        model, tok, samples(4), cfg, backend="lora", progress=False, deadline=deadline
    )
    assert stats["steps"] == 1 and stats["stopped_by"]["kind"] == "max_minutes"
    assert stats["stopped_by"]["at"] == "after optimizer step 1"


def test_dpo_trains_the_adapter_on_preference_pairs_within_the_cap(tok):
    model = tiny_lora(tok)
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    pairs = [
        PreferencePair(f"e{i}", [{"role": "user", "content": f"{i} + 2?"}], str(i + 2), "no idea")
        for i in range(4)
    ]
    cfg = SFTTrainConfig(epochs=10, batch_size=2, max_length=64, max_steps=2)
    stats = dpo_train(model, tok, pairs, cfg, learning_rate=1e-2)
    assert stats["steps"] == 2 and stats["train_pairs"] == 4
    assert abs(stats["loss_first"] - 0.6931) < 1e-3  # policy == reference at the start
    assert any(p.detach().abs().sum().item() > 0 for p in lora_b)


def test_caps_and_too_few_pairs_are_refused_clearly(tok):
    with pytest.raises(ConfigError, match="max_steps must be >= 1"):
        SFTTrainConfig(max_steps=0)
    with pytest.raises(ConfigError, match="max_minutes must be > 0"):
        Stops(max_minutes=0)
    pair = PreferencePair("e", [{"role": "user", "content": "hi"}], "a", "b")
    with pytest.raises(ConfigError, match="larger than the 1 preference pairs"):
        dpo_train(tiny_lora(tok), tok, [pair], SFTTrainConfig(batch_size=2))
