"""n completions per prompt as one call (`achat_n`) on every backend: the default (n
concurrent calls with derived seeds), the usage ledger and the response cache around it, and
OpenAI's `n` against a real HTTP server that honours it, rejects it (llama.cpp) or ignores it."""

from __future__ import annotations

import asyncio
import random

import pytest

from selftaught.models import GenerationParams, TrackedModel, UsageLedger
from selftaught.models.base import AsyncChatModel, Completion, derive_seed
from selftaught.models.cache import CachedModel, ResponseCache
from selftaught.models.errors import FatalBackendError, RetryPolicy
from selftaught.models.openai_compat import OpenAICompatModel
from tests.fault_server import FaultServer

MSGS = [{"role": "user", "content": "Pick a number."}]
FAST = RetryPolicy(max_retries=2, base_delay_s=0.01, max_delay_s=0.02)


class SeededModel(AsyncChatModel):
    """Replies with a number drawn from the call's seed (random when unseeded)."""

    name = "seeded"

    def __init__(self) -> None:
        self.calls: list[GenerationParams] = []

    async def achat(self, messages, params):
        self.calls.append(params)
        rng = random.Random(params.seed)
        return Completion(text=str(rng.randrange(10**9)), prompt_tokens=5, completion_tokens=2)


def test_default_achat_n_is_n_calls_with_derived_seeds():
    model = SeededModel()
    params = GenerationParams(temperature=1.0, seed=42)
    first = asyncio.run(model.achat_n(MSGS, params, 4))
    again = asyncio.run(model.achat_n(MSGS, params, 4))
    assert len(first) == 4 and len(model.calls) == 8
    assert [c.text for c in first] == [c.text for c in again]
    assert len({c.text for c in first}) == 4
    assert [p.seed for p in model.calls[:4]] == [derive_seed(42, i) for i in range(4)]
    assert model.calls[0].seed == 42  # sample 0 is the plain seeded call
    # Neighbouring seeds share no sample (seed+i would make seed 43's first = seed 42's second).
    assert not {derive_seed(43, i) for i in range(4)} & {derive_seed(42, i) for i in range(4)}
    unseeded = asyncio.run(model.achat_n(MSGS, GenerationParams(temperature=1.0), 3))
    assert all(p.seed is None for p in model.calls[8:]) and len(unseeded) == 3
    with pytest.raises(ValueError, match="n must be"):
        asyncio.run(model.achat_n(MSGS, params, 0))


def test_tracked_model_charges_a_shared_prompt_once():
    class SharedPrompt(AsyncChatModel):
        name = "gpt-4o-mini"

        async def achat_n(self, messages, params, n):
            out = [
                Completion(text=f"s{i}", prompt_tokens=100, completion_tokens=10) for i in range(n)
            ]
            for c in out[1:]:
                c.extra["prompt_shared"] = True
            return out

    ledger = UsageLedger()
    tracked = TrackedModel(SharedPrompt(), ledger, "target")
    assert len(asyncio.run(tracked.achat_n(MSGS, GenerationParams(temperature=1), 3))) == 3
    usage = ledger.roles["target"]
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (1, 100, 30)
    assert usage.usd == pytest.approx((100 * 0.15 + 30 * 0.60) / 1e6)
    # Without a shared prompt (the default: n separate calls) each call is charged.
    ledger2 = UsageLedger()
    asyncio.run(TrackedModel(SeededModel(), ledger2, "t").achat_n(MSGS, GenerationParams(), 3))
    assert (ledger2.roles["t"].calls, ledger2.roles["t"].prompt_tokens) == (3, 15)


