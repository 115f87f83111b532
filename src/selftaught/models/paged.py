"""Continuous batching over the KV block pool (`selftaught.models.kv_pool`).

The same engine as `selftaught.models.batching` (admission, shared prefixes, chunked prefill,
sampling, stop strings: inherited), with the keys and values kept in the pool's blocks
instead of one dense left-padded cache: a row is its block table, nothing is copied when
rows join or leave, a cached prefix is shared by reference, and n samples of one prompt
share its blocks until each writes its own.

How a forward attends: every forward writes its new keys and values into the rows' slots of
the pool, then gathers, per layer, the slots of each row's tokens into a contiguous
[rows, heads, width, dim] view (row i's tokens right-aligned, the columns before them read
as zeros and masked), which the model's own attention reads with the 2D mask and position
ids the dense engine gives it. So the attention, its mask and the rotary positions are
transformers' own, and greedy replies in float32 are the dense engine's token for token.
The cost: the gather copies each row's keys and values once per layer per step (what the
dense cache's spare columns avoided), into two buffers reused by every layer and step; in
exchange nothing is copied or reallocated when rows join or leave, and no padding hole is
kept between a shared prefix and the rest of a prompt. `width` is the longest live row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from selftaught.models.batching import (
    DEFAULT_PREFILL_CHUNK,
    BatcherStats,
    CachedHead,
    ContinuousBatcher,
    GenSequence,
    Prefilled,
    UnsupportedCacheError,
    left_padded,
    resume_admission,
)
from selftaught.models.kv_pool import (
    BLOCK_TOKENS,
    SLACK_BLOCKS,
    ZERO_SLOT,
    BlockTable,
    KVPool,
    KVPoolFull,
    KVShape,
    Reservation,
    kv_shape,
)
from selftaught.models.prefix_cache import DEFAULT_PREFIX_CACHE_MB, PrefixCache, PrefixEntry


@dataclass(eq=False)
class _RowKV:
    """A running row's keys and values: its block table and the blocks set aside for it."""

    table: BlockTable
    reservation: Reservation


@dataclass(eq=False)
class _Admission:
    """What one admission holds while it is prefilled: its reservation, the cached prefixes it
    counts on (pinned), and the tables it made that nobody took over yet."""

    reservation: Reservation
    pins: list[PrefixEntry]
    tables: list[BlockTable] = field(default_factory=list)


@dataclass(frozen=True)
class _Plan:
    """One forward's slots: where its new keys and values go (`write`, rows x queries), what
    each row attends (`read`, rows x width, zeros before a row's first token) and the mask."""

    write: Any
    read: Any
    mask: Any
    width: int
    queries: int


