"""The local engine on a tiny random Llama with the embedded model's tokenizer (fast): greedy
continuous batching equals unbatched greedy `generate` with refills happening, the context
clamp, in-memory models (peft-wrapped, in train mode) and letting go of them, weight
fingerprints and the response cache, and the device choice."""

from __future__ import annotations

import asyncio
import gc
import os
import weakref
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from selftaught.models import FatalBackendError, GenerationParams, load_model  # noqa: E402
from selftaught.models import embedded as embedded_module  # noqa: E402
from selftaught.models.cache import CachedModel, ResponseCache  # noqa: E402
from selftaught.models.device import resolve_device, resolve_dtype  # noqa: E402
from selftaught.models.local import LocalModel  # noqa: E402


def ask(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def _tokenizer_dir() -> Path | None:
    folder = embedded_module.cache_root() / "models" / embedded_module.EMBEDDED_NAME
    if folder.exists():
        return folder
    try:
        return embedded_module.embedded_model_dir()
    except embedded_module.EmbeddedModelMissing:
        return None


TOKENIZER_DIR = _tokenizer_dir()
needs_tokenizer = pytest.mark.skipif(TOKENIZER_DIR is None, reason="embedded model not installed")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def load_tokenizer():
    """The embedded model's tokenizer (the test skips without it)."""
    if TOKENIZER_DIR is None:
        pytest.skip("embedded model not installed")
    return transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def tiny_model(tokenizer, seed: int = 0, context: int = 512):
    """A 2-layer random Llama over the real tokenizer: it never says EOS on purpose, so
    replies run to their caps and every token is a chance for batching to diverge."""
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    generator = torch.Generator().manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    return model.eval()


def reference_greedy(model, tokenizer, messages, max_tokens: int) -> list[int]:
    """Unbatched greedy `generate`, one prompt, no padding: the tokens batching must equal."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return greedy_tokens(model, tokenizer, text, max_tokens)


def greedy_tokens(model, tokenizer, text: str, max_tokens: int) -> list[int]:
    """Unbatched greedy `generate` on a rendered prompt: the reply's token ids."""
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=[tokenizer.eos_token_id],
            pad_token_id=tokenizer.eos_token_id,
        )
    return out[0, ids.shape[1] :].tolist()


# Prompts of very different lengths (one with a long system prompt) and caps, so that rows
# finish at different steps and newcomers are merged into a running, padded batch.
MIXED = [
    ([{"role": "system", "content": "You are terse. " * 60}, *ask("Hi")], 5),
    (ask("What is 2+2?"), 17),
    (ask("Tell me a long story about a dragon who loved arithmetic."), 9),
    (ask("x"), 23),
    (ask("Name three colors, then three animals, then three countries."), 3),
    (ask("Why?"), 12),
]


@needs_tokenizer
def test_continuous_batching_equals_unbatched_greedy_with_refills(tokenizer):
    model = tiny_model(tokenizer)
    local = LocalModel.from_pretrained_model(model, tokenizer, max_batch_size=3, batch_wait_ms=50)

    async def main():
        return await asyncio.gather(
            *(local.achat(m, GenerationParams(max_tokens=n)) for m, n in MIXED)
        )

    replies = asyncio.run(main())
    stats = local.stats
    local.close()
    for (messages, cap), reply in zip(MIXED, replies, strict=True):
        expected = reference_greedy(model, tokenizer, messages, cap)
        assert len(expected) == cap  # the random model runs to its cap
        assert reply.text == tokenizer.decode(expected, skip_special_tokens=True)
        assert reply.completion_tokens == cap and reply.finish_reason == "length"
    assert stats.max_rows == 3
    assert stats.refills >= 2  # slots were refilled while other rows were running
    assert stats.prefix_builds >= 1  # the chat template's default system prompt is shared
    assert stats.decode_steps < sum(n for _, n in MIXED)  # rows shared steps


