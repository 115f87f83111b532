"""The KV block pool (issue 67): blocks allocated once and given back when a row ends,
cached prefixes and a prompt's samples sharing blocks by reference, copy on write of a shared
partly filled block; the paged engine decoding token for token what the dense engine and
unbatched `generate` decode in float32 (a tiny random Llama, and the embedded SmolLM2: prompts
of different lengths, rows ending at different steps, a shared skill, seeded samples, chunked
prefill); a full pool making requests wait instead of failing; the layout setting."""

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
from selftaught.models.kv_pool import (  # noqa: E402
    KV_ENV,
    SLACK_BLOCKS,
    BlockTable,
    KVPool,
    KVPoolFull,
    KVShape,
    Reservation,
    default_pool_mb,
    kv_layout,
    kv_shape,
)
from selftaught.models.local import LocalModel  # noqa: E402
from selftaught.models.paged import PagedBatcher  # noqa: E402
from tests.test_engine_layout import SKILL, mixed_sequences, refill_loop  # noqa: E402
from tests.test_local_engine import (  # noqa: E402
    MIXED,
    load_tokenizer,
    needs_tokenizer,
    reference_greedy,
    tiny_model,
)
from tests.test_local_model import needs_model as needs_embedded  # noqa: E402

SHAPE = KVShape(layers=2, heads=1, dim=2, dtype=torch.float32, device=torch.device("cpu"))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model(tokenizer, context=1024)


def paged(model, tokenizer, **settings) -> PagedBatcher:
    settings.setdefault("pool_mb", 8)
    return PagedBatcher(model, [-1], 0, tokenizer.decode, **settings)  # no EOS: caps end rows


# ---------------------------------------------------------------------- the pool alone


def test_blocks_are_taken_lowest_first_and_go_back_when_released():
    pool = KVPool(SHAPE, blocks=4, block_tokens=2)
    table = BlockTable()
    pool.grow(table, 5, pool.reserve(3))  # 5 tokens: 3 blocks
    assert table.blocks == [2, 3, 4] and pool.in_use == 3 and pool.reserved == 0
    other = BlockTable()
    pool.grow(other, 2, Reservation())  # unreserved: the one free block
    assert other.blocks == [5] and pool.available == 0
    with pytest.raises(KVPoolFull):
        pool.grow(other, 3, Reservation())
    pool.release(table)
    assert pool.in_use == 1 and table.blocks == []
    again = BlockTable()
    pool.grow(again, 1, Reservation())
    assert again.blocks == [2]  # the lowest free block: the resident part stays small
    assert pool.peak == 4


def test_a_shared_partly_filled_block_is_copied_before_it_is_written():
    pool = KVPool(SHAPE, blocks=6, block_tokens=4)
    owner = BlockTable()
    pool.grow(owner, 6, Reservation())  # blocks [2, 3]: 4 + 2 tokens
    owner.length = 6
    with torch.inference_mode():
        pool.keys[:, 12:14] = 7.0  # the second block's two tokens
    head = pool.share(owner, 6)
    assert head.blocks == owner.blocks and pool.refs[2] == pool.refs[3] == 2
    pool.grow(head, 7, Reservation())  # writing its 7th token: its own copy of block 3
    assert head.blocks[0] == 2 and head.blocks[1] not in (2, 3)
    assert pool.refs[3] == 1 and pool.refs[2] == 2
    copy = head.blocks[1] * 4
    assert torch.equal(pool.keys[:, copy : copy + 2], pool.keys[:, 12:14])
    full = pool.share(owner, 4)  # a whole block: shared, nothing copied when it grows
    pool.grow(full, 5, Reservation())
    assert full.blocks[0] == 2 and pool.refs[2] == 3