class PagedBatcher(ContinuousBatcher):
    """`ContinuousBatcher` with its keys and values in a `KVPool` of `pool_mb` megabytes,
    in blocks of `block_tokens`, for keys of `shape` (default: `kv_shape(model)`). The other
    arguments are `ContinuousBatcher`'s; compaction has nothing to pack here."""

    def __init__(
        self,
        model: Any,
        eos_ids: Sequence[int],
        pad_id: int,
        decode: Callable[[list[int]], str],
        *,
        pool_mb: float,
        stats: BatcherStats | None = None,
        min_prefix: int = 16,
        prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB,
        state: Callable[[], Hashable] | None = None,
        prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
        block_tokens: int = BLOCK_TOKENS,
        shape: KVShape | None = None,
    ) -> None:
        shape = shape or kv_shape(model)  # UnsupportedCacheError for a model it cannot serve
        super().__init__(
            model,
            eos_ids,
            pad_id,
            decode,
            stats=stats,
            min_prefix=min_prefix,
            prefix_cache_mb=prefix_cache_mb,
            state=state,
            prefill_chunk=prefill_chunk,
        )
        self.pool = KVPool.sized(shape, pool_mb, block_tokens)
        if self.prefix_cache is not None:  # entries hold blocks: they go back when dropped
            self.prefix_cache = PrefixCache(self.prefix_cache.max_bytes, self.pool.release)
        self._kv: dict[GenSequence, _RowKV] = {}
        self._view = _view_class()(self.pool)
        self._adm: _Admission | None = None  # the admission being run (one at a time)
        # The running rows' slots and mask, [rows, width] on the device, kept between decode
        # steps (one column more a step; rows joining or leaving change them): row i's
        # tokens right-aligned, ZERO_SLOT and 0 before them; width is the longest row.
        self._read: Any = None
        self._mask: Any = None
        self._width = 0
        self.stats.kv_pool_blocks = self.pool.blocks
        self.stats.kv_block_tokens = self.pool.block_tokens

    # ------------------------------------------------------------------ admission

    def fits(self, sequences: Sequence[GenSequence]) -> int:
        """How many of `sequences`, from the first, the pool can reserve for now; cached
        prefixes nobody counts on are evicted to make room first."""
        cache = self.prefix_cache
        if cache is not None and not self.rows:
            cache.sync(self._state())  # before matching (weights change between busy periods)
        need, count = 0, 0
        seen: set[tuple[int, ...]] = set()
        keep: list[PrefixEntry] = []
        for s in sequences:
            need += self._need(s, seen, keep)
            while need > self.pool.available and cache is not None and cache.evict_oldest(keep):
                pass
            if need > self.pool.available:
                break
            count += 1
        if count < len(sequences):
            self.stats.kv_waits += 1
        return count

    def _need(self, s: GenSequence, seen: set[tuple[int, ...]], keep: list[PrefixEntry]) -> int:
        """Blocks `s` may take: its prompt and cap, less the full blocks of the cached prefix
        it will share (or of its prompt, when an earlier sequence of this admission has the
        same prompt), plus slack for copies on write."""
        bs = self.pool.block_tokens
        prompt = tuple(s.prompt_ids)
        blocks = self.pool.blocks_for(len(prompt) + s.max_new_tokens) + SLACK_BLOCKS
        if prompt in seen:
            return blocks - len(prompt) // bs
        seen.add(prompt)
        if self.prefix_cache is not None:
            n, entry = self.prefix_cache.match(prompt, len(prompt) - 1)
            if entry is not None and n >= self.min_prefix:
                keep.append(entry)
                blocks -= n // bs
        return blocks

    def _admission(self, sequences: list[GenSequence]) -> Generator[None, None, Prefilled]:
        """The inherited admission, run inside a reservation of the blocks it may need: the
        cached prefixes counted on are pinned until it ends, each row then keeps what it may
        still need, and the rest (and anything left by an abandoned admission) goes back."""
        cache = self.prefix_cache
        if cache is not None and not self.rows:
            cache.sync(self._state())
        seen: set[tuple[int, ...]] = set()
        pins: list[PrefixEntry] = []
        need = sum(self._need(s, seen, pins) for s in sequences)
        adm = _Admission(self.pool.reserve(need), pins)
        for entry in pins:
            assert cache is not None  # pins come from the cache
            cache.pin(entry)
        steps = super()._admission(sequences)
        try:
            while True:
                self._adm = adm
                done, block = resume_admission(steps)
                self._adm = None
                if done:
                    break
                yield
            assert block is not None
            self._hand_over(block, adm)
            return block
        finally:
            self._adm = None
            steps.close()
            self._close(adm)

    def _hand_over(self, block: Prefilled, adm: _Admission) -> None:
        """Each new row keeps its table and the blocks it may still need (all or none: a
        failure leaves the tables to the admission, which gives them back)."""
        pool, bs = self.pool, self.pool.block_tokens
        carved: list[tuple[GenSequence, BlockTable, Reservation]] = []
        try:
            for s, table in zip(block.rows, block.cache, strict=True):
                last_shared = table.length % bs and pool.refs[table.blocks[-1]] > 1
                need = pool.blocks_for(len(s.prompt_ids) + s.max_new_tokens) - len(table.blocks)
                need = 0 if s.finished else max(0, need) + int(bool(last_shared))
                carved.append((s, table, pool.carve(adm.reservation, need)))
        except KVPoolFull:
            for _, _, reservation in carved:
                pool.unreserve(reservation)
            raise
        for s, table, reservation in carved:
            adm.tables.remove(table)
            self._kv[s] = _RowKV(table, reservation)

    def _close(self, adm: _Admission) -> None:
        for table in adm.tables:
            self.pool.release(table)
        adm.tables.clear()
        for entry in adm.pins:
            assert self.prefix_cache is not None  # pins come from it
            self.prefix_cache.unpin(entry)
        adm.pins.clear()
        self.pool.unreserve(adm.reservation)

    # ------------------------------------------------------------------ prefill

    def _forward_tables(
        self, rests: list[tuple[int, ...]], heads: list[CachedHead]
    ) -> Generator[None, None, tuple[list[BlockTable], Any]]:
        """The forward for rows that each continue a cached head with their rest: each row's
        table shares its head's blocks, then holds its rest. One forward, or with
        `prefill_chunk` one per chunk of columns; pauses before each. Returns the tables and
        the last position's logits."""
        adm = self._adm
        assert adm is not None, "a prefill runs inside an admission"
        tables = [
            self.pool.share(h.entry.kv, h.length) if h.length else BlockTable() for h in heads
        ]
        adm.tables.extend(tables)
        n, width = len(rests), max(len(r) for r in rests)
        ids, _, positions = left_padded(rests, [h.length for h in heads], self.pad_id)
        ids, positions = ids.to(self.device), positions.to(self.device)
        pads = [width - len(r) for r in rests]
        chunked = self.prefill_chunk is not None
        span = max(1, self.prefill_chunk // n) if self.prefill_chunk is not None else width
        logits = None
        for start in range(0, width, span):
            end = min(start + span, width)
            yield
            new = [max(0, end - max(start, pad)) for pad in pads]
            plan = self._plan(tables, new, end - start, [adm.reservation] * n)
            logits = self._forward(
                ids[:, start:end], plan.mask, positions[:, start:end], self._at(plan), prefill=True
            )
            self.stats.max_prefill_tokens = max(self.stats.max_prefill_tokens, n * (end - start))
            self.stats.prefill_chunks += int(chunked)
        return tables, logits

    def _build_prefix(
        self, prefix: tuple[int, ...], cache: PrefixCache
    ) -> Generator[None, None, Any]:
        """One forward for `prefix` (after its longest cached head); its table becomes the
        new entry (pinned while this admission lasts; released at its end when not kept)."""
        n, entry = cache.match(prefix, len(prefix) - 1)
        head = CachedHead(n, entry) if entry is not None and n >= self.min_prefix else CachedHead()
        tables, _ = yield from self._forward_tables([prefix[head.length :]], [head])
        self.stats.prefix_builds += 1
        self.stats.prefilled_tokens += len(prefix) - head.length
        table, adm = tables[0], self._adm
        assert adm is not None
        built = cache.put(prefix, table, len(table.blocks) * self.pool.block_bytes)
        if cache.holds(built):
            adm.tables.remove(table)
            cache.pin(built)
            adm.pins.append(built)
        return built

    def _prefill(
        self, prompts: list[tuple[int, ...]], heads: list[CachedHead], members: list[GenSequence]
    ) -> Generator[None, None, Prefilled]:
        """One forward for `prompts` (their parts after their heads), then one row per member
        (n samples of a prompt share its blocks), first tokens sampled."""
        torch = self.torch
        rests = [p[h.length :] for p, h in zip(prompts, heads, strict=True)]
        tables, logits = yield from self._forward_tables(rests, heads)
        self.stats.prefill_calls += 1
        self.stats.prefilled_prompts += len(rests)
        self.stats.prefilled_tokens += sum(len(r) for r in rests)
        where = {p: i for i, p in enumerate(prompts)}
        rows = [where[tuple(s.prompt_ids)] for s in members]
        if rows != list(range(len(rests))):  # samples share their prompt's prefill
            logits = logits[torch.tensor(rows, device=self.device)]
        first = self._sample(logits, members)
        adm = self._adm
        assert adm is not None, "a prefill runs inside an admission"
        owned, taken = [], set()
        for i in rows:
            if i in taken:  # another sample of the prompt: its blocks, shared
                table = self.pool.share(tables[i], tables[i].length)
                adm.tables.append(table)
            else:
                table = tables[i]
                taken.add(i)
            owned.append(table)
        for s, token in zip(members, first, strict=True):
            self._append(s, token)
        return Prefilled(list(members), owned, None, None, None, None)

    # ------------------------------------------------------------------ decode

    def _step(self) -> list[GenSequence]:
        rows = self.rows
        plan, ids, positions, live = self._decode_inputs()
        logits = self._forward(ids, plan.mask, positions, self._at(plan))
        tokens = self._sample(logits, rows)
        self.stats.decode_steps += 1
        self.stats.decoded_tokens += len(tokens)
        counts = self.stats.decode_rows
        counts[len(tokens)] = counts.get(len(tokens), 0) + 1
        self.stats.decode_columns += len(tokens) * plan.width
        self.stats.decode_live_columns += live
        for s, token in zip(rows, tokens, strict=True):
            self._append(s, token)
        return self._evict_finished()

    def _decode_inputs(self) -> tuple[_Plan, Any, Any, int]:
        """A decode step's plan, token ids and position ids, and the tokens its rows attend.
        Each row's next slot is its table's next one (a block taken when its last is full, a
        shared partial one copied first); the slots and mask it attends are the running ones
        with that slot as one more column (rows whose earlier slots a copy moved are
        recomputed). One host-to-device copy; no per-row tensor work."""
        torch, pool = self.torch, self.pool
        bs, refs = pool.block_tokens, pool.refs
        write, last, before, moved = [], [], [], []
        for i, s in enumerate(self.rows):
            row = self._kv[s]
            table = row.table
            n = table.length
            part = n % bs
            if not part or refs[table.blocks[-1]] > 1:  # a new block, or a copy on write
                block = table.blocks[-1] if part else None
                pool.grow(table, n + 1, row.reservation)
                if part and table.blocks[-1] != block:
                    moved.append(i)
            write.append(table.blocks[n // bs] * bs + part)
            last.append(s.tokens[-1])
            before.append(n)
            table.length = n + 1
        self.stats.kv_peak_blocks = max(self.stats.kv_peak_blocks, pool.peak)
        slots, ids, positions = torch.tensor([write, last, before]).to(self.device)
        if moved:
            self._reslot(moved, before)
        ones = torch.ones((len(write), 1), dtype=self._mask.dtype, device=self.device)
        self._read = torch.cat([self._read, slots[:, None]], dim=1)
        self._mask = torch.cat([self._mask, ones], dim=1)
        self._width += 1
        plan = _Plan(slots, self._read.flatten(), self._mask, self._width, 1)
        return plan, ids[:, None], positions[:, None], sum(before) + len(write)

    def _reslot(self, rows: list[int], lengths: list[int]) -> None:
        """Recompute the running slots of `rows` (their first `lengths[i]` tokens)."""
        torch = self.torch
        tables = [self._kv[self.rows[i]].table for i in rows]
        counts = torch.tensor([lengths[i] for i in rows])
        read = self.pool.slot_index(tables, torch.zeros_like(counts), counts, self._width)
        index = torch.tensor(rows, device=self.device)
        self._read[index] = torch.where(read >= 0, read, ZERO_SLOT).to(self.device)

    def _plan(
        self,
        tables: list[BlockTable],
        new: list[int],
        queries: int,
        reservations: list[Reservation],
    ) -> _Plan:
        """Room for `new[i]` more tokens in row i's table, and the slots of the forward that
        feeds them (`queries` columns, each row's new tokens the last of them)."""
        torch, pool = self.torch, self.pool
        for table, count, reservation in zip(tables, new, reservations, strict=True):
            if count:
                pool.grow(table, table.length + count, reservation)
        before = torch.tensor([t.length for t in tables])
        added = torch.tensor(new)
        after = before + added
        width = int(after.max())
        write = pool.slot_index(tables, before, added, queries)
        read = pool.slot_index(tables, torch.zeros_like(before), after, width)
        mask = (read >= 0).long()
        write = torch.where(write >= 0, write, pool.trash_slot)
        read = torch.where(read >= 0, read, ZERO_SLOT)
        for table, length in zip(tables, after.tolist(), strict=True):
            table.length = length
        self.stats.kv_peak_blocks = max(self.stats.kv_peak_blocks, pool.peak)
        device = self.device
        return _Plan(
            write.flatten().to(device), read.flatten().to(device), mask.to(device), width, queries
        )

    def _at(self, plan: _Plan) -> Any:
        self._view.plan = plan
        return self._view

    # ------------------------------------------------------------------ rows

    def _merge(self, block: Prefilled) -> None:
        """Add prefilled rows (their tables are `block.cache`): their slots and mask join the
        running ones, the narrower left-padded."""
        torch = self.torch
        tables: list[BlockTable] = block.cache
        lengths = torch.tensor([t.length for t in tables])
        width = int(lengths.max())
        read = self.pool.slot_index(tables, torch.zeros_like(lengths), lengths, width)
        mask = (read >= 0).long()
        read = torch.where(read >= 0, read, ZERO_SLOT)
        read, mask = read.to(self.device), mask.to(self.device)
        if self.rows:
            self.stats.refills += 1
            both = max(width, self._width)
            old, new = both - self._width, both - width
            read = torch.cat(
                [_pad_columns(self._read, old, ZERO_SLOT), _pad_columns(read, new, ZERO_SLOT)]
            )
            mask = torch.cat([_pad_columns(self._mask, old, 0), _pad_columns(mask, new, 0)])
            width = both
        self._read, self._mask, self._width = read, mask, width
        self.rows = self.rows + list(block.rows)
        self.stats.max_rows = max(self.stats.max_rows, len(self.rows))

    def _keep(self, keep: list[int]) -> None:
        """Keep only rows `keep` (the others' blocks go back) and drop the leading columns no
        kept row needs."""
        kept = [self.rows[i] for i in keep]
        for s in set(self.rows) - set(kept):
            row = self._kv.pop(s)
            self.pool.release(row.table)
            self.pool.unreserve(row.reservation)
        self.rows = kept
        if not kept:
            self._read = self._mask = None
            self._width = 0
            return
        index = self.torch.tensor(keep, device=self.device)
        width = max(self._kv[s].table.length for s in kept)
        crop = self._width - width
        self._read, self._mask = self._read[index, crop:], self._mask[index, crop:]
        self._width = width

    def _cache_replies(self, rows: list[int]) -> None:
        """A finished episode turn's blocks (prompt and reply, all but the last token) become
        a cached prefix, by reference."""
        cache = self.prefix_cache
        if cache is None:
            return
        for i in rows:
            s = self.rows[i]
            table = self.pool.share(self._kv[s].table, self._kv[s].table.length)
            tokens = tuple(s.prompt_ids) + tuple(s.tokens[:-1])
            entry = cache.put(tokens, table, len(table.blocks) * self.pool.block_bytes)
            if not cache.holds(entry):
                self.pool.release(table)
            self.stats.replies_cached += 1

    def _maybe_compact(self) -> None:
        """Nothing to pack: a row's view holds its own tokens only."""

    def reset(self) -> None:
        super().reset()  # closing the joining admissions gives their blocks back
        self._kv.clear()
        self._read = self._mask = None
        self._width = 0
        cache = self.prefix_cache
        self.pool.rebuild([e.kv for e in cache] if cache is not None else [])

    @property
    def width(self) -> int:
        """Columns a decode step attends: the longest live row (0 when idle)."""
        return self._width if self.rows else 0


def _pad_columns(x: Any, n: int, value: int) -> Any:
    """[rows, width] `x` with `n` columns of `value` before it."""
    if n == 0:
        return x
    import torch

    return torch.cat([x.new_full((x.shape[0], n), value), x], dim=1)


@functools.cache
def _view_class() -> type:  # made once transformers is imported
    from transformers.cache_utils import Cache

    class PagedView(Cache):
        """The pool as one forward's cache: `update` writes the layer's new keys and values
        into the plan's slots and returns the gathered [rows, heads, width, dim] view."""

        def __init__(self, pool: KVPool) -> None:
            super().__init__(layers=[])
            self.pool = pool
            self.plan: _Plan | None = None
            self._buffers: tuple[Any, Any] | None = None
            self._checked = False

        def update(
            self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kw: Any
        ) -> tuple[Any, Any]:
            import torch

            plan = self._plan()
            if not self._checked:
                self._check(key_states, layer_idx)
            rows, heads, queries, dim = key_states.shape
            keys, values = self.pool.keys[layer_idx], self.pool.values[layer_idx]
            flat = (rows * queries, heads, dim)
            # (a cast only if a caller's autocast made keys in another dtype than the probe's)
            new_k = key_states.transpose(1, 2).reshape(flat).to(keys.dtype)
            keys.index_copy_(0, plan.write, new_k)
            values.index_copy_(
                0, plan.write, value_states.transpose(1, 2).reshape(flat).to(keys.dtype)
            )
            k_out, v_out = self._scratch(rows * plan.width)
            torch.index_select(keys, 0, plan.read, out=k_out)
            torch.index_select(values, 0, plan.read, out=v_out)
            shape = (rows, plan.width, heads, dim)
            k_view, v_view = k_out.view(shape).transpose(1, 2), v_out.view(shape).transpose(1, 2)
            return k_view.to(key_states.dtype), v_view.to(value_states.dtype)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            plan = self._plan()
            return plan.width - plan.queries

        def get_query_offset(self, layer_idx: int = 0) -> int:
            return self.get_seq_length(layer_idx)

        def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
            return self._plan().width, 0

        def _plan(self) -> _Plan:
            if self.plan is None:
                raise UnsupportedCacheError("the paged view was used without a plan")
            return self.plan

        def _scratch(self, n: int) -> tuple[Any, Any]:
            """Two buffers of at least `n` slots (grown by half when short): every layer of
            every forward gathers into them, so the gathers allocate nothing."""
            have = self._buffers
            if have is None or have[0].shape[0] < n:
                size = max(n, int(1.5 * have[0].shape[0])) if have is not None else n
                like = self.pool.keys[0]
                shape = (size, *like.shape[1:])
                have = self._buffers = (like.new_empty(shape), like.new_empty(shape))
            k, v = have
            return k[:n], v[:n]

        def _check(self, key_states: Any, layer_idx: int) -> None:
            shape = self.pool.shape
            got = (key_states.shape[1], key_states.shape[3])
            if got != (shape.heads, shape.dim) or layer_idx >= shape.layers:
                raise UnsupportedCacheError(
                    f"the model's keys ({got[0]} heads of {got[1]}, layer {layer_idx}) do "
                    f"not fit the KV pool's ({shape.heads} of {shape.dim}, {shape.layers} "
                    "layers)"
                )
            self._checked = layer_idx == shape.layers - 1

    return PagedView
