"""The key/value cache of prompt prefixes that many requests share, kept between requests.

Every rollout of a skill starts with the same tokens (the chat template's header, the skill's
rules and worked examples, the memory, the tool schemas); only the example differs. The local
engine computes such a prefix's keys and values once, keeps them here, and prefills each new
prompt from the end of its longest cached prefix on (`selftaught.models.batching`). vLLM and
SGLang do the same server-side (automatic prefix caching, RadixAttention).

An LRU of entries keyed by their token ids, bounded in bytes. A prompt may use any leading
part of an entry (the keys and values of the first m tokens of a prefix are those of the
first m tokens of any prompt that starts with them: attention is causal), so one entry also
serves prompts that share only the template's header with it. The cache holds the weights of
one moment: `sync` clears it when the model's state (parameters, active adapters) changed.

With the KV block pool (`selftaught.models.kv_pool`) an entry holds block references, not
tensors: `release` gives them back when the entry leaves, and an entry pinned by an
admission that counted on it is never evicted while pinned.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from selftaught.errors import ConfigError

DEFAULT_PREFIX_CACHE_MB = 256.0  # on a CPU, SmolLM2-135M: ~46 KB a token, ~5,800 tokens


@dataclass(eq=False)
class PrefixEntry:
    """One cached prefix: its tokens and, per layer, keys and values [1, heads, len, dim]
    (with the KV pool: its block table)."""

    tokens: tuple[int, ...]
    kv: Any  # list[tuple[keys, values]] per layer, or a kv_pool.BlockTable
    nbytes: int

    def head(self, n: int) -> list[tuple[Any, Any]]:
        """The keys and values of the first `n` tokens (views, no copy)."""
        kv: list[tuple[Any, Any]] = self.kv
        if n == len(self.tokens):
            return kv
        return [(k[:, :, :n], v[:, :, :n]) for k, v in kv]


class PrefixCache:
    """Prompt-prefix key/value caches, least recently used dropped first.

    Args:
        max_bytes: most bytes of keys and values kept; an entry larger than that is not kept.
        release: called with an entry's `kv` when the entry leaves the cache (the KV pool
            frees its blocks); None for tensors, which go with their last reference.
    """

    def __init__(self, max_bytes: int, release: Callable[[Any], None] | None = None) -> None:
        if max_bytes < 0:
            raise ConfigError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], PrefixEntry] = OrderedDict()
        self._version: Hashable = None
        self._release = release
        self._pins: dict[int, int] = {}  # id(entry) -> admissions counting on it
        self.nbytes = 0
        self.evictions = 0
        self.invalidations = 0

    def __len__(self) -> int:
        return len(self._entries)

    def sync(self, version: Hashable) -> None:
        """Forget every entry when the model's state is not the one they were computed with."""
        if version != self._version:
            if self._entries:
                self.invalidations += 1
            self.clear()
            self._version = version

    def clear(self) -> None:
        for entry in list(self._entries.values()):
            self._drop(entry)
        self._pins.clear()

    def __iter__(self) -> Iterator[PrefixEntry]:
        return iter(list(self._entries.values()))

    def holds(self, entry: PrefixEntry) -> bool:
        return self._entries.get(entry.tokens) is entry

    def pin(self, entry: PrefixEntry) -> None:
        """Keep `entry` from eviction until as many `unpin`s (an admission counted on it)."""
        self._pins[id(entry)] = self._pins.get(id(entry), 0) + 1

    def unpin(self, entry: PrefixEntry) -> None:
        left = self._pins.get(id(entry), 0) - 1
        if left > 0:
            self._pins[id(entry)] = left
        else:
            self._pins.pop(id(entry), None)

    def evict_oldest(self, keep: Collection[PrefixEntry] = ()) -> bool:
        """Drop the least recently used entry that is neither pinned nor in `keep`; False
        when there is none."""
        for entry in self._entries.values():
            if id(entry) not in self._pins and entry not in keep:
                self._drop(entry)
                self.evictions += 1
                return True
        return False

    def match(
        self, prompt: Sequence[int], limit: int | None = None
    ) -> tuple[int, PrefixEntry | None]:
        """The longest cached prefix of `prompt`, at most `limit` tokens: its length and
        the entry it is the head of (0, None when none). The entry becomes the most recent."""
        limit = len(prompt) if limit is None else min(limit, len(prompt))
        best, found = 0, None
        for entry in self._entries.values():
            n = min(common_prefix_len(entry.tokens, prompt), limit)
            if n > best:
                best, found = n, entry
        if found is not None:
            self._entries.move_to_end(found.tokens)
        return best, found

    def put(self, tokens: tuple[int, ...], kv: Any, nbytes: int | None = None) -> PrefixEntry:
        """Keep `kv` (contiguous tensors, or a block table of `nbytes`) as the prefix
        `tokens`, dropping the least recently used entries to stay within `max_bytes`, and
        entries that are a head of it (it serves their prompts too); pinned entries stay.
        Returns the entry, kept or not (one not kept is still the caller's: `holds` says)."""
        if nbytes is None:
            nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
        entry = PrefixEntry(tokens, kv, nbytes)
        if tokens in self._entries:  # kept already: the caller keeps the new one
            self._entries.move_to_end(tokens)
            return entry
        if entry.nbytes > self.max_bytes:
            return entry
        for old in [e for e in self._entries.values() if tokens[: len(e.tokens)] == e.tokens]:
            if id(old) not in self._pins:
                self._drop(old)
        while self.nbytes + entry.nbytes > self.max_bytes:
            if not self.evict_oldest():
                return entry  # the rest is pinned: not kept
        self._entries[tokens] = entry
        self.nbytes += entry.nbytes
        return entry

    def _drop(self, entry: PrefixEntry) -> None:
        del self._entries[entry.tokens]
        self.nbytes -= entry.nbytes
        if self._release is not None:
            self._release(entry.kv)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share (slice comparisons run in C: a binary search
    over them beats a Python loop over thousands of tokens)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def model_state(model: Any) -> Hashable:
    """What the cached keys and values depend on: each parameter's identity and in-place
    version counter (an optimizer step, `load_state_dict`, a merged adapter or swapped modules
    change it) and, for a peft model, which adapters are active, disabled or merged (switching
    them changes no parameter)."""
    weights = tuple((id(p), p._version) for p in model.parameters())
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return weights
    adapters = tuple(
        (bool(m.disable_adapters), tuple(m.active_adapters), tuple(m.merged_adapters))
        for m in model.modules()
        if isinstance(m, BaseTunerLayer)
    )
    return weights, adapters