def test_reservations_guard_the_free_blocks_and_rebuild_recounts():
    pool = KVPool(SHAPE, blocks=5, block_tokens=2)
    held = pool.reserve(3)
    assert pool.available == 2
    with pytest.raises(KVPoolFull, match="kv_pool_mb"):
        pool.reserve(3)
    row = pool.carve(held, 2)
    assert (row.left, held.left, pool.reserved) == (2, 1, 3)
    pool.unreserve(held)
    assert pool.reserved == 2
    kept = BlockTable()
    pool.grow(kept, 3, row)
    lost = BlockTable()
    pool.grow(lost, 2, Reservation())
    pool.rebuild([kept])  # e.g. after a failed step: only what is still held counts
    assert pool.in_use == 2 and pool.reserved == 0 and pool.refs[lost.blocks[0]] == 0


def test_the_layout_setting_and_the_pool_size():
    assert kv_layout(env={}) == "pool"
    assert kv_layout(env={KV_ENV: " Dynamic "}) == "dynamic"
    assert kv_layout("pool", env={KV_ENV: "dynamic"}) == "pool"
    with pytest.raises(ConfigError, match="pool, dynamic"):
        kv_layout(env={KV_ENV: "paged"})
    with pytest.raises(ConfigError, match="kv_pool_mb"):
        LocalModel(kv_pool_mb=0)
    mb = SHAPE.token_bytes / 2**20
    # within the CPU budget: what the batch can use; past it, the budget; at least one context
    assert default_pool_mb(SHAPE, rows=8, context=100, prefix_cache_mb=1) == pytest.approx(
        8 * 100 * mb + 1
    )
    assert default_pool_mb(SHAPE, rows=8, context=10**9, prefix_cache_mb=1) == pytest.approx(
        (10**9 + 32) * mb
    )
    big = KVShape(30, 3, 64, torch.float32, torch.device("cpu"))  # SmolLM2-135M: 46 KB a token
    assert default_pool_mb(big, rows=32, context=8192, prefix_cache_mb=256) == 1024


# ---------------------------------------------------------------------- the paged engine


@pytest.fixture(scope="module")
def dense_mixed(model, tokenizer):
    """The mixed batch through the dense cache, once for every paged setting: its tokens
    and stats (the dense engine is deterministic, its sampled rows seeded)."""
    dense = ContinuousBatcher(model, [-1], 0, tokenizer.decode)
    tokens, _ = refill_loop(dense, mixed_sequences(), slots=3)
    return tokens, dense.stats


@needs_tokenizer
@pytest.mark.parametrize(
    "settings",
    [{}, {"block_tokens": 1}, {"block_tokens": 5, "prefill_chunk": 13}, {"prefill_chunk": 32}],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "default",
)
def test_the_pool_decodes_what_the_dense_cache_decodes(model, tokenizer, dense_mixed, settings):
    """Prompts of 5 to 260 tokens, most behind a shared 60-token skill, caps from 2 to 20
    (rows end at different steps, newcomers join a running batch), three seeded samples of
    one prompt: the same tokens as the dense cache, and every block back at the end."""
    expected, dense_stats = dense_mixed
    batcher = paged(model, tokenizer, **settings)
    tokens, widths = refill_loop(batcher, mixed_sequences(), slots=3)
    assert tokens == expected
    stats = batcher.stats
    assert stats.prefix_hits == dense_stats.prefix_hits >= 2 and stats.refills >= 3
    pool = batcher.pool
    assert pool.reserved == 0
    held = sum(len(e.kv.blocks) for e in batcher.prefix_cache)  # the cached prefixes' blocks
    assert held and pool.in_use <= held  # (shared blocks counted once in use)
    batcher.prefix_cache.clear()
    assert pool.in_use == 0 and pool.refs.count(0) == len(pool.refs)
    assert max(widths) < max(len(s.prompt_ids) for s in mixed_sequences()) + 21


