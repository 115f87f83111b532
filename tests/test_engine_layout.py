"""Chunked prefill and compaction in the continuous batcher (issue 53): on a tiny random Llama
with the embedded model's tokenizer (and once on the embedded SmolLM2), both settings give
token for token what the batcher gives without them, for a mixed batch (short and long prompts
joining at different steps, rows ending at different steps, a cached prefix, seeded samples);
compaction shrinks the cache to its longest live row and chunked prefill bounds the tokens of
a prefill forward while the running rows keep decoding."""

from __future__ import annotations

import asyncio
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from selftaught.errors import ConfigError  # noqa: E402
from selftaught.models import FatalBackendError, GenerationParams  # noqa: E402
from selftaught.models.batching import ContinuousBatcher, GenSequence  # noqa: E402
from selftaught.models.local import LocalModel  # noqa: E402
from tests.test_local_engine import (  # noqa: E402
    MIXED,
    load_tokenizer,
    needs_tokenizer,
    reference_greedy,
    tiny_model,
)
from tests.test_local_model import needs_model as needs_embedded  # noqa: E402

SKILL = list(range(1000, 1060))  # a 60-token prefix several prompts share (a skill)
SETTINGS = [
    {"prefill_chunk": 32},
    {"prefill_chunk": 7},  # two columns a chunk for three rows, the last chunk shorter
    {"compact_at": 0.1},
    {"prefill_chunk": 48, "compact_at": 0.1},
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model(tokenizer, context=1024)


def mixed_sequences() -> list[GenSequence]:
    """Prompts of 5 to 260 tokens, most behind the shared skill, caps from 2 to 20, and a
    prompt sampled three times with seeded generators (temperature 1)."""
    lengths = (200, 3, 40, 7, 120, 2, 60)
    prompts = [SKILL + list(range(5, 5 + n)) for n in lengths]
    prompts += [list(range(300, 420)), list(range(7, 12))]
    caps = [2, 15, 6, 20, 4, 9, 12, 5, 18]
    seqs = [GenSequence(i, 0, p, c) for i, (p, c) in enumerate(zip(prompts, caps, strict=True))]
    sampled = SKILL + [17, 18, 19]
    seqs += [
        GenSequence(
            "sampled",
            k,
            sampled,
            10,
            temperature=1.0,
            generator=torch.Generator().manual_seed(100 + k),
        )
        for k in range(3)
    ]
    return seqs


def refill_loop(batcher: ContinuousBatcher, sequences: list[GenSequence], slots: int):
    """`slots` sequences in flight at a time, a free slot refilled at once (what the
    scheduler does): each sequence's tokens, and the cache's width after every step."""
    waiting, done, widths = list(sequences), {}, []
    while waiting or batcher.in_flight:
        free = slots - len(batcher.in_flight)
        newcomers, waiting = waiting[:free], waiting[free:]
        finished = batcher.admit(newcomers) + batcher.step()
        widths.append(batcher.width)
        done.update({(s.owner, s.index): list(s.tokens) for s in finished})
    return [done[(s.owner, s.index)] for s in sequences], widths


def greedy_ids(model, prompt: list[int], n: int) -> list[int]:
    """Unbatched greedy `generate` of `n` tokens after the token ids `prompt`."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def batcher_for(model, tokenizer, **settings) -> ContinuousBatcher:
    return ContinuousBatcher(model, [-1], 0, tokenizer.decode, **settings)  # no EOS: caps end rows


@pytest.fixture(scope="module")
def plain(model, tokenizer):
    """The mixed batch through the batcher with both settings off: its tokens and stats."""
    batcher = batcher_for(model, tokenizer)
    tokens, _ = refill_loop(batcher, mixed_sequences(), slots=3)
    return tokens, batcher.stats


@needs_tokenizer
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(map(str, s.values())))
def test_the_layout_settings_decode_the_same_tokens(model, tokenizer, plain, settings):
    expected, plain_stats = plain
    assert plain_stats.prefix_hits >= 2  # the shared skill was reused

    batcher = batcher_for(model, tokenizer, **settings)
    tokens, widths = refill_loop(batcher, mixed_sequences(), slots=3)
    assert tokens == expected
    assert len(set(map(tuple, tokens[-3:]))) == 3  # the seeded samples differ from each other
    stats = batcher.stats
    assert stats.admitted == plain_stats.admitted == 12
    assert stats.prefix_hits == plain_stats.prefix_hits
    chunk = settings.get("prefill_chunk")
    if chunk is None:
        assert stats.prefill_chunks == 0 and stats.max_prefill_tokens > 200
    else:  # at least one column a chunk: at most max(chunk, rows) tokens
        assert 0 < stats.max_prefill_tokens <= max(chunk, 3)
        assert stats.prefill_chunks > plain_stats.prefill_calls
    if settings.get("compact_at"):
        assert stats.compactions >= 1 and stats.compacted_columns > 100
        assert stats.decode_columns < plain_stats.decode_columns
    else:
        assert stats.compactions == 0


@needs_tokenizer
def test_compaction_shrinks_the_cache_to_its_longest_live_row(model, tokenizer):
    """Two prompts behind one cached prefix: the short one holds a hole of padding between
    the prefix and its rest ([prefix | padding | rest]). When the long one leaves, the
    leading crop cannot remove that hole; compaction does."""
    long_prompt = SKILL + list(range(5, 205))
    short_prompt = SKILL + [500, 501, 502, 503, 504]
    widths, tokens = {}, {}
    for compact in (None, 0.5):
        batcher = batcher_for(model, tokenizer, compact_at=compact)
        short = GenSequence("short", 0, short_prompt, 6)
        batcher.admit([GenSequence("long", 0, long_prompt, 2), short])
        assert batcher.stats.prefix_hits == 2 and batcher.width == len(long_prompt)
        batcher.step()  # the long row ends (2 tokens)
        assert [s.owner for s in batcher.rows] == ["short"]
        widths[compact] = batcher.width
        while batcher.rows:
            batcher.step()
        tokens[compact] = short.tokens
        stats = batcher.stats
    assert widths[None] == len(long_prompt) + 1  # the hole stayed
    assert widths[0.5] == len(short_prompt) + 1  # the row's own tokens, nothing else
    assert stats.compactions == 1 and stats.compacted_columns == 195
    assert tokens[0.5] == tokens[None] == greedy_ids(model, short_prompt, 6)


@needs_tokenizer
def test_chunked_prefill_bounds_a_forward_and_running_rows_keep_decoding(model, tokenizer):
    batcher = batcher_for(model, tokenizer, prefill_chunk=64, prefix_cache_mb=0)
    running = GenSequence("running", 0, list(range(5, 25)), 30)
    assert batcher.admit([running]) == []  # queued: prefilled by the next step
    assert batcher.rows == [] and batcher.in_flight == [running]
    batcher.step()  # one chunk (20 tokens), then it joins and decodes
    assert len(running.tokens) == 2
    newcomer = GenSequence("newcomer", 0, list(range(30, 330)), 4)
    batcher.admit([newcomer])
    joined_at = None
    for step in range(1, 10):
        batcher.step()
        assert len(running.tokens) == 2 + step  # never stalled
        if newcomer in batcher.rows:
            joined_at = step
            break
    assert joined_at == 5  # 300 tokens in chunks of 64
    stats = batcher.stats
    assert stats.max_prefill_tokens == 64 and stats.prefill_chunks == 6
    assert stats.prefill_calls == 2 and stats.prefilled_tokens == 320
    while batcher.rows:
        batcher.step()
    for seq in (running, newcomer):
        assert seq.tokens == greedy_ids(model, seq.prompt_ids, seq.max_new_tokens)


@needs_tokenizer
def test_an_abandoned_admission_is_dropped_before_it_joins(model, tokenizer):
    batcher = batcher_for(model, tokenizer, prefill_chunk=16)
    a, b = GenSequence("a", 0, list(range(5, 105)), 3), GenSequence("b", 0, [7, 8, 9], 3)
    batcher.admit([a])
    batcher.admit([b])
    batcher.step()
    assert batcher.drop(lambda s: s.owner == "a") == [a]
    assert batcher.in_flight == [b]
    while batcher.in_flight:
        batcher.step()
    assert len(b.tokens) == 3 and not a.tokens
    batcher.admit([GenSequence("c", 0, [1, 2, 3], 2)])
    batcher.reset()
    assert batcher.in_flight == []


@needs_tokenizer
def test_the_engine_with_both_settings_gives_the_same_replies(model, tokenizer):
    """Through LocalModel and its scheduler (requests arriving together, slots refilled):
    greedy replies equal unbatched greedy `generate`, and seeded samples equal the ones the
    engine gives with both settings off."""
    params = GenerationParams(max_tokens=6, temperature=1.0, seed=3)

    async def main(local: LocalModel):
        greedy = asyncio.gather(*(local.achat(m, GenerationParams(max_tokens=n)) for m, n in MIXED))
        sampled = local.achat_n(MIXED[2][0], params, 3)
        return await asyncio.gather(greedy, sampled)

    replies = {}
    for name, settings in {"off": {}, "on": {"prefill_chunk": 24, "compact_at": 0.05}}.items():
        local = LocalModel.from_pretrained_model(
            model, tokenizer, max_batch_size=3, batch_wait_ms=50, **settings
        )
        replies[name] = asyncio.run(main(local))
        stats = local.stats
        local.close()
    assert stats.prefill_chunks > len(MIXED) and stats.max_prefill_tokens <= 24
    greedy, sampled = replies["on"]
    for (messages, cap), reply in zip(MIXED, greedy, strict=True):
        expected = reference_greedy(model, tokenizer, messages, cap)
        assert reply.text == tokenizer.decode(expected, skip_special_tokens=True)
    assert [c.text for c in sampled] == [c.text for c in replies["off"][1]]
    assert len({c.text for c in sampled}) == 3


@needs_tokenizer
def test_a_failed_chunk_fails_its_request_and_the_engine_serves_on(model, tokenizer):
    local = LocalModel.from_pretrained_model(model, tokenizer, prefill_chunk=8)
    batcher = local._ensure_batcher()
    forward, calls = batcher._forward, []

    def failing_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return forward(*args, **kwargs)

    batcher._forward = failing_third
    question = [{"role": "user", "content": "Tell me about the sea, the sky and the hills."}]
    with pytest.raises(FatalBackendError, match="boom"):
        local.chat(question, GenerationParams(max_tokens=3))
    assert batcher.in_flight == [] and len(calls) == 3  # failed mid-prefill, then forgotten
    reply = local.chat(question, GenerationParams(max_tokens=3))
    local.close()
    assert reply.completion_tokens == 3
    assert reply.text == tokenizer.decode(
        reference_greedy(model, tokenizer, question, 3), skip_special_tokens=True
    )


def test_the_settings_are_checked():
    for bad in ({"prefill_chunk": 0}, {"compact_at": 0}, {"compact_at": 1.5}):
        with pytest.raises(ConfigError):
            LocalModel(**bad)
    with pytest.raises(ConfigError, match="prefill_chunk"):
        ContinuousBatcher(object(), [0], 0, str, prefill_chunk=-4)


def test_packing_a_cache_layer_keeps_the_chosen_columns_in_order():
    from selftaught.models.batching import _growing_layer

    layer = _growing_layer()()
    keys = torch.randn((2, 3, 10, 4), generator=torch.Generator().manual_seed(0))
    layer.update(keys, keys + 1)
    index = torch.tensor([[0, 0, 7, 8, 9], [1, 4, 5, 6, 9]])
    layer.pack(index)
    expected = torch.stack([keys[0, :, [0, 0, 7, 8, 9]], keys[1, :, [1, 4, 5, 6, 9]]])
    assert torch.equal(layer.keys, expected) and torch.equal(layer.values, expected + 1)
    step = torch.randn((2, 3, 1, 4))
    out, _ = layer.update(step, step)  # grows into its spare columns
    assert out.shape[2] == 6 and torch.equal(out[:, :, -1:], step)


@needs_embedded
@pytest.mark.slow  # the layouts' equivalence is tested fast on the tiny model; this is the 135M
def test_the_layout_settings_decode_the_same_tokens_on_the_embedded_model():
    """SmolLM2-135M (logits much closer than the random model's): a ~300-token shared system
    prompt, six questions, three rows at a time; chunked prefill and compaction on give the
    tokens the batcher gives with them off."""
    local = LocalModel(max_batch_size=3, dtype="float32")  # exact in float32, not in bf16
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
    systems = [skill, skill, "", skill, "Be brief.", skill]
    prompts = [
        local._encode(
            ([{"role": "system", "content": s}] if s else []) + [{"role": "user", "content": q}]
        )
        for s, q in zip(systems, questions, strict=True)
    ]
    caps = [12, 20, 16, 24, 10, 18]
    model, tokenizer = local.model, local.tokenizer

    def run(**settings):
        batcher = ContinuousBatcher(
            model, local._eos_ids, tokenizer.pad_token_id, tokenizer.decode, **settings
        )
        seqs = [GenSequence(i, 0, p, c) for i, (p, c) in enumerate(zip(prompts, caps, strict=True))]
        return refill_loop(batcher, seqs, slots=3)[0], batcher.stats

    expected, _ = run()
    tokens, stats = run(prefill_chunk=64, compact_at=0.05)
    local.close()
    assert tokens == expected
    assert stats.prefill_chunks > len(prompts) and stats.max_prefill_tokens <= 64