@needs_tokenizer
def test_a_shared_skill_is_prefilled_once(tokenizer):
    """Prompts under one long system prompt (a skill) prefill only their own part after
    the first, and still decode exactly what unbatched greedy decoding gives."""
    model = tiny_model(tokenizer)
    skill = "Rules: add carefully, check every digit, answer with the number only. " * 12
    questions = [ask(f"What is {i} + {2 * i}?") for i in range(7)]
    conversations = [[{"role": "system", "content": skill}, *q] for q in questions]
    local = LocalModel.from_pretrained_model(model, tokenizer, max_batch_size=2)

    async def main():
        return await asyncio.gather(
            *(
                local.achat(m, GenerationParams(max_tokens=4 + i))
                for i, m in enumerate(conversations)
            )
        )

    replies = asyncio.run(main())
    stats = local.stats
    local.close()
    for i, (messages, reply) in enumerate(zip(conversations, replies, strict=True)):
        expected = reference_greedy(model, tokenizer, messages, 4 + i)
        assert reply.text == tokenizer.decode(expected, skip_special_tokens=True)
    prompt_tokens = sum(r.prompt_tokens for r in replies)
    assert stats.prefilled_tokens < prompt_tokens / 3  # the skill was computed about once


@needs_tokenizer
def test_cache_stays_as_wide_as_its_longest_live_row(tokenizer):
    from selftaught.models.batching import ContinuousBatcher, GenSequence

    model = tiny_model(tokenizer)
    batcher = ContinuousBatcher(model, [tokenizer.eos_token_id], 0, tokenizer.decode)
    long_prompt, short_prompt = list(range(5, 305)), list(range(5, 15))
    batcher.admit(
        [GenSequence("long", 0, long_prompt, 2), GenSequence("short", 0, short_prompt, 6)]
    )
    assert batcher.width == 300
    batcher.step()  # the long row ends here (2 tokens): its padding columns go with it
    assert [s.owner for s in batcher.rows] == ["short"]
    assert batcher.width == len(short_prompt) + 1


@needs_tokenizer
def test_token_cap_is_clamped_to_the_context(tokenizer):
    model = tiny_model(tokenizer, context=64)
    local = LocalModel.from_pretrained_model(model, tokenizer)
    reply = local.chat(ask("Count."), GenerationParams(max_tokens=500))
    local.close()
    assert reply.finish_reason == "length"
    assert reply.prompt_tokens + reply.completion_tokens == 64


@needs_tokenizer
@pytest.mark.parametrize("kv", ["pool", "dynamic"])
def test_a_model_in_train_mode_decodes_in_eval_mode_switched_once_a_busy_period(tokenizer, kv):
    """A trainer's model (train mode) is switched to eval mode at the prefill, stays in it
    through the decode steps (switching walks every module: not once a step), and is back in
    train mode when the batch is idle, before the replies are handed over. Its replies are
    the eval-mode reference's."""
    model = tiny_model(tokenizer).train()
    switches: list[bool] = []
    train = model.train

    def counting(mode: bool = True):
        switches.append(mode)
        return train(mode)

    model.train = counting  # model.eval() calls it too
    local = LocalModel.from_pretrained_model(model, tokenizer, max_batch_size=2, kv=kv)
    seen: list[bool] = []

    async def main():
        async def watch():
            while len(seen) < 200 and not all(t.done() for t in tasks):
                seen.append(model.training)
                await asyncio.sleep(0)

        tasks = [
            asyncio.create_task(local.achat(ask(q), GenerationParams(max_tokens=12)))
            for q in ("What is 2+2?", "Name a color.")
        ]
        await watch()
        return await asyncio.gather(*tasks), model.training

    local._ensure_batcher()  # (the KV pool's probe of the model's keys switches too)
    switches.clear()
    replies, training_at_reply = asyncio.run(main())
    local.close()
    stats = local.stats
    assert training_at_reply and model.training
    assert stats.decode_steps >= 11
    prefills = stats.prefill_calls + stats.prefix_builds  # each switches the whole tree
    assert switches == [False] * prefills + [True]  # no switch at a decode step
    assert False in seen  # in eval mode while it decoded
    del model.train
    for q, reply in zip(("What is 2+2?", "Name a color."), replies, strict=True):
        expected = reference_greedy(model.eval(), tokenizer, ask(q), 12)
        assert reply.text == tokenizer.decode(expected, skip_special_tokens=True)


