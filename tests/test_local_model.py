"""The in-process local model on the real embedded SmolLM2-135M-Instruct: chat template,
greedy determinism, truncation, stop strings, batching of concurrent calls, k samples per
prompt, and clear errors for bad paths."""

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
    model = LocalModel(max_batch_size=8)
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
def test_chat_template_reaches_generate(local: LocalModel, monkeypatch):
    seen: list[list[int]] = []
    real_generate = local.model.generate

    def spy(*args, **kwargs):
        seen.extend(kwargs["input_ids"].tolist())
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(local.model, "generate", spy)
    messages = ask("Say hi.")
    completion = local.chat(messages, GenerationParams(max_tokens=3))

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


@needs_model
@pytest.mark.slow
def test_concurrent_calls_are_batched_and_match_sequential(local: LocalModel):
    params = GenerationParams(max_tokens=12)
    sequential = [local.chat(ask(q), params).text for q in QUESTIONS]

    async def concurrently():
        return await asyncio.gather(*(local.achat(ask(q), params) for q in QUESTIONS))

    calls_before = local.generate_calls
    batched = asyncio.run(concurrently())
    assert [c.text for c in batched] == sequential
    assert local.generate_calls - calls_before < len(QUESTIONS)
    assert max(c.extra["batch_size"] for c in batched) > 1

    # A fresh event loop (what `run_sync` does on every call) works too.
    again = asyncio.run(local.achat(ask(QUESTIONS[0]), params))
    assert again.text == sequential[0]


@needs_model
@pytest.mark.slow
def test_generate_batch_samples_k_per_prompt_reproducibly(local: LocalModel):
    params = GenerationParams(max_tokens=10, temperature=1.0, seed=7)
    prompts = [ask(q) for q in QUESTIONS[:2]]
    calls_before = local.generate_calls
    samples = local.generate_batch(prompts, params, num_return_sequences=3)
    assert local.generate_calls - calls_before == 1
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


# ---------------------------------------------------------------------------------------
# The batching worker, with generation replaced by a recorder (no model needed, fast).


class RecordingLocalModel(LocalModel):
    """A LocalModel whose `generate` step only records each batch and echoes the prompts."""

    def __init__(self, **kwargs):
        super().__init__(None, **kwargs)
        self.batches: list[list[tuple[str, GenerationParams]]] = []
        self.fail_next: Exception | None = None
        self.delay_s = 0.05

    def _ensure_loaded(self) -> None:
        pass

    def _reject_overlong(self, requests):
        return requests

    def _generate(self, conversations, params, num_return_sequences, started, row_params=None):
        import time

        time.sleep(self.delay_s)  # let more requests queue up meanwhile
        rows = row_params or [params] * len(conversations)
        self.batches.append(
            [(c[-1]["content"], p) for c, p in zip(conversations, rows, strict=True)]
        )
        self.generate_calls += 1
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err
        return [
            [Completion(text=f"re: {c[-1]['content']}", model=self.name)] for c in conversations
        ]


def test_worker_batches_up_to_max_and_routes_replies():
    model = RecordingLocalModel(max_batch_size=4, batch_wait_ms=50)
    params = GenerationParams(max_tokens=5)

    async def main():
        return await asyncio.gather(*(model.achat(ask(f"q{i}"), params) for i in range(6)))

    replies = asyncio.run(main())
    assert [r.text for r in replies] == [f"re: q{i}" for i in range(6)]
    assert sorted(len(b) for b in model.batches) == [2, 4]
    assert replies[0].extra["batch_size"] in (2, 4)
    model.close()


def test_worker_never_mixes_incompatible_params():
    model = RecordingLocalModel(max_batch_size=8, batch_wait_ms=50)
    requests = [
        ("a", GenerationParams(max_tokens=5)),
        ("b", GenerationParams(max_tokens=9)),
        ("c", GenerationParams(max_tokens=5, stop=["x"])),  # stop is applied per row
        ("d", GenerationParams(max_tokens=5, temperature=0.7, seed=1)),
        ("e", GenerationParams(max_tokens=5, temperature=0.7, seed=1)),
        ("f", GenerationParams(max_tokens=5, temperature=0.7)),
        ("g", GenerationParams(max_tokens=5, temperature=0.7)),
    ]

    async def main():
        return await asyncio.gather(*(model.achat(ask(q), p) for q, p in requests))

    replies = asyncio.run(main())
    assert [r.text for r in replies] == [f"re: {q}" for q, _ in requests]
    groups = sorted(sorted(q for q, _ in batch) for batch in model.batches)
    # Greedy a+c share a batch, b (other max_tokens) runs alone, seeded samples run alone,
    # unseeded samples with equal settings share one.
    assert groups == [["a", "c"], ["b"], ["d"], ["e"], ["f", "g"]]
    batch_of_c = next(b for b in model.batches if any(q == "c" for q, _ in b))
    assert dict(batch_of_c)["c"].stop == ["x"]
    model.close()


def test_worker_reports_generation_errors_and_keeps_serving():
    model = RecordingLocalModel(max_batch_size=4, batch_wait_ms=20)
    model.fail_next = RuntimeError("kaboom")
    params = GenerationParams(max_tokens=5)

    async def main():
        return await asyncio.gather(
            *(model.achat(ask(f"q{i}"), params) for i in range(2)), return_exceptions=True
        )

    errors = asyncio.run(main())
    assert all(isinstance(e, FatalBackendError) and "kaboom" in str(e) for e in errors)
    assert model.chat(ask("again"), params).text == "re: again"
    model.close()


def test_worker_survives_fresh_event_loops_and_close():
    model = RecordingLocalModel(batch_wait_ms=1)
    params = GenerationParams(max_tokens=5)
    for i in range(3):  # what `run_sync` does: a new loop per call
        assert asyncio.run(model.achat(ask(f"q{i}"), params)).text == f"re: q{i}"
    model.close()
    assert model.chat(ask("after close"), params).text == "re: after close"
    model.close()


def test_cancelled_requests_are_skipped():
    model = RecordingLocalModel(max_batch_size=1, batch_wait_ms=0)
    model.delay_s = 0.3
    params = GenerationParams(max_tokens=5)

    async def main():
        first = asyncio.ensure_future(model.achat(ask("slow"), params))
        await asyncio.sleep(0.05)  # the worker is busy with "slow"
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(model.achat(ask("given up"), params), 0.05)
        return await first

    assert asyncio.run(main()).text == "re: slow"
    assert model.chat(ask("next"), params).text == "re: next"
    contents = [q for batch in model.batches for q, _ in batch]
    assert "given up" not in contents
    model.close()


def test_unused_model_is_freed_and_its_worker_stops():
    import gc
    import weakref

    model = RecordingLocalModel(batch_wait_ms=1)
    model.chat(ask("hi"), GenerationParams(max_tokens=5))
    worker = model._worker
    assert worker is not None and worker.is_alive()
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
    worker.join(timeout=5)
    assert not worker.is_alive()


def test_file_that_is_not_a_model_is_a_fatal_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SELFTAUGHT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(FatalBackendError, match="neither a transformers model folder"):
        LocalModel(str(tmp_path / "weights.bin"))
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file")
    model = LocalModel(str(tmp_path / "broken.gguf"))  # GGUF conversion is lazy
    with pytest.raises(FatalBackendError, match="GGUF"):
        _ = model.model