@needs_tokenizer
def test_a_cached_prefix_and_a_prompts_samples_share_blocks(model, tokenizer):
    """Three rows behind a cached 60-token skill hold its full blocks by reference (one
    block each for their own tokens), and three samples of one prompt share its blocks."""
    batcher = paged(model, tokenizer, block_tokens=4)
    prompts = [SKILL + [7 + i] * (3 + i) for i in range(3)]
    first = GenSequence("a", 0, SKILL + [99, 98], 2)
    batcher.admit([first])  # builds nothing (no other prompt yet): then the skill is shared
    batcher.admit([GenSequence(i, 0, p, 30) for i, p in enumerate(prompts)])
    (entry,) = [e for e in batcher.prefix_cache if len(e.tokens) >= len(SKILL)]
    shared = entry.kv.blocks[: len(SKILL) // 4]
    assert all(batcher.pool.refs[b] >= 4 for b in shared)  # the entry and three rows
    for i in range(3):
        table = batcher._kv[batcher.rows[-3 + i]].table
        assert table.blocks[: len(shared)] == shared
    batcher.reset()

    sampler = paged(model, tokenizer, block_tokens=4, prefix_cache_mb=0)
    samples = [
        GenSequence(
            "s",
            k,
            list(range(300, 330)),
            9,
            temperature=1.0,
            generator=torch.Generator().manual_seed(k),
        )
        for k in range(3)
    ]
    sampler.admit(samples)
    tables = [sampler._kv[s].table for s in samples]
    assert tables[0].blocks[:7] == tables[1].blocks[:7] == tables[2].blocks[:7]
    sampler.step()  # each writes its 31st token: its own copy of the shared 8th block
    assert len({t.blocks[7] for t in tables}) == 3
    assert sampler.pool.in_use == 7 + 3


def _slots_from_scratch(batcher: PagedBatcher):
    """The slots and mask a decode step attends, computed afresh from the rows' tables (what
    the batcher keeps between steps and updates by one column a step)."""
    tables = [batcher._kv[s].table for s in batcher.rows]
    lengths = torch.tensor([t.length for t in tables])
    read = batcher.pool.slot_index(tables, torch.zeros_like(lengths), lengths, int(lengths.max()))
    return torch.where(read >= 0, read, 0), (read >= 0).long()


@needs_tokenizer
@pytest.mark.parametrize("block_tokens", [4, 16])
def test_the_slots_kept_between_steps_are_the_tables_slots(model, tokenizer, block_tokens):
    """Rows joining and leaving, blocks taken as rows grow, three samples of one prompt
    copying their shared partial block on their first write: after every admission and step,
    the running slots and mask are the ones the tables give, and as wide as the longest row."""
    batcher = paged(model, tokenizer, block_tokens=block_tokens)
    checked = 0

    def check() -> None:
        nonlocal checked
        if batcher.rows:
            read, mask = _slots_from_scratch(batcher)
            assert torch.equal(batcher._read, read) and torch.equal(batcher._mask, mask)
            assert batcher.width == read.shape[1]
            checked += 1

    waiting = mixed_sequences()
    while waiting or batcher.in_flight:
        free = 3 - len(batcher.in_flight)
        newcomers, waiting = waiting[:free], waiting[free:]
        batcher.admit(newcomers)
        check()
        batcher.step()
        check()
    assert checked > 20 and batcher._read is None
    # Samples admitted together share their prompt's partial last block: each copies it on
    # its first decode step, which moves the slots of its earlier tokens.
    running = GenSequence("long", 0, list(range(200, 260)), 6)
    batcher.admit([running])
    samples = [
        GenSequence("s", k, list(range(300, 330)), 5, temperature=1.0, generator=None)
        for k in range(3)
    ]
    for s in samples:
        s.generator = torch.Generator().manual_seed(s.index)
    batcher.admit(samples)
    tables = [batcher._kv[s].table for s in samples]
    assert tables[0].blocks[-1] == tables[1].blocks[-1] == tables[2].blocks[-1]
    batcher.step()
    check()
    assert len({t.blocks[-1] for t in tables}) == 3
    while batcher.rows:
        batcher.step()
        check()


@needs_tokenizer
def test_local_model_on_the_pool_equals_unbatched_greedy(tokenizer):
    model = tiny_model(tokenizer)
    local = LocalModel.from_pretrained_model(
        model, tokenizer, max_batch_size=3, batch_wait_ms=50, kv="pool"
    )

    async def main():
        return await asyncio.gather(
            *(local.achat(m, GenerationParams(max_tokens=n)) for m, n in MIXED)
        )

    replies = asyncio.run(main())
    assert isinstance(local._batcher, PagedBatcher)
    stats = local.stats
    local.close()
    for (messages, cap), reply in zip(MIXED, replies, strict=True):
        expected = reference_greedy(model, tokenizer, messages, cap)
        assert reply.text == tokenizer.decode(expected, skip_special_tokens=True)
    assert stats.refills >= 2 and stats.kv_peak_blocks > 0 and stats.kv_waits == 0


def _needs(local: LocalModel, messages, cap: int) -> int:
    """The blocks the pool sets aside for one request (`PagedBatcher._need`, no cached
    prefix)."""
    return -(-(len(local._encode(messages)) + cap) // 16) + SLACK_BLOCKS


@needs_tokenizer
def test_a_full_pool_makes_requests_wait_and_never_fail(tokenizer):
    """A pool that holds the largest request and little more: the six requests wait their
    turn (fewer rows at once than the batch allows) and every reply is the reference's."""
    model = tiny_model(tokenizer)
    probe = LocalModel.from_pretrained_model(model, tokenizer)
    need = max(_needs(probe, m, n) for m, n in MIXED)
    block_mb = kv_shape(model).token_bytes * 16 / 2**20
    local = LocalModel.from_pretrained_model(
        model, tokenizer, max_batch_size=6, kv_pool_mb=(need + 4) * block_mb, batch_wait_ms=50
    )

    async def main():
        return await asyncio.gather(
            *(local.achat(m, GenerationParams(max_tokens=n)) for m, n in MIXED)
        )

    replies = asyncio.run(main())
    batcher = local._batcher
    stats = local.stats
    assert stats.kv_waits > 0 and stats.max_rows < len(MIXED)
    assert stats.kv_peak_blocks <= batcher.pool.blocks == need + 4
    assert batcher.pool.reserved == 0
    local.close()
    for (messages, cap), reply in zip(MIXED, replies, strict=True):
        expected = reference_greedy(model, tokenizer, messages, cap)
        assert reply.text == tokenizer.decode(expected, skip_special_tokens=True)


@needs_tokenizer
def test_a_request_larger_than_the_pool_fails_alone_naming_the_setting(tokenizer):
    model = tiny_model(tokenizer)
    block_mb = kv_shape(model).token_bytes * 16 / 2**20
    local = LocalModel.from_pretrained_model(
        model, tokenizer, max_batch_size=4, kv_pool_mb=8 * block_mb, batch_wait_ms=20
    )
    long = [{"role": "user", "content": "word " * 200}]

    async def main():
        return await asyncio.gather(
            local.achat([{"role": "user", "content": "Hi"}], GenerationParams(max_tokens=4)),
            local.achat(long, GenerationParams(max_tokens=4)),
            return_exceptions=True,
        )

    short, failed = asyncio.run(main())
    local.close()
    assert short.completion_tokens == 4
    assert isinstance(failed, FatalBackendError) and "kv_pool_mb" in str(failed)


@needs_tokenizer
def test_abandoned_and_dropped_admissions_give_their_blocks_back(model, tokenizer):
    batcher = paged(model, tokenizer, prefill_chunk=8, prefix_cache_mb=0)
    running = GenSequence("run", 0, list(range(10, 15)), 50)
    batcher.admit([running])
    batcher.step()  # one chunk: it joins and decodes
    assert batcher.rows == [running]
    joining = GenSequence("join", 0, list(range(50, 120)), 50)
    assert batcher.fits([joining]) == 1
    batcher.admit([joining])
    batcher.step()  # one chunk of the newcomer's 70 tokens: it holds blocks, not yet a row
    assert batcher.rows == [running] and batcher.in_flight == [running, joining]
    assert batcher.pool.in_use == 2 and batcher.pool.reserved > 0
    gone = batcher.drop(lambda s: True)
    assert {s.owner for s in gone} == {"run", "join"} and not batcher.in_flight
    assert batcher.pool.in_use == 0 and batcher.pool.reserved == 0


@needs_tokenizer
def test_a_cancelled_request_frees_its_blocks(tokenizer):
    model = tiny_model(tokenizer)
    local = LocalModel.from_pretrained_model(model, tokenizer, max_batch_size=2)

    async def main():
        task = asyncio.create_task(
            local.achat([{"role": "user", "content": "Go on"}], GenerationParams(max_tokens=400))
        )
        done = await local.achat(
            [{"role": "user", "content": "Hi"}], GenerationParams(max_tokens=3)
        )
        task.cancel()
        await asyncio.sleep(0.05)
        await local.achat([{"role": "user", "content": "Again"}], GenerationParams(max_tokens=2))
        return done

    assert asyncio.run(main()).completion_tokens == 3
    batcher = local._batcher
    held = {b for e in batcher.prefix_cache for b in e.kv.blocks}
    assert batcher.pool.in_use == len(held) and batcher.pool.reserved == 0
    local.close()


@needs_tokenizer
def test_the_setting_chooses_the_engine(tokenizer, monkeypatch):
    model = tiny_model(tokenizer)
    monkeypatch.setenv(KV_ENV, "dynamic")
    dense = LocalModel.from_pretrained_model(model, tokenizer)
    assert dense.kv == "dynamic"
    dense.chat([{"role": "user", "content": "Hi"}], GenerationParams(max_tokens=2))
    assert type(dense._batcher) is ContinuousBatcher and dense.stats.kv_pool_blocks == 0
    dense.close()
    monkeypatch.setenv(KV_ENV, "pool")
    pooled = LocalModel.from_pretrained_model(model, tokenizer, kv_pool_mb=1)
    pooled.chat([{"role": "user", "content": "Hi"}], GenerationParams(max_tokens=2))
    assert isinstance(pooled._batcher, PagedBatcher)
    assert pooled.stats.kv_pool_blocks == int(2**20 // (kv_shape(model).token_bytes * 16))
    pooled.close()
    monkeypatch.setenv(KV_ENV, "stacked")
    with pytest.raises(ConfigError, match=KV_ENV):
        LocalModel.from_pretrained_model(model, tokenizer)


@needs_embedded
def test_the_pool_decodes_what_the_dense_cache_decodes_on_the_embedded_model():
    """SmolLM2-135M in float32: a ~150-token shared system prompt, six questions of
    different lengths ending at their own EOS or cap (5 to 20 tokens), three rows at a time;
    the pool (and the pool with chunked prefill, three chunks a prompt) decodes the dense
    cache's tokens."""
    local = LocalModel(max_batch_size=3, dtype="float32")
    skill = (
        "You are a careful calculator. Rules: read the whole question; write the operation "
        "you will do; do it digit by digit; check the result by doing the inverse operation; "
        "answer with the number on its own line. "
    ) * 3
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
    caps = [6, 20, 8, 12, 5, 15]
    model, tokenizer = local.model, local.tokenizer
    args = (model, local._eos_ids, tokenizer.pad_token_id, tokenizer.decode)

    def run(batcher):
        seqs = [GenSequence(i, 0, p, c) for i, (p, c) in enumerate(zip(prompts, caps, strict=True))]
        return refill_loop(batcher, seqs, slots=3)[0], batcher

    expected, dense = run(ContinuousBatcher(*args))
    tokens, pooled = run(PagedBatcher(*args, pool_mb=64))
    chunked, _ = run(PagedBatcher(*args, pool_mb=64, prefill_chunk=64, block_tokens=8))
    local.close()
    assert tokens == expected and chunked == expected
    assert len({len(t) for t in tokens}) > 2  # rows ended at different steps
    assert pooled.stats.prefix_tokens_reused == dense.stats.prefix_tokens_reused > 0
