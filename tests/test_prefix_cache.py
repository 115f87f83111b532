"""Prefix reuse in the local engine: the LRU itself (longest match, byte bound, invalidation),
the batcher reusing a cached prefix across batches and idle periods, rows of one prefill
starting from different prefixes, the cache dropped when the weights or the active adapter
change, and (on the real embedded SmolLM2) greedy replies token for token the same with and
without reuse."""

from __future__ import annotations

import asyncio
import os
import random

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from selftaught.models import GenerationParams  # noqa: E402
from selftaught.models.batching import (  # noqa: E402
    ContinuousBatcher,
    GenSequence,
    longest_shared_prefixes,
)
from selftaught.models.local import LocalModel  # noqa: E402
from selftaught.models.prefix_cache import (  # noqa: E402
    PrefixCache,
    common_prefix_len,
    model_state,
)
from tests.test_local_engine import (  # noqa: E402
    greedy_tokens,
    load_tokenizer,
    needs_tokenizer,
    reference_greedy,
    tiny_model,
)
from tests.test_local_model import needs_model as needs_embedded  # noqa: E402
from tests.test_local_tools import ADD  # noqa: E402

# ---------------------------------------------------------------------- the LRU alone


def kv(n: int, layers: int = 2, value: float = 0.0) -> list[tuple[object, object]]:
    """Keys/values of an n-token prefix: 2 layers of [1, 1, n, 4] float32 (32 bytes a token
    a layer for keys and values together)."""
    return [(torch.full((1, 1, n, 2), value), torch.full((1, 1, n, 2), value))] * layers


def test_common_prefix_len_matches_a_plain_loop():
    rng = random.Random(0)
    for _ in range(300):
        a = tuple(rng.choice((1, 2)) for _ in range(rng.randint(0, 40)))
        b = tuple(rng.choice((1, 2)) for _ in range(rng.randint(0, 40)))
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix_len(a, b) == n


