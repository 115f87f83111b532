"""The local model's three parts, each used alone: the scheduler answers requests for a model
that is not a `LocalModel` (and keeps no reference to it), the prompt format renders a chat
with tools from a tokenizer (no weights), and the weights report their identity and
fingerprint without loading anything or starting to serve."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest

from selftaught.models import Completion, FatalBackendError, GenerationParams
from selftaught.models.batching import GenSequence
from selftaught.models.local import LocalModel
from selftaught.models.local_prompts import ChatFormat
from selftaught.models.local_scheduler import RequestScheduler
from selftaught.models.local_weights import LocalWeights
from tests.test_local_worker import ScriptedBatcher, ScriptedLocalModel, ask, name_of

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}


# ---------------------------------------------------------------------- the scheduler


class EchoModel:
    """Not a LocalModel: the smallest model a scheduler serves (scripted tokens, replies)."""

    name = "echo"
    max_batch_size = 2

    def __init__(self) -> None:
        self.engine = ScriptedBatcher()
        self.engine.delay_s = 0.0

    def _ensure_batcher(self) -> ScriptedBatcher:
        return self.engine

    def _encode(self, messages, params=None) -> list[int]:
        return [1, 2, 3]

    def _context_length(self) -> int | None:
        return None

    def _completion(self, seq: GenSequence, prompt_tokens: int) -> Completion:
        return Completion(
            text=f"echo: {name_of(seq)}",
            prompt_tokens=prompt_tokens,
            completion_tokens=len(seq.tokens),
            finish_reason=seq.finish_reason or "length",
            model=self.name,
        )


def test_the_scheduler_serves_a_model_that_is_not_a_local_model():
    model, scheduler = EchoModel(), RequestScheduler(batch_wait_ms=20)
    caps = {"a": 1, "b": 4, "c": 2}

    async def main():
        requests = [
            scheduler.submit(model, ask(q), GenerationParams(max_tokens=n), 1)
            for q, n in caps.items()
        ]
        return await asyncio.gather(*(asyncio.wrap_future(r.future) for r in requests))

    replies = asyncio.run(main())
    assert [r[0].text for r in replies] == [f"echo: {q}" for q in caps]
    assert [r[0].completion_tokens for r in replies] == list(caps.values())
    assert next(e for e in model.engine.log if e[0] == "admit")[1] == ["a", "b"]  # two slots
    assert scheduler.batcher is model.engine and scheduler.drivers == {}
    assert not hasattr(scheduler, "model")  # the model is an argument, never kept


def test_a_dropped_local_model_is_freed_without_the_cycle_collector():
    """No reference cycle between the facade and its parts: the weights of a model nobody
    holds go as soon as its last reference does, not at the next full collection."""
    model = ScriptedLocalModel(batch_wait_ms=1)
    assert model.chat(ask("hi"), GenerationParams(max_tokens=2)).text == "re: hi"
    ref = weakref.ref(model)
    gc.collect()
    gc.disable()
    try:
        del model
        assert ref() is None
    finally:
        gc.enable()


# ---------------------------------------------------------------------- the prompt format


def test_a_tokenizer_without_a_chat_template_is_refused_with_the_models_name():
    bare = SimpleNamespace(chat_template=None, eos_token_id=0)
    with pytest.raises(FatalBackendError, match="local:base has no chat template"):
        ChatFormat(bare, name="local:base")
    templated = ChatFormat(bare, chat_template="{{ messages }}")  # given: it is used
    assert bare.chat_template == "{{ messages }}" and templated.eos_ids == [0]


def _embedded_tokenizer():
    pytest.importorskip("transformers")
    from tests.test_local_engine import load_tokenizer

    return load_tokenizer()


def test_the_chat_format_renders_a_chat_with_tools_from_a_tokenizer_alone():
    tokenizer = _embedded_tokenizer()
    chat = ChatFormat(tokenizer)
    question = ask("What is 2 + 3?")
    offer = GenerationParams(tools=[ADD], tool_choice="required")
    prompt = chat.text(question, offer)
    assert json.dumps(ADD) in prompt  # SmolLM2's template has no tools section: the fallback
    assert "You must answer with at least one tool call." in prompt
    assert prompt.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    ids = chat.encode(question, offer)
    assert ids == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    # a LocalModel around the same tokenizer shows the model exactly this text
    stand_in = SimpleNamespace(config=SimpleNamespace(_name_or_path="smol"))
    assert LocalModel(model=stand_in, tokenizer=tokenizer).format_prompt(question, offer) == prompt
    # a finished sequence's reply: the end-of-turn token is not text, but it counts
    eos = chat.eos_ids[0]
    reply = tokenizer("Five.", add_special_tokens=False)["input_ids"]
    seq = GenSequence(owner=None, index=0, prompt_ids=ids, max_new_tokens=8)
    seq.tokens, seq.finish_reason = [*reply, eos], "stop"
    done = chat.completion(seq, len(ids), "local:smol")
    assert (done.text, done.completion_tokens, done.prompt_tokens) == (
        "Five.",
        len(reply) + 1,
        len(ids),
    )
    assert done.model == "local:smol" and done.finish_reason == "stop"


# ---------------------------------------------------------------------- the weights


def test_the_weights_report_identity_and_fingerprint_without_loading(tmp_path: Path):
    tokenizer = _embedded_tokenizer()
    torch = pytest.importorskip("torch")
    from tests.test_local_engine import save_tiny, tiny_model

    folder = save_tiny(tokenizer, tmp_path / "tiny", seed=0)
    weights = LocalWeights(str(folder))
    assert (weights.name, weights.spec, weights.path.name) == (
        "local:tiny",
        f"local:{folder}",
        "tiny",
    )
    fingerprint = weights.fingerprint
    assert fingerprint.startswith("local:files:")
    assert weights.model is None and weights.chat is None  # the files were hashed, not loaded
    assert LocalModel(str(folder)).fingerprint == fingerprint
    weights.load()
    assert weights.context_length() == 512 and tokenizer.eos_token_id in weights.chat_format.eos_ids
    weights.unload()
    assert weights.model is None and not weights.closed  # a folder loads again

    model = tiny_model(tokenizer)
    held = LocalWeights(model=model, tokenizer=tokenizer, name="policy")
    assert held.spec is None and held.name == "policy"
    before = held.fingerprint
    assert before.startswith("local:module:") and held.fingerprint == before
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # a training step, in place
    assert held.fingerprint != before
    held.unload()
    assert held.closed
    with pytest.raises(FatalBackendError, match="was closed"):
        held.load()
