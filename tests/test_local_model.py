"""The in-process local model on the real embedded SmolLM2-135M-Instruct: chat template,
greedy determinism, truncation, stop strings, continuous batching of concurrent calls (equal
to unbatched greedy decoding, refills included), n samples per prompt, an in-memory model,
and clear errors for bad paths. The serving loop's edge cases are in test_local_worker.py,
the engine on a tiny model in test_local_engine.py."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("transformers")

from selftaught.models import Completion, FatalBackendError, GenerationParams  # noqa: E402
from selftaught.models import embedded as embedded_module  # noqa: E402
from selftaught.models.local import LocalModel  # noqa: E402

QUESTIONS = [
    "What is 2+2?",
    "Name a color.",
    "Write one word: hello",
    "What is the capital of France? Answer in one word please.",
]


def ask(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def _embedded_available() -> bool:
    try:
        embedded_module.embedded_gguf_path()
    except embedded_module.EmbeddedModelMissing:
        return (embedded_module.cache_root() / "models" / embedded_module.EMBEDDED_NAME).exists()
    return True


needs_model = pytest.mark.skipif(not _embedded_available(), reason="embedded model not installed")


@pytest.fixture(scope="module")
def local() -> Iterator[LocalModel]:
    # float32: the batch-invariance these tests check is exact there (bf16 rounds differently
    # per batch layout; docs/local-engine-performance.md)
    model = LocalModel(max_batch_size=8, dtype="float32")
    _ = model.model  # load once for the module
    yield model
    model.close()


@needs_model
def test_greedy_reply_is_text_and_deterministic(local: LocalModel):
    params = GenerationParams(max_tokens=16, temperature=0.0)
    first = local.chat(ask("What is the capital of France?"), params)
    second = local.chat(ask("What is the capital of France?"), params)
    assert first.text.strip()
    assert first.text == second.text
    assert first.model == local.name == "local:SmolLM2-135M-Instruct"
    assert first.prompt_tokens > 0 and 0 < first.completion_tokens <= 16
    assert first.finish_reason in ("stop", "length")


@needs_model
def test_chat_template_reaches_the_model(local: LocalModel, monkeypatch):
    seen: list[list[int]] = []
    real_forward = local.model.forward

    def spy(*args, **kwargs):
        if kwargs["input_ids"].shape[1] > 1:  # the prefill, not a decode step
            seen.extend(kwargs["input_ids"].tolist())
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(local.model, "forward", spy)
    messages = ask("Say hi.")
    whole = LocalModel.from_pretrained_model(local.model, local.tokenizer, prefix_cache_mb=0)
    completion = whole.chat(messages, GenerationParams(max_tokens=3))  # one prefill, no reuse

    im_start = local.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert len(seen) == 1
    # ChatML: system (added by the template), user, and the assistant header.
    assert seen[0].count(im_start) == 3
    prompt = local.format_prompt(messages)
    assert prompt.startswith("<|im_start|>system") and prompt.endswith("<|im_start|>assistant\n")
    expected = local.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert seen[0] == expected
    assert completion.prompt_tokens == len(expected)


@needs_model
def test_truncation_is_reported(local: LocalModel):
    completion = local.chat(
        ask("Tell me a long story about a dragon."), GenerationParams(max_tokens=2)
    )
    assert completion.finish_reason == "length"
    assert completion.truncated
    assert completion.completion_tokens == 2


@needs_model
def test_stop_strings_trim_the_reply(local: LocalModel):
    params = GenerationParams(max_tokens=16)
    full = local.chat(ask("What is the capital of France?"), params).text
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    trimmed = local.chat(
        ask("What is the capital of France?"), GenerationParams(max_tokens=16, stop=[stop])
    )
    assert trimmed.text == full[: full.index(stop)]
    assert trimmed.finish_reason == "stop"
    # Generation ended at the stop string instead of running on to the end of the reply.
    assert (
        trimmed.completion_tokens
        < local.chat(ask("What is the capital of France?"), params).completion_tokens
    )


@needs_model
@pytest.mark.slow
def test_concurrent_calls_are_batched_and_match_sequential(local: LocalModel):
    params = GenerationParams(max_tokens=12)
    sequential = [local.chat(ask(q), params).text for q in QUESTIONS]

    async def concurrently():
        return await asyncio.gather(*(local.achat(ask(q), params) for q in QUESTIONS))

    prefills_before = local.stats.prefill_calls
    batched = asyncio.run(concurrently())
    assert [c.text for c in batched] == sequential
    assert local.stats.prefill_calls - prefills_before < len(QUESTIONS)
    assert local.stats.max_rows > 1

    # A fresh event loop (what `run_sync` does on every call) works too.
    again = asyncio.run(local.achat(ask(QUESTIONS[0]), params))
    assert again.text == sequential[0]


@needs_model
@pytest.mark.slow
def test_generate_batch_samples_k_per_prompt_reproducibly(local: LocalModel):
    params = GenerationParams(max_tokens=10, temperature=1.0, seed=7)
    prompts = [ask(q) for q in QUESTIONS[:2]]
    prefilled_before = local.stats.prefilled_prompts
    samples = local.generate_batch(prompts, params, num_return_sequences=3)
    assert local.stats.prefilled_prompts - prefilled_before == 2  # one prefill per prompt
    assert [len(row) for row in samples] == [3, 3]
    texts = [c.text for row in samples for c in row]
    assert len(set(texts)) > 1  # sampling, not greedy copies
    again = local.generate_batch(prompts, params, k=3)  # the Sampler protocol's spelling
    assert [c.text for row in again for c in row] == texts
    assert all(c.prompt_tokens > 0 and c.completion_tokens > 0 for row in samples for c in row)


@needs_model
def test_bad_params_are_rejected_before_generation(local: LocalModel):
    with pytest.raises(ValueError, match="max_tokens"):
        local.chat(ask("hi"), GenerationParams(max_tokens=0))
    with pytest.raises(ValueError, match="role"):
        local.chat([{"role": "robot", "content": "hi"}], GenerationParams(max_tokens=2))
    with pytest.raises(ValueError, match="num_return_sequences"):
        local.generate_batch([ask("hi")], GenerationParams(max_tokens=2), num_return_sequences=0)
    with pytest.raises(ValueError, match="n must be"):
        asyncio.run(local.achat_n(ask("hi"), GenerationParams(max_tokens=2), 0))


@needs_model
def test_a_prompt_longer_than_the_context_fails_alone(local: LocalModel):
    async def main():
        return await asyncio.gather(
            local.achat(ask("word " * 9000), GenerationParams(max_tokens=4)),
            local.achat(ask("Name a color."), GenerationParams(max_tokens=4)),
            return_exceptions=True,
        )

    too_long, fine = asyncio.run(main())
    assert isinstance(too_long, FatalBackendError) and "does not fit" in str(too_long)
    assert isinstance(fine, Completion) and fine.text.strip()


@needs_model
@pytest.mark.slow
def test_continuous_batching_equals_unbatched_greedy_on_the_real_model(local: LocalModel):
    """Prompts of very different lengths and caps through 3 slots: rows end at different
    steps and newcomers join a running batch, yet every reply is token for token what
    unbatched greedy `generate` gives."""
    import torch

    requests = [
        ([{"role": "system", "content": "Answer briefly. " * 40}, *ask("What is 7*6?")], 24),
        (ask("Hi"), 8),
        (ask("Tell me a long story about a dragon who loved arithmetic."), 48),
        (ask("Name a color."), 12),
        (ask("List three countries in Europe and their capitals, one per line."), 40),
        (ask("What is 2+2?"), 16),
    ]
    engine = LocalModel.from_pretrained_model(
        local.model, local.tokenizer, max_batch_size=3, batch_wait_ms=50
    )

    async def main():
        return await asyncio.gather(
            *(engine.achat(m, GenerationParams(max_tokens=n)) for m, n in requests)
        )

    replies = asyncio.run(main())
    stats = engine.stats
    engine.close()
    tok = local.tokenizer
    for (messages, cap), reply in zip(requests, replies, strict=True):
        text = local.format_prompt(messages)
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            out = local.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=cap,
                do_sample=False,
                eos_token_id=local._eos_ids,
                pad_token_id=tok.eos_token_id,
            )
        expected = out[0, ids.shape[1] :].tolist()
        ended = expected[-1] in local._eos_ids
        body = expected[:-1] if ended else expected
        assert reply.text == tok.decode(body, skip_special_tokens=True)
        assert reply.completion_tokens == len(expected)
        assert reply.finish_reason == ("stop" if ended else "length")
    assert stats.refills >= 2 and stats.max_rows == 3


@needs_model
def test_achat_n_shares_one_prefill_and_is_reproducible(local: LocalModel):
    params = GenerationParams(max_tokens=8, temperature=1.0, seed=11)
    question = ask("Name an animal.")
    prefilled_before = local.stats.prefilled_prompts
    samples = asyncio.run(local.achat_n(question, params, 3))
    assert local.stats.prefilled_prompts - prefilled_before == 1
    assert len(samples) == 3 and len({c.text for c in samples}) > 1
    assert all(c.prompt_tokens == samples[0].prompt_tokens > 0 for c in samples)

    async def beside_others():  # the same request in a batch with other requests
        return await asyncio.gather(
            local.achat(ask("What is 2+2?"), GenerationParams(max_tokens=6)),
            local.achat_n(question, params, 3),
            local.achat(ask("Say hello."), GenerationParams(max_tokens=9, temperature=0.7)),
        )

    _, again, _ = asyncio.run(beside_others())
    assert [c.text for c in again] == [c.text for c in samples]
    assert local.chat(question, params).text == samples[0].text  # sample 0 keeps the seed


@needs_model
def test_greedy_achat_n_is_one_sequence(local: LocalModel):
    admitted_before = local.stats.admitted
    replies = asyncio.run(local.achat_n(ask("What is 3+3?"), GenerationParams(max_tokens=8), 4))
    assert local.stats.admitted - admitted_before == 1
    assert len(replies) == 4 and len({c.text for c in replies}) == 1


@needs_model
def test_wrapping_the_loaded_model_answers_like_the_folder(local: LocalModel):
    question, params = ask("What is the capital of France?"), GenerationParams(max_tokens=12)
    local.model.train()  # as a trainer would leave it
    try:
        wrapped = LocalModel.from_pretrained_model(local.model, local.tokenizer)
        reply = wrapped.chat(question, params)
        assert local.model.training
    finally:
        local.model.eval()
    wrapped.close()
    assert reply.text == local.chat(question, params).text


def test_missing_path_is_a_fatal_error(tmp_path):
    with pytest.raises(FatalBackendError, match="does not exist"):
        LocalModel(str(tmp_path / "no-such-model"))


def test_folder_without_model_is_a_fatal_error(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FatalBackendError, match="config.json"):
        LocalModel(str(tmp_path))


def test_missing_embedded_model_names_the_install_command(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == embedded_module.EMBEDDED_PACKAGE:
            return None
        return real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(embedded_module.importlib.util, "find_spec", find_spec)
    monkeypatch.setenv("SELFTAUGHT_CACHE", str(tmp_path))  # no converted copy either
    model = LocalModel()
    with pytest.raises(FatalBackendError) as info:
        _ = model.path
    assert embedded_module.INSTALL_HINT in str(info.value)
    assert info.value.backend == "local"
    # Through the serving loop too: the caller gets the error, the worker does not hang.
    for _ in range(2):
        with pytest.raises(FatalBackendError, match="embedded model is not installed"):
            model.chat(ask("hi"), GenerationParams(max_tokens=2))
    model.close()


def test_file_that_is_not_a_model_is_a_fatal_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SELFTAUGHT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(FatalBackendError, match="neither a transformers model folder"):
        LocalModel(str(tmp_path / "weights.bin"))
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file")
    model = LocalModel(str(tmp_path / "broken.gguf"))  # GGUF conversion is lazy
    with pytest.raises(FatalBackendError, match="GGUF"):
        _ = model.model