def test_the_longest_shared_prefixes_are_found_among_sorted_neighbours():
    """Each prompt compared with its neighbours in sorted order only: the longest prefix it
    shares with any other prompt or recent one, as comparing it with all of them gives."""
    rng = random.Random(1)
    for _ in range(100):
        pool = list(
            {tuple(rng.choice((1, 2, 3)) for _ in range(rng.randint(1, 12))) for _ in range(9)}
        )
        prompts, others = pool[: len(pool) // 2 + 1], pool[len(pool) // 2 + 1 :]
        expected = [
            max((common_prefix_len(p, q) for q in pool if q != p), default=0) for p in prompts
        ]
        assert longest_shared_prefixes(prompts, others) == expected
    assert longest_shared_prefixes([(1, 2)]) == [0]


def test_match_gives_the_longest_cached_head_within_the_limit():
    cache = PrefixCache(max_bytes=10_000)
    cache.put((1, 2, 3), kv(3))
    cache.put((1, 2, 9, 9, 9), kv(5))
    assert cache.match((1, 2, 9, 9, 9, 7))[0] == 5
    n, entry = cache.match((1, 2, 3, 4))
    assert n == 3 and entry is not None and entry.tokens == (1, 2, 3)
    assert cache.match((1, 2, 9, 9, 9), limit=4)[0] == 4  # a prompt keeps a token to prefill
    assert cache.match((1, 2, 9, 9), limit=3)[0] == 3
    keys, _ = cache.match((1, 2, 9, 9, 9, 7), limit=4)[1].head(4)[0]
    assert keys.shape == (1, 1, 4, 2)  # the head is cut to what the prompt shares
    assert cache.match((5, 6)) == (0, None)


def test_the_byte_bound_drops_the_least_recently_used():
    cache = PrefixCache(max_bytes=3 * 10 * 32)  # three 10-token entries
    for first in (1, 2, 3):
        cache.put((first,) * 10, kv(10))
    cache.match((1,) * 11)  # entry 1 is now the most recently used
    cache.put((4,) * 10, kv(10))
    assert cache.match((2,) * 11)[0] == 0  # 2 was the least recently used: dropped
    assert all(cache.match((t,) * 11)[0] == 10 for t in (1, 3, 4))
    assert cache.nbytes <= cache.max_bytes and cache.evictions == 1
    big = cache.put((5,) * 40, kv(40))  # larger than the whole cache: used once, not kept
    assert big.nbytes > cache.max_bytes and cache.match((5,) * 41)[0] == 0
    assert len(cache) == 3


def test_a_longer_prefix_replaces_its_heads():
    cache = PrefixCache(max_bytes=10_000)
    cache.put((1, 2, 3), kv(3))
    cache.put((1, 2, 3, 4, 5), kv(5))
    assert len(cache) == 1 and cache.nbytes == 5 * 32
    assert cache.match((1, 2, 3, 8))[0] == 3  # served by the longer entry's head


def test_sync_clears_the_cache_when_the_state_changes():
    cache = PrefixCache(max_bytes=10_000)
    cache.sync("weights v1")
    cache.put((1, 2, 3), kv(3))
    cache.sync("weights v1")
    assert len(cache) == 1
    cache.sync("weights v2")
    assert len(cache) == 0 and cache.nbytes == 0 and cache.invalidations == 1


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(max_bytes=-1)


# ---------------------------------------------------------------------- the engine, tiny model


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def conversation(skill: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": skill}, {"role": "user", "content": question}]


SKILL_A = "Rules: add carefully, check every digit, answer with the number only. " * 10
SKILL_B = "Rules: think about units first, then convert, then answer in words. " * 8


def answer_all(local: LocalModel, conversations, caps) -> list[str]:
    async def main():
        return await asyncio.gather(
            *(
                local.achat(m, GenerationParams(max_tokens=n))
                for m, n in zip(conversations, caps, strict=True)
            )
        )

    return [r.text for r in asyncio.run(main())]


@needs_tokenizer
def test_a_cached_skill_is_reused_by_the_next_batch(tokenizer):
    """The second busy period prefills only the questions: the skill's KV outlived the first
    batch, and the replies are still those of unbatched greedy decoding."""
    model = tiny_model(tokenizer, context=1024)
    local = LocalModel.from_pretrained_model(model, tokenizer, max_batch_size=3)
    first = [conversation(SKILL_A, f"What is {i} + {i}?") for i in range(3)]
    second = [conversation(SKILL_A, f"How much is {i} times {i + 2}?") for i in range(4)]
    answer_all(local, first, [4, 5, 6])
    builds, prefilled = local.stats.prefix_builds, local.stats.prefilled_tokens
    texts = answer_all(local, second, [3, 6, 4, 5])
    stats = local.stats
    local.close()
    for messages, cap, text in zip(second, [3, 6, 4, 5], texts, strict=True):
        expected = reference_greedy(model, tokenizer, messages, cap)
        assert text == tokenizer.decode(expected, skip_special_tokens=True)
    skill_tokens = len(tokenizer(SKILL_A, add_special_tokens=False)["input_ids"])
    assert stats.prefix_builds == builds  # nothing recomputed for the second batch
    assert stats.prefilled_tokens - prefilled < 4 * 30  # only each question's own tokens
    assert stats.prefix_tokens_reused >= 4 * skill_tokens


@needs_tokenizer
def test_rows_of_one_prefill_may_start_from_different_prefixes(tokenizer):
    """Two skills (and a prompt sharing only the template's header) admitted together:
    each row continues its own cached prefix, with the same replies as unbatched decoding."""
    model = tiny_model(tokenizer, seed=1, context=1024)
    local = LocalModel.from_pretrained_model(model, tokenizer, max_batch_size=8, batch_wait_ms=50)
    answer_all(
        local, [conversation(SKILL_A, "warm up a"), conversation(SKILL_B, "warm up b")], [2, 2]
    )
    mixed = [
        conversation(SKILL_A, "What is 3 + 4?"),
        conversation(SKILL_B, "How many meters in a mile?"),
        [{"role": "user", "content": "Hello there, who are you?"}],
        conversation(SKILL_B, "Convert 3 feet."),
        conversation(SKILL_A, "What is 10 + 12?"),
    ]
    caps = [5, 7, 3, 6, 4]
    calls = local.stats.prefill_calls
    texts = answer_all(local, mixed, caps)
    stats = local.stats
    local.close()
    assert stats.prefill_calls - calls == 1  # one forward for all five, different heads
    for messages, cap, text in zip(mixed, caps, texts, strict=True):
        expected = reference_greedy(model, tokenizer, messages, cap)
        assert text == tokenizer.decode(expected, skip_special_tokens=True)


@needs_tokenizer
def test_changed_weights_drop_the_cached_prefixes(tokenizer):
    """A training step between busy periods (an in-place update of the parameters): the next
    replies are the new weights' own, not continuations of stale keys and values."""
    model = tiny_model(tokenizer, seed=2, context=1024)
    local = LocalModel.from_pretrained_model(model, tokenizer, max_batch_size=2)
    prompts = [conversation(SKILL_A, f"What is {i} + 1?") for i in range(2)]
    answer_all(local, prompts, [3, 3])
    assert len(local._batcher.prefix_cache) >= 1
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.9).add_(0.05)  # in place, as an optimizer step is
    texts = answer_all(local, prompts, [5, 5])
    cache = local._batcher.prefix_cache
    local.close()
    assert cache.invalidations == 1
    for messages, text in zip(prompts, texts, strict=True):
        expected = reference_greedy(model, tokenizer, messages, 5)
        assert text == tokenizer.decode(expected, skip_special_tokens=True)


@needs_tokenizer
def test_switching_a_peft_adapter_off_changes_the_model_state(tokenizer):
    peft = pytest.importorskip("peft")
    model = tiny_model(tokenizer, seed=3, context=1024)
    wrapped = peft.get_peft_model(
        model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    before = model_state(wrapped)
    with wrapped.disable_adapter():
        off = model_state(wrapped)
    assert off != before
    assert model_state(wrapped) == before


@needs_tokenizer
def test_replies_carry_their_time_to_first_token(tokenizer):
    local = LocalModel.from_pretrained_model(tiny_model(tokenizer, context=1024), tokenizer)
    reply = local.chat(conversation(SKILL_A, "What is 2 + 2?"), GenerationParams(max_tokens=8))
    local.close()
    assert 0 < reply.extra["ttft_s"] < reply.latency_s


def greedy_on_text(model, tokenizer, text: str, max_tokens: int) -> str:
    return tokenizer.decode(
        greedy_tokens(model, tokenizer, text, max_tokens), skip_special_tokens=True
    )


@needs_tokenizer
def test_an_episodes_next_turn_prefills_only_what_is_new(tokenizer):
    """A turn offered tools keeps its conversation's keys and values when it ends: the next
    turn (that conversation, the call and its result) reuses them, and its reply is still
    exactly unbatched greedy decoding's."""
    model = tiny_model(tokenizer, seed=5, context=1024)
    local = LocalModel.from_pretrained_model(model, tokenizer, max_batch_size=2)
    params = GenerationParams(max_tokens=6, tools=[ADD])
    first = conversation(SKILL_A, "What is 1200 + 3400? Use the tool.")
    reply = local.chat(first, params)
    second = first + [
        {"role": "assistant", "content": reply.text},
        {"role": "tool", "tool_call_id": "call_0", "content": "4600"},
    ]
    reused_before = local.stats.prefix_tokens_reused
    again = local.chat(second, params)
    reused = local.stats.prefix_tokens_reused - reused_before
    assert local.stats.replies_cached >= 1
    assert reused >= again.prompt_tokens - 40  # only the tool turn's tokens were computed
    assert again.text == greedy_on_text(model, tokenizer, local.format_prompt(second, params), 6)
    assert reply.text == greedy_on_text(model, tokenizer, local.format_prompt(first, params), 6)
    local.close()


@needs_tokenizer
def test_the_cache_stays_within_its_bound(tokenizer):
    """Many different long skills through a small cache: it never holds more than its
    bound, the oldest are dropped, and the replies stay exact."""
    model = tiny_model(tokenizer, seed=4, context=1024)
    batcher = ContinuousBatcher(
        model,
        [tokenizer.eos_token_id],
        tokenizer.eos_token_id,
        tokenizer.decode,
        prefix_cache_mb=0.05,  # 52 KB: ~100 tokens of this model's keys and values
    )
    for k in range(6):
        skill = f"Skill number {k}: " + "be precise and brief. " * 6
        prompts = [
            tokenizer.apply_chat_template(
                conversation(skill, q), add_generation_prompt=True, tokenize=True
            )
            for q in ("Say one.", "Say two, please.")
        ]
        if not isinstance(prompts[0], list):
            prompts = [p["input_ids"] for p in prompts]
        seqs = [
            GenSequence(owner=None, index=0, prompt_ids=list(p), max_new_tokens=3) for p in prompts
        ]
        batcher.admit(seqs)
        while batcher.rows:
            batcher.step()
        cache = batcher.prefix_cache
        assert cache.nbytes <= cache.max_bytes
    assert batcher.stats.prefix_builds >= 6 and cache.evictions >= 1
    assert len(cache) < 6


# ---------------------------------------------------------------------- the embedded model


@needs_embedded
@pytest.mark.slow  # test_kv_pool's embedded-model check decodes through the same prefix path
def test_prefix_reuse_gives_the_same_greedy_replies_on_the_embedded_model():
    """SmolLM2-135M, a ~300-token shared system prompt, 6 questions of different lengths and
    caps, 3 rows at a time (slots refilled as rows finish): with prefix reuse and without,
    the same tokens (batcher) and the same replies (the whole engine)."""
    skill = (
        "You are a careful calculator. Rules: read the whole question; write the operation "
        "you will do; do it digit by digit; check the result by doing the inverse operation; "
        "answer with the number on its own line. "
    ) * 6
    questions = [
        "What is 12 + 7?",
        "Compute 45 - 19.",
        "What is 6 times 7? Explain briefly.",
        "Add 100 and 250, then subtract 75.",
        "Is 17 a prime number?",
        "What is half of 98?",
    ]
    caps = [12, 20, 16, 24, 10, 18]
    conversations = [conversation(skill, q) for q in questions]
    with_reuse = LocalModel(max_batch_size=3, batch_wait_ms=50)
    model, tokenizer = with_reuse.model, with_reuse.tokenizer
    prompts = [with_reuse._encode(m) for m in conversations]
    tokens = {}
    for mb in (0, 64):
        batcher = ContinuousBatcher(
            model, with_reuse._eos_ids, tokenizer.pad_token_id, tokenizer.decode, prefix_cache_mb=mb
        )
        tokens[mb] = refill_loop(batcher, prompts, caps, slots=3)
        reused = batcher.stats.prefix_tokens_reused
    assert tokens[64] == tokens[0]
    assert reused > 5 * 250  # the skill was computed about once

    without = LocalModel.from_pretrained_model(
        model, tokenizer, max_batch_size=3, prefix_cache_mb=0
    )
    replies = {
        "reuse": _replies(with_reuse, conversations, caps),
        "none": _replies(without, conversations, caps),
    }
    stats = with_reuse.stats
    with_reuse.close()
    without.close()
    assert [r.text for r in replies["reuse"]] == [r.text for r in replies["none"]]
    assert [r.completion_tokens for r in replies["reuse"]] == [
        r.completion_tokens for r in replies["none"]
    ]
    assert stats.prefix_tokens_reused > 5 * 250
    assert without.stats.prefix_tokens_reused == 0


def refill_loop(batcher: ContinuousBatcher, prompts, caps, slots: int) -> list[list[int]]:
    """Greedy generation `slots` rows at a time, a finished row's slot refilled at once (what
    the engine does): each prompt's generated tokens."""
    waiting = [
        GenSequence(owner=i, index=0, prompt_ids=list(p), max_new_tokens=n)
        for i, (p, n) in enumerate(zip(prompts, caps, strict=True))
    ]
    done: dict[int, list[int]] = {}
    while waiting or batcher.rows:
        free = slots - len(batcher.rows)
        newcomers, waiting = waiting[:free], waiting[free:]
        finished = batcher.admit(newcomers) + batcher.step()
        done.update({s.owner: s.tokens for s in finished})
    return [done[i] for i in range(len(prompts))]


def _replies(local: LocalModel, conversations, caps):
    async def main():
        return await asyncio.gather(
            *(
                local.achat(m, GenerationParams(max_tokens=n))
                for m, n in zip(conversations, caps, strict=True)
            )
        )

    return asyncio.run(main())


@needs_tokenizer
def test_a_caller_answered_joins_the_next_step(tokenizer, monkeypatch):
    """Rollout-like callers (C at a time, the next one starting when one is answered): the
    newcomer reaches the inbox before the next decode step, so no step runs a row short
    until the last replies drain."""
    import selftaught.models.local as local_module

    def one_row_steps(turns: int) -> int:
        monkeypatch.setattr(local_module, "_FOLLOW_UP_TURNS", turns)
        local = LocalModel.from_pretrained_model(
            tiny_model(tokenizer, context=1024), tokenizer, max_batch_size=2
        )
        caps = [3, 9, 3, 3, 3, 9]

        async def main():
            gate = asyncio.Semaphore(2)

            async def one(i: int, cap: int):
                async with gate:
                    return await local.achat(
                        conversation(SKILL_A, f"Question {i}?"), GenerationParams(max_tokens=cap)
                    )

            await asyncio.gather(*(one(i, c) for i, c in enumerate(caps)))

        asyncio.run(main())
        local.close()
        return local.stats.decode_rows.get(1, 0)

    turns = local_module._FOLLOW_UP_TURNS
    assert one_row_steps(0) > one_row_steps(turns)


def test_growing_cache_layer_holds_what_concatenation_would():
    """The engine's cache layer (spare columns instead of a copy per step) through updates,
    growth past its spare room, row selection with a crop, and stacking with another."""
    from selftaught.models.batching import _growing_layer

    gen = torch.Generator().manual_seed(0)

    def rand(rows: int, cols: int):
        return torch.randn((rows, 2, cols, 4), generator=gen)

    layer, keys = _growing_layer()(), None
    for cols in (5, 1, 1, 100, 1):  # 100 outgrows the first buffer's spare columns
        k = rand(3, cols)
        out, _ = layer.update(k, k + 1)
        keys = k if keys is None else torch.cat([keys, k], dim=2)
        assert torch.equal(out, keys) and torch.equal(layer.values, keys + 1)
    assert layer.get_seq_length() == keys.shape[2] == 108
    index = torch.tensor([2, 0])
    layer.select(index, crop=3)
    keys = keys[index, :, 3:]
    assert torch.equal(layer.keys, keys) and torch.equal(layer.values, keys + 1)
    other = _growing_layer()()
    theirs = rand(1, 40)
    other.update(theirs, theirs + 1)
    layer.stack(other, 0, keys.shape[2] - 40)
    padded = torch.cat([torch.zeros((1, 2, keys.shape[2] - 40, 4)), theirs], dim=2)
    assert torch.equal(layer.keys, torch.cat([keys, padded]))
    assert torch.equal(layer.values[2:, :, -40:], theirs + 1)
    step = rand(3, 1)
    out, _ = layer.update(step, step)
    assert torch.equal(out[:, :, -1:], step) and out.shape[2] == keys.shape[2] + 1
