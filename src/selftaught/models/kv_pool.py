"""The KV block pool: the local engine's keys and values, allocated once in fixed blocks.

Each layer's keys and values live in one tensor of `blocks x block_tokens` slots, allocated
when the engine starts and never grown; a sequence holds a block table (the blocks its tokens
are in, in order) and takes a free block only when its last one is full. A sequence that ends
gives its blocks back, and a cached prompt prefix (`selftaught.models.prefix_cache`) holds its
blocks by reference: a prompt that starts with it shares them (a reference count per block)
and copies only a partly filled last block before writing into it (copy on write). So memory
is set by the pool's size, not by the history of the allocator's heap (measured before, on
tool ReST: resident memory climbing from 2.4 to 6.6 GB while the live KV stayed under
1.5 GB, because every join and leave of the dense cache allocated buffers of a new size).

Admission is by reservation: before a sequence is prefilled, the blocks it may ever need
(its prompt, less the full blocks of a cached prefix it will share, plus its token cap and a
little slack) are set aside, so a running sequence never finds the pool empty; what the
prefill did not use goes back at once. When the pool cannot cover a newcomer, the scheduler
lets it wait until running sequences end (`ContinuousBatcher.fits`). Free blocks are taken
lowest first, so the resident part of the pool is its high-water mark.

The layout is a setting while the two are measured against each other: `SELFTAUGHT_KV=pool`
(the default) or `dynamic` (the dense cache, `selftaught.models.batching`), or
`LocalModel(kv=...)`. The size is `LocalModel(kv_pool_mb=...)`, by default `default_pool_mb`.
"""

from __future__ import annotations

import functools
import heapq
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from selftaught.errors import ConfigError, RunError
from selftaught.models.batching import UnsupportedCacheError

KV_ENV = "SELFTAUGHT_KV"
KV_LAYOUTS = ("pool", "dynamic")
DEFAULT_KV = "pool"
BLOCK_TOKENS = 16  # tokens a block holds (vLLM's default)
CPU_POOL_MB = 1024.0  # the pool's budget on a CPU
ACCELERATOR_POOL_SHARE = 0.25  # of the device's free memory when the engine starts
RESERVED_BLOCKS = 2  # block 0: zeros (what padding columns read); block 1: padding's writes
ZERO_SLOT = 0
SLACK_BLOCKS = 2  # per sequence: copies on write of shared partial blocks


class KVPoolFull(RunError):
    """The pool has not the blocks asked for (a request larger than the whole pool, or a
    caller that admitted without asking `fits`)."""