def test_cache_serves_greedy_n_as_one_call_and_passes_samples_through(tmp_path):
    inner = SeededModel()
    cached = CachedModel(inner, ResponseCache(tmp_path / "c.sqlite"))
    greedy = GenerationParams(max_tokens=5, seed=1)
    replies = asyncio.run(cached.achat_n(MSGS, greedy, 3))
    assert len(inner.calls) == 1 and len({c.text for c in replies}) == 1
    assert [c.cached for c in replies] == [False, True, True]
    again = asyncio.run(cached.achat_n(MSGS, greedy, 2))
    assert len(inner.calls) == 1 and all(c.cached for c in again)
    sampled = asyncio.run(cached.achat_n(MSGS, GenerationParams(temperature=1.0, seed=3), 3))
    assert len(inner.calls) == 4 and not any(c.cached for c in sampled)


def test_cache_keys_on_the_fingerprint_not_the_name(tmp_path):
    class Named(AsyncChatModel):
        def __init__(self, weights: str, reply: str):
            self.name, self._weights, self.reply = "local:best", weights, reply

        @property
        def fingerprint(self):
            return self._weights

        async def achat(self, messages, params):
            return Completion(text=self.reply)

    path = tmp_path / "c.sqlite"
    first = CachedModel(Named("w1", "from round 1"), ResponseCache(path))
    second = CachedModel(Named("w2", "from round 2"), ResponseCache(path))
    assert first.chat(MSGS, GenerationParams()).text == "from round 1"
    assert second.chat(MSGS, GenerationParams()).text == "from round 2"
    tracked = TrackedModel(Named("w1", "ignored"), UsageLedger(), "target")
    hit = CachedModel(tracked, ResponseCache(path)).chat(MSGS, GenerationParams())
    assert hit.cached and hit.text == "from round 1"  # the fingerprint passes through wrappers


# ---------------------------------------------------------------------------------------
# OpenAI's `n` on a real HTTP server


def make(server: FaultServer) -> OpenAICompatModel:
    return OpenAICompatModel("fake-model", base_url=server.base_url, retry=FAST, timeout_s=2)


def numbered(messages):
    numbered.count += 1
    return f"reply {numbered.count}"


numbered.count = 0


def test_openai_n_is_one_request():
    with FaultServer(numbered, n_mode="support") as server:
        model = make(server)
        replies = asyncio.run(model.achat_n(MSGS, GenerationParams(temperature=1.0, seed=5), 3))
        assert model.fingerprint == f"{server.base_url}#fake-model"
    assert len(replies) == 3 and len({c.text for c in replies}) == 3
    assert [r.get("n") for r in server.requests] == [3]
    assert server.requests[0]["seed"] == 5
    # usage covers the request: the prompt is charged once, output split over the choices
    assert [bool(c.extra.get("prompt_shared")) for c in replies] == [False, True, True]
    assert sum(c.completion_tokens for c in replies) == 2 * 3


def test_openai_n_rejected_like_llama_cpp_falls_back_to_single_calls():
    with FaultServer(numbered, n_mode="reject") as server:
        model = make(server)
        params = GenerationParams(temperature=1.0, seed=5)
        replies = asyncio.run(model.achat_n(MSGS, params, 3))
        later = asyncio.run(model.achat_n(MSGS, params, 2))
    assert len(replies) == 3 and len(later) == 2
    ns = [r.get("n") for r in server.requests]
    assert ns == [3, None, None, None, None, None]  # one refusal, not retried, never again
    seeds = [r["seed"] for r in server.requests[1:4]]  # concurrent: in any order
    assert sorted(seeds) == sorted(derive_seed(5, i) for i in range(3))


def test_openai_n_ignored_or_empty_choices_are_topped_up():
    with FaultServer(numbered, n_mode="ignore") as server:
        replies = asyncio.run(make(server).achat_n(MSGS, GenerationParams(temperature=1.0), 3))
    assert len(replies) == 3 and len({c.text for c in replies}) == 3
    assert [r.get("n") for r in server.requests] == [3, None, None]


def test_openai_n_other_errors_still_fail():
    with FaultServer(n_mode="support", models=("other",)) as server:
        with pytest.raises(FatalBackendError, match="not served"):
            asyncio.run(make(server).achat_n(MSGS, GenerationParams(temperature=1.0), 2))