@needs_tokenizer
def test_in_memory_model_in_train_mode_is_restored(tokenizer):
    model = tiny_model(tokenizer).train()
    tokenizer_state = (tokenizer.padding_side, tokenizer.pad_token, tokenizer.chat_template)
    local = LocalModel.from_pretrained_model(model, tokenizer, name="local:trainee")
    reply = local.chat(ask("What is 2+2?"), GenerationParams(max_tokens=6))
    assert model.training  # back in train mode for the trainer
    assert reply.model == "local:trainee"
    expected = reference_greedy(model.eval(), tokenizer, ask("What is 2+2?"), 6)
    assert reply.text == tokenizer.decode(expected, skip_special_tokens=True)
    # The trainer's tokenizer is used as it is, not reconfigured.
    assert (tokenizer.padding_side, tokenizer.pad_token, tokenizer.chat_template) == (
        tokenizer_state
    )


@needs_tokenizer
def test_peft_wrapped_model_generates_with_its_adapter(tokenizer):
    peft = pytest.importorskip("peft")
    base = tiny_model(tokenizer)
    question = ask("Say something.")
    params = GenerationParams(max_tokens=8)
    plain = LocalModel.from_pretrained_model(base, tokenizer)
    base_reply, base_print = plain.chat(question, params).text, plain.fingerprint
    plain.close()

    wrapped = peft.get_peft_model(
        base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_alpha=8)
    )
    fresh = LocalModel.from_pretrained_model(wrapped, tokenizer)
    # LoRA starts as a no-op (B = 0): same reply; but the weights differ (adapters exist).
    assert fresh.chat(question, params).text == base_reply
    assert fresh.fingerprint != base_print
    fresh.close()

    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 2)
    trained = LocalModel.from_pretrained_model(wrapped, tokenizer)
    expected = reference_greedy(wrapped, tokenizer, question, 8)
    reply = trained.chat(question, params).text
    assert reply == tokenizer.decode(expected, skip_special_tokens=True)
    assert reply != base_reply
    trained.close()


@needs_tokenizer
def test_close_lets_go_of_an_in_memory_model(tokenizer):
    model = tiny_model(tokenizer)
    local = LocalModel.from_pretrained_model(model, tokenizer)
    local.chat(ask("hi"), GenerationParams(max_tokens=3))
    ref = weakref.ref(model)
    local.close()
    del model
    gc.collect()
    assert ref() is None
    with pytest.raises(FatalBackendError, match="closed"):
        local.chat(ask("hi"), GenerationParams(max_tokens=3))


@needs_tokenizer
def test_seeded_samples_do_not_touch_the_global_rng(tokenizer):
    local = LocalModel.from_pretrained_model(tiny_model(tokenizer), tokenizer)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    params = GenerationParams(max_tokens=5, temperature=1.0, seed=9)
    first = asyncio.run(local.achat_n(ask("Pick."), params, 3))
    assert torch.equal(torch.rand(3), expected)
    again = asyncio.run(local.achat_n(ask("Pick."), params, 3))
    unseeded = local.chat(ask("Pick."), GenerationParams(max_tokens=5, temperature=1.0))
    local.close()
    assert [c.text for c in first] == [c.text for c in again]
    assert len({c.text for c in first}) == 3
    assert unseeded.completion_tokens == 5


def test_wrapping_needs_model_and_tokenizer_together():
    with pytest.raises(ValueError, match="both model= and tokenizer="):
        LocalModel(model=object())
    with pytest.raises(ValueError, match="either a path or an in-memory model"):
        LocalModel("somewhere", model=object(), tokenizer=object())


# ---------------------------------------------------------------------------------------
# Fingerprints and the response cache