def kv_layout(setting: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The KV layout: `setting` when given, else `SELFTAUGHT_KV`; `pool` when neither says."""
    value = setting if setting is not None else (os.environ if env is None else env).get(KV_ENV)
    name = (value or "").strip().lower() or DEFAULT_KV
    if name not in KV_LAYOUTS:
        raise ConfigError(f"{KV_ENV} must be one of {', '.join(KV_LAYOUTS)}, got {value!r}")
    return name


@dataclass(frozen=True)
class KVShape:
    """What one token's keys and values take: layers x KV heads x head size, in `dtype`."""

    layers: int
    heads: int
    dim: int
    dtype: Any
    device: Any

    @property
    def token_bytes(self) -> int:
        import torch

        itemsize: int = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.layers * self.heads * self.dim * itemsize


def kv_shape(model: Any) -> KVShape:
    """The KV shape of a causal LM (a peft wrapper's too), as its layers hand keys to the
    cache in a one-token forward (not its weights' dtype: a forward still wrapped in autocast
    after training may differ, and a wrapper may convert what the forward returns).
    UnsupportedCacheError for a model the pool cannot serve: every layer must attend fully
    over its own keys and values (no sliding window, no linear or shared-KV layers)."""
    import torch

    reason = _unsupported(model.config)
    if reason is not None:
        raise UnsupportedCacheError(f"the KV pool cannot serve this model: {reason}")
    device = next(model.parameters()).device
    cache = _recording_cache()()
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            ids = torch.zeros((1, 1), dtype=torch.long, device=device)
            model(input_ids=ids, past_key_values=cache, use_cache=True)
    finally:
        if was_training:
            model.train()
    seen = cache.seen
    shapes = {(k.shape[0], k.shape[1], k.shape[3], k.dtype) for k in seen.values()}
    if not seen or sorted(seen) != list(range(len(seen))) or len(shapes) != 1:
        raise UnsupportedCacheError("the KV pool needs keys of one shape in every layer")
    keys = seen[0]
    return KVShape(len(seen), int(keys.shape[1]), int(keys.shape[3]), keys.dtype, keys.device)


@functools.cache
def _recording_cache() -> type:
    from transformers import DynamicCache

    class RecordingCache(DynamicCache):
        """Remembers each layer's keys as the layer hands them over."""

        def __init__(self) -> None:
            super().__init__()
            self.seen: dict[int, Any] = {}

        def update(
            self, key_states: Any, value_states: Any, layer_idx: int, *a: Any, **k: Any
        ) -> Any:
            self.seen[layer_idx] = key_states
            return super().update(key_states, value_states, layer_idx, *a, **k)

    return RecordingCache


def _unsupported(config: Any) -> str | None:
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = set(getattr(text, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"}:
        return f"its layers are {', '.join(sorted(types))}"
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return "it attends within a sliding window"
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder"
    return None


def default_pool_mb(
    shape: KVShape, rows: int, context: int | None, prefix_cache_mb: float
) -> float:
    """The pool's size when none is given: what `rows` sequences of the whole context and
    the prefix cache would take, within a budget (`CPU_POOL_MB` on a CPU, a share of the free
    memory on an accelerator), and never less than one sequence of the whole context (so
    every request fits alone)."""
    per_token_mb = shape.token_bytes / 2**20
    budget = CPU_POOL_MB
    if getattr(shape.device, "type", "cpu") == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(shape.device)
        budget = ACCELERATOR_POOL_SHARE * free / 2**20
    if not context:
        return budget
    need = rows * context * per_token_mb + prefix_cache_mb
    return max(min(need, budget), (context + 2 * BLOCK_TOKENS) * per_token_mb)


@dataclass(eq=False)
class BlockTable:
    """A sequence's (or a cached prefix's) tokens in the pool: one reference per block."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0  # tokens written


@dataclass(eq=False)
class Reservation:
    """Blocks set aside for one holder (a running sequence, an admission being prefilled)."""

    left: int = 0


class KVPool:
    """Fixed blocks of keys and values for every layer, their reference counts and the free
    ones (not thread-safe: the batcher's driver thread only).

    Args:
        shape: the model's KV shape (`kv_shape`).
        blocks: blocks a sequence may use (two more are kept for padding).
        block_tokens: tokens a block holds.
    """

    def __init__(self, shape: KVShape, blocks: int, block_tokens: int = BLOCK_TOKENS) -> None:
        import torch

        if blocks < 1 or block_tokens < 1:
            raise ConfigError(f"the KV pool needs >= 1 block of >= 1 token, got {blocks}")
        self.shape, self.block_tokens = shape, block_tokens
        total = blocks + RESERVED_BLOCKS
        size = (shape.layers, total * block_tokens, shape.heads, shape.dim)
        with torch.inference_mode():  # written only inside the batcher's inference mode
            self.keys = torch.empty(size, dtype=shape.dtype, device=shape.device)
            self.values = torch.empty(size, dtype=shape.dtype, device=shape.device)
            self.keys[:, :block_tokens].zero_()  # block 0: what padding columns read
            self.values[:, :block_tokens].zero_()
        self.trash_slot = block_tokens  # block 1: where padding queries' keys are written
        self.blocks = blocks
        self.refs = [0] * total
        self._free = list(range(RESERVED_BLOCKS, total))  # a heap: the lowest block first
        self.reserved = 0
        self.peak = 0  # most blocks in use at once

    @classmethod
    def sized(cls, shape: KVShape, pool_mb: float, block_tokens: int = BLOCK_TOKENS) -> KVPool:
        """A pool of at most `pool_mb` megabytes (at least one block)."""
        if not pool_mb > 0:
            raise ConfigError(f"kv_pool_mb must be > 0, got {pool_mb}")
        block_bytes = shape.token_bytes * block_tokens
        return cls(shape, max(1, int(pool_mb * 2**20 // block_bytes)), block_tokens)

    # ------------------------------------------------------------------ accounting

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def available(self) -> int:
        """Free blocks not set aside for anyone."""
        return len(self._free) - self.reserved

    @property
    def in_use(self) -> int:
        return self.blocks - len(self._free)

    @property
    def block_bytes(self) -> int:
        return self.shape.token_bytes * self.block_tokens

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def reserve(self, n: int) -> Reservation:
        """Set `n` free blocks aside (KVPoolFull when they are not there)."""
        if n > self.available:
            raise KVPoolFull(
                f"the KV pool has {self.available} of {self.blocks} blocks of "
                f"{self.block_tokens} tokens free, {n} are needed; raise kv_pool_mb"
            )
        self.reserved += n
        return Reservation(n)

    def unreserve(self, reservation: Reservation) -> None:
        """Give back what is left of a reservation."""
        self.reserved -= reservation.left
        reservation.left = 0

    def carve(self, source: Reservation, n: int) -> Reservation:
        """A reservation of `n` blocks taken from `source` (and from the free blocks where
        `source` holds fewer)."""
        moved = min(n, source.left)
        source.left -= moved
        more = self.reserve(n - moved) if n > moved else Reservation()
        return Reservation(moved + more.left)

    # ------------------------------------------------------------------ blocks

    def take(self, reservation: Reservation) -> int:
        """A free block, from `reservation` (or from the unreserved ones when it is spent)."""
        if reservation.left > 0:
            reservation.left -= 1
            self.reserved -= 1
        elif self.available <= 0:
            raise KVPoolFull(f"the KV pool's {self.blocks} blocks are all in use")
        block = heapq.heappop(self._free)
        self.refs[block] = 1
        self.peak = max(self.peak, self.in_use)
        return block

    def share(self, table: BlockTable, tokens: int) -> BlockTable:
        """A new table of the first `tokens` tokens of `table`, sharing its blocks."""
        blocks = table.blocks[: self.blocks_for(tokens)]
        for b in blocks:
            self.refs[b] += 1
        return BlockTable(list(blocks), tokens)

    def release(self, table: BlockTable) -> None:
        """Drop `table`'s references; blocks nobody holds are free again."""
        for b in table.blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                heapq.heappush(self._free, b)
        table.blocks = []

    def grow(self, table: BlockTable, tokens: int, reservation: Reservation) -> None:
        """Make room in `table` for `tokens` tokens: its partly filled last block copied
        first when another holder shares it, then new blocks."""
        part = table.length % self.block_tokens
        if part and tokens > table.length and self.refs[table.blocks[-1]] > 1:
            old = table.blocks[-1]
            new = self.take(reservation)
            self._copy(old, new, part)
            self.refs[old] -= 1
            table.blocks[-1] = new
        while len(table.blocks) * self.block_tokens < tokens:
            table.blocks.append(self.take(reservation))

    def rebuild(self, tables: Iterable[BlockTable]) -> None:
        """Count references again from the tables that are still held (after a failure
        left the books unknown); every reservation is dropped."""
        self.refs = [0] * len(self.refs)
        for table in tables:
            for b in table.blocks:
                self.refs[b] += 1
        self._free = [b for b in range(RESERVED_BLOCKS, len(self.refs)) if not self.refs[b]]
        heapq.heapify(self._free)
        self.reserved = 0

    def _copy(self, src: int, dst: int, tokens: int) -> None:
        import torch

        a, b = src * self.block_tokens, dst * self.block_tokens
        with torch.inference_mode():  # the pool is made of inference tensors
            self.keys[:, b : b + tokens] = self.keys[:, a : a + tokens]
            self.values[:, b : b + tokens] = self.values[:, a : a + tokens]

    # ------------------------------------------------------------------ slots

    def slot_index(self, tables: list[BlockTable], start: Any, count: Any, width: int) -> Any:
        """[rows, width] pool slots: row i's tokens start[i] .. start[i] + count[i] - 1, right
        aligned (the last in column width - 1), and -1 in the columns before them."""
        import torch

        bs = self.block_tokens
        most = max(1, max(len(t.blocks) for t in tables))
        blocks = torch.tensor([t.blocks + [0] * (most - len(t.blocks)) for t in tables])
        token = torch.arange(width)[None, :] - (width - count)[:, None]  # row token number
        valid = token >= 0
        token = (token.clamp(min=0) + start[:, None]).clamp(max=most * bs - 1)
        slots = blocks.gather(1, token // bs) * bs + token % bs
        return torch.where(valid, slots, -1)


def check_pool_mb(pool_mb: float | None) -> None:
    if pool_mb is not None and not (isinstance(pool_mb, int | float) and pool_mb > 0):
        raise ConfigError(f"kv_pool_mb must be > 0 (or None: the default), got {pool_mb!r}")
