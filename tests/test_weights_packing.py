"""Padding-free packing (`SFTTrainConfig.packing`): a micro-batch's episodes run as one row
with position ids restarting per episode, so nothing is computed on padding, and training
takes the same loss and the same step as unpacked training (tiny random Llama, the real
tokenizer, tool episodes rendered as the local backend renders them)."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from selftaught.weights import sft as sft_mod  # noqa: E402
from selftaught.weights.config import BackendConfig, ConfigError, SFTTrainConfig  # noqa: E402
from selftaught.weights.sampling import Sample  # noqa: E402
from selftaught.weights.scratch import build_scratch_model, scratch_tokenizer  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def episode(i: int, n: int) -> Sample:
    """A tool episode whose length grows with `n`: a call, its result, a final answer."""
    msgs = [{"role": "user", "content": f"Q{i}: " + "add these numbers please. " * n}]
    call = {"name": "calculator", "arguments": json.dumps({"expression": "1+" * n + "1"})}
    traj = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": call}],
        },
        {"role": "tool", "content": str(n + 1)},
        {"role": "assistant", "content": f"The answer is {n + 1}."},
    ]
    return Sample(f"e{i}", msgs, msgs, "", json.dumps(traj), 1.0, 1.0, trajectory=traj, tools=TOOLS)


@pytest.fixture(scope="module")
def tok():
    return scratch_tokenizer()


def tiny(tok):
    return build_scratch_model(
        tok, BackendConfig(scratch_layers=2, scratch_width=32, scratch_heads=2), seed=3
    )


def test_packed_micro_batches_bound_the_sum_of_the_longest_rows():
    from selftaught.weights.sft import micro_batches, packed_micro_batches

    lengths = [300, 120, 100, 90, 80, 70, 60, 50]
    # unpacked: rows x the longest (8 x 300, 4 x 300, 2 x 300 > 512): one row a micro-batch
    assert micro_batches(8, max(lengths), budget=512) == 8
    # packed: the two longest rows (420) fit one 512-token row, four (610) do not
    assert packed_micro_batches(8, lengths, budget=512) == 4
    assert packed_micro_batches(8, lengths, budget=10_000) == 1
    assert packed_micro_batches(6, [700] * 6, budget=512) == 6  # a row alone past the budget


@pytest.mark.parametrize(
    "budget",  # one micro-batch, and two splits of it (the last one split where it is tight)
    [pytest.param(100_000, marks=pytest.mark.slow), pytest.param(700, marks=pytest.mark.slow), 650],
)
def test_packing_trains_as_unpacked_on_no_padding(tok, monkeypatch, budget):
    """Episodes of different lengths, one optimizer step: unpacked, the collator pads each
    micro-batch to its longest row; packed, it computes on the episodes' tokens alone. The
    loss and the weights after the step are the same, the rows trained on are the ones
    `local_render` gives (the tool rendering path), and each episode attends to itself."""
    from selftaught.weights.sft import episode_tokens, local_render

    torch.set_num_threads(1)
    rows = [episode(i, n) for i, n in enumerate([1, 14, 4, 8])]
    expected = sorted(episode_tokens(tok, s, local_render(tok))["input_ids"] for s in rows)
    monkeypatch.setattr(sft_mod, "MICRO_BATCH_TOKENS", budget)
    seen: list[tuple[list[list[int]], dict]] = []

    class Spy(sft_mod.CountingCollator):
        def __call__(self, examples):
            batch = super().__call__(examples)
            seen.append(([list(e["input_ids"]) for e in examples], batch))
            return batch

    monkeypatch.setattr(sft_mod, "CountingCollator", Spy)
    stats, weights = {}, {}
    for packing in (False, True):
        seen.clear()
        model = tiny(tok)
        cfg = SFTTrainConfig(  # fp32: the same weights to 1e-6 (bf16 autocast rounds per layout)
            epochs=1,
            batch_size=4,
            learning_rate=1e-2,
            warmup_ratio=0.0,
            packing=packing,
            bf16=False,
        )
        stats[packing] = sft_mod.sft_train(model, tok, rows, cfg, backend="scratch", progress=False)
        weights[packing] = {k: v.detach().clone() for k, v in model.named_parameters()}
        assert sorted(ids for examples, _ in seen for ids in examples) == expected
        if packing:
            for examples, batch in seen:  # one row; positions restart at each episode
                assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 1
                starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist()
                assert len(starts) == len(examples)
    unpacked, packed = stats[False], stats[True]
    assert unpacked["steps"] == packed["steps"] == 1
    assert packed["train_loss"] == pytest.approx(unpacked["train_loss"], rel=1e-5)
    # 1e-5: a thousandth of one Adam step at lr 1e-2; the micro-batches' summing order moves a
    # weight whose gradient is near zero by ~2e-6 (seen on torch 2.13 / trl 1.16), a wrong
    # packing by the whole step
    assert all(
        torch.allclose(weights[False][k], weights[True][k], atol=1e-5) for k in weights[True]
    )
    start = tiny(tok).model.embed_tokens.weight
    assert not torch.equal(weights[True]["model.embed_tokens.weight"], start)  # it trained
    real = sum(len(ids) for ids in expected)  # episodes of 241, 262, 290 and 334 tokens
    assert packed["pad_tokens"] == 0 and packed["tokens"] == real and packed["pad_share"] == 0
    assert unpacked["tokens"] == real + unpacked["pad_tokens"]
    parts = (unpacked["micro_batches"], packed["micro_batches"])
    if budget == 650:  # today's tool-episode case: one unpadded row per micro-batch already
        assert parts == (4, 2) and unpacked["pad_tokens"] == 0
    else:  # rows padded to their micro-batch's longest: the whole batch, or pairs
        assert parts == ((1, 1) if budget > real else (2, 2))
        assert unpacked["pad_tokens"] > 0 and unpacked["pad_share"] > 0


def test_packing_is_refused_where_attention_crosses_packed_rows(tok, monkeypatch):
    """Without the block-diagonal mask transformers builds from restarting position ids,
    the second of two packed rows attends to the first: training packed would be wrong."""
    from transformers import masking_utils

    from selftaught.weights.sft import check_packing_isolates

    model = tiny(tok)
    check_packing_isolates(model)  # sdpa on a CPU keeps packed rows apart
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda positions: None)
    with pytest.raises(ConfigError, match="does not keep packed rows apart"):
        check_packing_isolates(model)
    cfg = SFTTrainConfig(epochs=1, batch_size=2, packing=True)
    with pytest.raises(ConfigError, match="--packing"):
        sft_mod.sft_train(model, tok, [episode(0, 1), episode(1, 2)], cfg, backend="scratch")