def save_tiny(tokenizer, folder: Path, seed: int) -> Path:
    tiny_model(tokenizer, seed=seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@needs_tokenizer
def test_same_named_models_do_not_share_cache_entries(tokenizer, tmp_path):
    a = LocalModel(str(save_tiny(tokenizer, tmp_path / "a" / "best", seed=1)))
    b = LocalModel(str(save_tiny(tokenizer, tmp_path / "b" / "best", seed=2)))
    a_again = LocalModel(str(tmp_path / "a" / "best"))
    assert a.name == b.name == "local:best"
    assert a.fingerprint != b.fingerprint
    assert a.fingerprint == a_again.fingerprint

    question, params = ask("What is 2+2?"), GenerationParams(max_tokens=6)
    cache_file = tmp_path / "replies.sqlite"
    first = CachedModel(a, ResponseCache(cache_file)).chat(question, params)
    from_b = CachedModel(b, ResponseCache(cache_file)).chat(question, params)
    from_a = CachedModel(a_again, ResponseCache(cache_file)).chat(question, params)
    for m in (a, b, a_again):
        m.close()
    assert not first.cached and not from_b.cached
    assert from_b.text != first.text  # b answered itself, not from a's entry
    assert from_a.cached and from_a.text == first.text


@needs_tokenizer
def test_in_memory_fingerprint_follows_the_weights(tokenizer):
    model = tiny_model(tokenizer)
    local = LocalModel.from_pretrained_model(model, tokenizer)
    before = local.fingerprint
    assert LocalModel.from_pretrained_model(model, tokenizer).fingerprint == before
    assert local.fingerprint == before  # unchanged weights: the same, not recomputed
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.01)  # what an optimizer step does
    assert local.fingerprint != before
    assert LocalModel.from_pretrained_model(model, tokenizer).fingerprint == local.fingerprint


# ---------------------------------------------------------------------------------------
# The device


def test_resolve_device_defaults_to_what_this_machine_has(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device(None) == ("cpu", torch.float32)
    assert resolve_device("auto") == ("cpu", torch.float32)
    assert resolve_device("cpu") == ("cpu", torch.float32)
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="MPS is not available"):
        resolve_device("mps")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("gpu9")


def test_resolve_device_prefers_cuda_then_mps_with_half_precision(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_device(None) == ("cuda", torch.bfloat16)
    assert resolve_device("cuda:1") == ("cuda:1", torch.bfloat16)
    with pytest.raises(ValueError, match="only 2 CUDA"):
        resolve_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_device("cuda") == ("cuda", torch.float16)
    assert resolve_device("cpu") == ("cpu", torch.float32)  # an explicit choice wins
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device(None) == ("mps", torch.float16)


def test_resolve_dtype():
    assert resolve_dtype(None, torch.float16) is torch.float16
    assert resolve_dtype("bfloat16", torch.float32) is torch.bfloat16
    assert resolve_dtype(torch.float64, torch.float32) is torch.float64
    with pytest.raises(ValueError, match="unknown torch dtype"):
        resolve_dtype("float7", torch.float32)


@needs_tokenizer
def test_unavailable_device_is_a_fatal_error_naming_it(tokenizer, tmp_path, monkeypatch):
    folder = save_tiny(tokenizer, tmp_path / "m", seed=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = load_model(f"local:{folder}", device="cuda")
    with pytest.raises(FatalBackendError, match="CUDA is not available"):
        model.chat(ask("hi"), GenerationParams(max_tokens=2))
    on_cpu = load_model(f"local:{folder}", device="cpu")
    assert on_cpu.chat(ask("hi"), GenerationParams(max_tokens=2)).completion_tokens == 2
    from selftaught.models.device import inference_dtype

    # float32, or bfloat16 on a CPU with bf16 instructions (the per-CPU choice)
    assert on_cpu.model.dtype == inference_dtype("cpu") and on_cpu.max_batch_size == 8
    on_cpu.close()


@needs_tokenizer
def test_a_tiny_top_p_keeps_only_the_top_token(tokenizer):
    local = LocalModel.from_pretrained_model(tiny_model(tokenizer), tokenizer)
    question = ask("Continue.")
    greedy = local.chat(question, GenerationParams(max_tokens=10))
    nucleus = local.chat(question, GenerationParams(max_tokens=10, temperature=1.5, top_p=1e-6))
    hot = asyncio.run(
        local.achat_n(question, GenerationParams(max_tokens=10, temperature=1.5, seed=4), 2)
    )
    local.close()
    assert nucleus.text == greedy.text
    assert all(c.text != greedy.text for c in hot)  # a random model at T=1.5 wanders off
