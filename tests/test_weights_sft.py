"""Fine-tuning really changes weights: LoRA on the embedded model (real weights, one step),
DoRA, and `full` with --num-layers touching only the last layers (tiny random model)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from selftaught.weights.config import BackendConfig, SFTTrainConfig  # noqa: E402
from selftaught.weights.sampling import Sample  # noqa: E402
from selftaught.weights.scratch import build_scratch_model, scratch_tokenizer  # noqa: E402
from selftaught.weights.sft import merged, prepare_trainable, sft_train  # noqa: E402


def samples(n: int = 4) -> list[Sample]:
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"Calculate {i} + 2.\n\nGive the final answer only."}]
        out.append(Sample(f"e{i}", msgs, msgs, str(i + 2), str(i + 2), 1.0, 1.0))
    return out


@pytest.fixture(scope="module")
def tok():
    return scratch_tokenizer()


def tiny(tok, seed: int = 0):
    return build_scratch_model(
        tok, BackendConfig(scratch_layers=2, scratch_width=32, scratch_heads=2), seed=seed
    )


def test_lora_step_on_embedded_model_changes_weights():
    from selftaught.models.embedded import embedded_model_dir
    from selftaught.weights.sft import load_causal_lm

    torch.set_num_threads(1)  # shared 2-core CI machines: oversubscription is 5x slower
    model, tokenizer = load_causal_lm(embedded_model_dir())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    peft_model = prepare_trainable(model, BackendConfig(lora_r=4, lora_alpha=8))
    lora_b = [p for n, p in peft_model.named_parameters() if "lora_B" in n]
    # LoRA's B matrices start at zero, so the adapter starts as a no-op
    assert lora_b and all(p.detach().abs().sum().item() == 0.0 for p in lora_b)
    stats = sft_train(
        peft_model,
        tokenizer,
        samples(2),
        SFTTrainConfig(epochs=1, batch_size=2, learning_rate=1e-3, warmup_ratio=0.0),
        backend="lora",
        progress=False,
    )
    assert stats["steps"] == 1
    assert any(p.detach().abs().sum().item() > 0 for p in lora_b)
    folded = merged(peft_model)
    changed = [
        k for k, v in folded.state_dict().items() if k in before and not torch.equal(v, before[k])
    ]
    assert any("q_proj" in k or "down_proj" in k for k in changed)
    assert stats["trainable_params"] < sum(v.numel() for v in before.values()) / 10


def test_full_backend_with_num_layers_trains_only_the_last_layers(tok):
    model = tiny(tok)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainable = prepare_trainable(model, BackendConfig(backend="full", num_layers=1))
    sft_train(
        trainable,
        tok,
        samples(4),
        SFTTrainConfig(epochs=1, batch_size=2, learning_rate=1e-2),
        backend="full",
        progress=False,
    )
    after = trainable.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("model.layers.1.") for k in changed)


def test_dora_adds_magnitudes_and_trains(tok):
    model = tiny(tok)
    peft_model = prepare_trainable(
        model, BackendConfig(use_dora=True, lora_r=4, target_modules="q_proj,v_proj")
    )
    names = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert any("magnitude" in n for n in names)
    assert all(("q_proj" in n or "v_proj" in n) for n in names)
    mags = {n: p.clone() for n, p in peft_model.named_parameters() if "magnitude" in n}
    sft_train(
        peft_model,
        tok,
        samples(4),
        SFTTrainConfig(epochs=1, batch_size=2, learning_rate=1e-2),
        backend="lora",
        progress=False,
    )
    params = dict(peft_model.named_parameters())
    assert any(not torch.equal(params[n], v) for n, v in mags.items())


def test_a_model_in_training_samples_through_the_engine(tok):
    """The model being trained answers through LocalModel (the one generation path): k
    samples per prompt, truncation marked, seeded sampling repeats, train mode restored."""
    from selftaught.models.base import GenerationParams
    from selftaught.models.local import LocalModel

    model = tiny(tok)
    model.train()
    chat = LocalModel.from_pretrained_model(model, tok, max_batch_size=4)
    params = GenerationParams(max_tokens=3, temperature=0.9, seed=1)
    prompt = [{"role": "user", "content": "a longer one"}]
    from selftaught.models.base import run_sync

    out = run_sync(chat.achat_n(prompt, params, 3))
    again = run_sync(chat.achat_n(prompt, params, 3))
    assert len(out) == 3
    for c in out:
        assert c.completion_tokens <= 3
        assert c.truncated == (c.completion_tokens == 3)
    assert [c.text for c in out] == [c.text for c in again]
    assert model.training  # generation switched to eval and back
    chat.close()


def test_micro_batches_split_a_batch_of_long_rows_evenly():
    from selftaught.weights.sft import micro_batches

    assert micro_batches(8, 60, budget=2048) == 1  # short rows: one forward, as before
    assert micro_batches(8, 450, budget=2048) == 2  # 4 rows of 450 fit, 8 do not
    assert micro_batches(6, 700, budget=2048) == 3  # a divisor of the batch
    assert micro_batches(8, 3000, budget=2048) == 8  # a row alone past the budget


def test_a_batch_split_into_micro_batches_takes_the_same_steps(tok, monkeypatch):
    """Long rows over the micro-batch budget: the batch is run in parts whose gradients
    accumulate into one optimizer step; with no dropout the weights end where one forward
    of the whole batch takes them."""
    from selftaught.weights import sft as sft_mod

    rows = []
    for i in range(6):
        msgs = [{"role": "user", "content": f"Question {i}: " + "add the numbers. " * (3 + 2 * i)}]
        answer = f"answer {i} " * (2 + i)
        rows.append(Sample(f"e{i}", msgs, msgs, answer, answer, 1.0, 1.0))
    # fp32: the same weights either way (bf16 autocast rounds per micro-batch layout)
    cfg = SFTTrainConfig(epochs=2, batch_size=4, learning_rate=1e-2, warmup_ratio=0.0, bf16=False)
    backend = BackendConfig(lora_r=2, lora_alpha=4, lora_dropout=0.0)
    trained, parts_used = [], []
    real_args = sft_mod._sft_args

    def spy(*args, **kwargs):
        parts_used.append(kwargs["parts"])
        return real_args(*args, **kwargs)

    monkeypatch.setattr(sft_mod, "_sft_args", spy)
    for budget in (10_000, 60):  # the whole batch at once; then parts of one or two rows
        monkeypatch.setattr(sft_mod, "MICRO_BATCH_TOKENS", budget)
        model = prepare_trainable(tiny(tok, seed=3), backend)
        stats = sft_train(model, tok, rows, cfg, backend="lora", seed=1, progress=False)
        assert stats["steps"] == 4  # 2 epochs of ceil(6 / 4) steps either way
        trained.append({k: v.detach().clone() for k, v in model.named_parameters() if "lora" in k})
    assert parts_used[0] == 1 and parts_used[1] > 1
    whole, split = trained
    assert all(torch.allclose(whole[k], split[k], atol=1e-5) for k in whole)
    assert any(not torch.equal(whole[k], torch.zeros_like(whole[k])) for k in whole)
