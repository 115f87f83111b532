"""Continuous batching over a transformers model's KV cache.

The running batch is one left-padded `DynamicCache`: row i holds its prompt and the tokens
generated so far, right-aligned, with an attention mask marking its valid columns. Each
`step` feeds every row's last token; a row that ends (EOS, its token cap, a stop string) is
evicted at once and its slot refilled by `admit`, which prefills the newcomers together (one
forward per distinct prompt, so n samples of one prompt share it), left-pads the shorter of
the two caches and stacks them. Leading columns that every row has as padding are dropped
when rows leave.

A prompt prefix that recent prompts share (the chat template's system prompt, a skill, its
worked examples, the tool schemas) is computed once and kept in a `PrefixCache` (an LRU
bounded in bytes, cleared when the weights change): a newcomer starting with a cached prefix
prefills only the rest of its prompt, after a copy of the prefix's KV (its row is then
[padding | prefix | padding | rest], the holes masked out; rows of one prefill may start from
different prefixes). Under SkillOpt every rollout starts with the same skill, so most of the
prompt is never computed twice, also across batches and idle periods.

Two settings change how the batch is laid out, both off by default (their defaults wait for
the benchmark, `benchmarks/bench_generation.py --engine-arms`):
- `prefill_chunk` (chunked prefill, vLLM's): newcomers are not prefilled in a forward of their
  own that stalls every running row; each `step` runs at most one chunk of their prefill (at
  most `prefill_chunk` tokens, rows x columns) before the running rows' decode, and they join
  the batch when their last chunk is done.
- `compact_at` (compaction): rows that continue a cached prefix hold a hole of padding between
  the prefix and the rest of their prompt ([padding | prefix | padding | rest]); once the
  columns that no row needs are at least this fraction of the cache's width, every row's
  valid columns are packed to the right (one copy of the cache), so the batch is as wide as
  its longest live row. Keys are stored with their rotary positions applied and position ids
  are kept per row, so moving a column changes no row's positions.

Position ids are each row's own token count, exactly what `generate` computes for a
left-padded batch, so greedy rows decode the same tokens as unbatched greedy decoding (in
float32; bfloat16 rounds differently per batch shape).
Sampling is per row (temperature, top_p, and a private `torch.Generator` each), so greedy and
sampled requests share one batch and a seeded row never touches torch's global RNG.

Why not transformers' own continuous batching (`generate_batch` / `init_continuous_batching`,
5.23): on this CPU it decoded SmolLM2-135M at 19-35 tok/s at batch 8 with every sequence
forced to 48 tokens, against 54 tok/s for plain `generate` (its paged cache attends over the
whole packed batch); on 16 task prompts its useful throughput was 29 tok/s, 0.54x the raw rate.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from selftaught.errors import ConfigError, RunError
from selftaught.models.prefix_cache import (
    DEFAULT_PREFIX_CACHE_MB,
    PrefixCache,
    common_prefix_len,
    model_state,
)

_RECENT_PROMPTS = 16  # prompts a newcomer's prefix is compared with to find a shared one
_HEADROOM = 64  # spare columns a cache buffer is given, at least (a quarter of its width, at most)
DEFAULT_PREFILL_CHUNK: int | None = None  # off: no gain on a 2-core CPU (benchmarks/README.md)
DEFAULT_COMPACT_AT: float | None = None  # off: never fired there (padding lies between rows)


@dataclass(eq=False)
class GenSequence:
    """One sequence being generated: a prompt, its sampling settings, the tokens so far.

    `owner` is whatever the caller uses to route the result (opaque here); `index` is the
    sample's position among its owner's n samples."""

    owner: Any
    index: int
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    generator: Any = None  # a torch.Generator for sampled rows
    stop: list[str] | None = None
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" once finished
    stop_text: str | None = None  # the reply cut before a stop string, when one ended it
    first_token_at: float | None = None  # time.perf_counter() when its first token was sampled
    keep_kv: bool = False  # cache its keys and values when it ends (a turn more will follow)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class BatcherStats:
    """What the batcher did (cumulative): forward passes and the batch sizes it ran."""

    prefill_calls: int = 0  # forwards that admitted new sequences
    prefilled_prompts: int = 0  # distinct prompts prefilled (n samples of one share one)
    admitted: int = 0  # sequences admitted
    refills: int = 0  # admissions into a batch that was still running
    decode_steps: int = 0
    prefilled_tokens: int = 0  # prompt tokens run through prefill (a cached prefix is not)
    prefix_builds: int = 0  # shared prefixes computed and cached
    prefix_hits: int = 0  # prompts prefilled after a cached prefix
    prefix_tokens_reused: int = 0  # prompt tokens taken from the prefix cache, not computed
    replies_cached: int = 0  # finished conversations kept as prefixes of their next turn
    decoded_tokens: int = 0  # tokens sampled by decode steps (one per live row per step)
    max_rows: int = 0  # largest running batch seen
    prefill_seconds: float = 0.0  # in prefill forwards (prefix builds included)
    decode_seconds: float = 0.0  # in decode-step forwards
    decode_rows: dict[int, int] = field(default_factory=dict)  # rows in a step -> steps
    max_prefill_tokens: int = 0  # most tokens (rows x columns, padding included) in one prefill
    prefill_chunks: int = 0  # prefill forwards run as one chunk each (prefill_chunk set)
    compactions: int = 0  # times the running cache was packed (compact_at set)
    compacted_columns: int = 0  # cache columns those packings dropped
    decode_columns: int = 0  # key columns attended by decode steps (rows x width, summed)
    decode_live_columns: int = 0  # of those, each row's own tokens (the rest is padding)
    kv_pool_blocks: int = 0  # blocks of the KV pool (0: the dynamic cache)
    kv_block_tokens: int = 0  # tokens a block holds
    kv_peak_blocks: int = 0  # most blocks in use at once
    kv_waits: int = 0  # admissions that left newcomers waiting for the pool


class UnsupportedCacheError(RunError):
    """The model's KV cache is not a list of plain full-attention key/value tensors."""


@dataclass
class Prefilled:
    """Rows prefilled together, before they join the running batch: their cache, attention
    mask, next token, its position id, and how many leading columns of each row are
    padding. (With the KV pool, `cache` is the rows' block tables and the rest is None.)"""

    rows: list[GenSequence]
    cache: Any
    mask: Any  # [rows, width] long
    last: Any  # [rows] the token to feed next
    positions: Any  # [rows] its position id (= the row's tokens in the cache)
    lead: Any  # [rows] leading padding columns


@dataclass
class CachedHead:
    """The cached prefix a prompt is prefilled after: its length and its keys and values per
    layer ([1, heads, length, dim]); length 0 for none."""

    length: int = 0
    entry: Any = None  # the PrefixEntry it is the head of

    @property
    def kv(self) -> list[tuple[Any, Any]]:
        kv: list[tuple[Any, Any]] = self.entry.head(self.length)
        return kv


@dataclass
class _Forward:
    """What one prefill forward left: its cache, attention mask, last-position logits, and
    each row's leading padding columns."""

    cache: Any
    mask: Any
    logits: Any
    lead: list[int]


@dataclass(eq=False)
class _Joining:
    """Sequences being prefilled in chunks (`prefill_chunk` set): their admission, paused
    before each forward, resumed one forward per step."""

    members: list[GenSequence]
    steps: Generator[None, None, Prefilled]
    started: bool = False


class ContinuousBatcher:
    """The slot-refill decoding loop for one causal LM (not thread-safe: one driver thread).

    Args:
        model: a transformers causal LM (a peft wrapper too), on its device and dtype.
        eos_ids: token ids that end a reply.
        pad_id: the id put in padded positions (masked out, so any valid id).
        decode: token ids → text, used to look for stop strings while generating.
        stats: where to count (a fresh `BatcherStats` by default).
        min_prefix: shortest shared prompt prefix worth caching (tokens).
        prefix_cache_mb: most megabytes of cached prefix keys/values; 0 turns prefix reuse
            off (every prompt is prefilled whole).
        state: what the cached prefixes depend on (default `model_state`: the parameters'
            versions and the active adapters); taken when an idle batcher admits, since an
            in-memory model may be trained between busy periods.
        prefill_chunk: most tokens (rows x columns) in one prefill forward; newcomers are then
            prefilled one chunk per `step`, beside the running rows' decode (at least one
            column a chunk). None: one forward per admission, in `admit`.
        compact_at: pack the running cache when the columns no row needs are at least this
            fraction (0 < f <= 1) of its width. None: never (leading columns that are
            padding in every row are still dropped whenever rows leave).
    """

    def __init__(
        self,
        model: Any,
        eos_ids: Sequence[int],
        pad_id: int,
        decode: Callable[[list[int]], str],
        stats: BatcherStats | None = None,
        min_prefix: int = 16,
        prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB,
        state: Callable[[], Hashable] | None = None,
        prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
        compact_at: float | None = DEFAULT_COMPACT_AT,
    ) -> None:
        import torch

        check_engine_settings(prefill_chunk, compact_at)

        self.torch = torch
        self.model = model
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.pad_id = int(pad_id)
        self.decode = decode
        self.min_prefix = min_prefix
        self.device = model_device(model)
        self.stats = stats if stats is not None else BatcherStats()
        self._keep_logits = _accepts_logits_to_keep(model)
        self.rows: list[GenSequence] = []
        self._run: Prefilled | None = None  # the running batch (its rows are self.rows)
        self.prefix_cache = (
            PrefixCache(int(prefix_cache_mb * 2**20)) if prefix_cache_mb > 0 else None
        )
        self._state = state or (lambda: model_state(model))
        self._recent: deque[tuple[int, ...]] = deque(maxlen=_RECENT_PROMPTS)
        self.prefill_chunk = prefill_chunk
        self.compact_at = compact_at
        self._joining: deque[_Joining] = deque()
        self._train_when_idle = False  # the model was in train mode: back to it when idle

    # ------------------------------------------------------------------ public

    def admit(self, sequences: list[GenSequence]) -> list[GenSequence]:
        """Prefill `sequences`, sample their first token and add them to the running batch.
        Returns the ones already finished (they are not kept). With `prefill_chunk` set, only
        queue them: the next steps prefill them, and `step` returns those that finish."""
        if not sequences:
            return []
        try:
            with self.torch.inference_mode():  # the cache is made of inference tensors
                return self._admit(sequences)
        finally:
            self._when_idle()

    def step(self) -> list[GenSequence]:
        """One decode step for every running row, after one prefill chunk of the sequences
        joining (`prefill_chunk` set; they join once prefilled). Returns the rows that
        finished."""
        if not self.rows and not self._joining:
            return []
        try:
            with self.torch.inference_mode():
                done = self._advance_joining() if self._joining else []
                if self.rows:
                    done += self._step()
                return done
        finally:
            self._when_idle()

    def fits(self, sequences: Sequence[GenSequence]) -> int:
        """How many of `sequences`, from the first, the cache can take now (the rest wait
        for running rows to end). The dynamic cache grows: all of them."""
        return len(sequences)

    def drop(self, predicate: Callable[[GenSequence], bool]) -> list[GenSequence]:
        """Evict the running rows for which `predicate` holds (e.g. abandoned requests), and
        the admissions still being prefilled whose sequences all match (a partly abandoned
        one joins, and its rows go at the next drop)."""
        gone = [s for s in self.rows if predicate(s)]
        if gone:
            with self.torch.inference_mode():
                self._keep([i for i, s in enumerate(self.rows) if not predicate(s)])
        for job in [j for j in self._joining if all(predicate(s) for s in j.members)]:
            self._joining.remove(job)
            job.steps.close()  # what it holds goes back (the KV pool's blocks)
            gone += job.members
        self._when_idle()
        return gone

    def reset(self) -> None:
        """Forget every running row and joining sequence (after an error). Cached prefixes
        stay: they are checked against the model's state before an idle batcher uses them
        again."""
        self.rows, self._run = [], None
        for job in self._joining:
            job.steps.close()
        self._joining.clear()
        self._when_idle()

    @property
    def in_flight(self) -> list[GenSequence]:
        """The running rows, then the sequences still being prefilled."""
        return self.rows + [s for job in self._joining for s in job.members]

    @property
    def width(self) -> int:
        """Columns in the running cache."""
        return 0 if self._run is None else int(self._run.mask.shape[1])

    # ------------------------------------------------------------------ internals

    def _admit(self, sequences: list[GenSequence]) -> list[GenSequence]:
        if self.prefill_chunk is not None:
            self._joining.append(_Joining(list(sequences), self._admission(sequences)))
            return []
        self._merge(_run_through(self._admission(sequences)))
        return self._evict_finished()

    def _admission(self, sequences: list[GenSequence]) -> Generator[None, None, Prefilled]:
        """Prefill `sequences` (shared prefixes first): their block, first tokens sampled.
        Pauses before each forward (run through at once, or one forward a step)."""
        if not self.rows and self.prefix_cache is not None:
            self.prefix_cache.sync(self._state())  # weights change only between busy periods
        prompts = list(dict.fromkeys(tuple(s.prompt_ids) for s in sequences))
        heads = yield from self._heads(prompts)
        block = yield from self._prefill(prompts, heads, sequences)
        self.stats.admitted += len(sequences)
        self._recent.extend([p for p in prompts if p not in self._recent])
        return block

    def _advance_joining(self) -> list[GenSequence]:
        """One prefill forward of the first joining admission; once it is done, its rows
        join the batch. Returns those already finished."""
        job = self._joining[0]
        done, block = False, None
        if not job.started:  # run it to just before its first forward
            job.started = True
            done, block = resume_admission(job.steps)
        if not done:
            done, block = resume_admission(job.steps)
        if not done:
            return []
        self._joining.popleft()
        assert block is not None
        self._merge(block)
        return self._evict_finished()

    def _heads(self, prompts: list[tuple[int, ...]]) -> Generator[None, None, list[CachedHead]]:
        """Per prompt, the cached prefix to prefill it after (at least `min_prefix` tokens,
        leaving it a token to prefill), or an empty head. A prefix that a prompt shares with
        another newcomer or a recent prompt, longer than what is cached by `min_prefix`
        tokens, is computed and cached first."""
        cache = self.prefix_cache
        if cache is None:
            return [CachedHead() for _ in prompts]
        built = yield from self._build_shared(prompts, cache)  # kept, or used once if too large
        heads = []
        for p in prompts:
            n, entry = cache.match(p, len(p) - 1)
            for e in built:
                m = min(common_prefix_len(e.tokens, p), len(p) - 1)
                if m > n:
                    n, entry = m, e
            if entry is None or n < self.min_prefix:
                heads.append(CachedHead())
                continue
            heads.append(CachedHead(n, entry))
            self.stats.prefix_hits += 1
            self.stats.prefix_tokens_reused += n
        return heads

    def _build_shared(
        self, prompts: list[tuple[int, ...]], cache: PrefixCache
    ) -> Generator[None, None, list[Any]]:
        """Compute and cache the prefixes newcomers share with each other or with recent
        prompts, longest first (a later one usually finds the earlier one cached and
        needs nothing). Returns the built entries (also those too large to keep)."""
        shares = longest_shared_prefixes(prompts, [q for q in self._recent if q not in prompts])
        wanted = [(min(shared, len(p) - 1), p) for p, shared in zip(prompts, shares, strict=True)]
        built: list[Any] = []
        for shared, p in sorted(wanted, key=lambda w: -w[0]):
            have = max(
                [cache.match(p, shared)[0]]
                + [min(common_prefix_len(e.tokens, p), shared) for e in built]
            )
            if shared >= max(self.min_prefix, have + self.min_prefix):
                built.append((yield from self._build_prefix(p[:shared], cache)))
        return built

    def _build_prefix(
        self, prefix: tuple[int, ...], cache: PrefixCache
    ) -> Generator[None, None, Any]:
        """One forward for `prefix` (after its longest cached head), its keys and values
        cached as a new entry."""
        n, entry = cache.match(prefix, len(prefix) - 1)
        head = CachedHead(n, entry) if entry is not None and n >= self.min_prefix else CachedHead()
        run = yield from self._forward_rows([prefix[head.length :]], [head])
        valid = run.mask[0].bool()
        kv = [(ly.keys[:, :, valid], ly.values[:, :, valid]) for ly in run.cache.layers]
        self.stats.prefix_builds += 1
        self.stats.prefilled_tokens += len(prefix) - head.length
        return cache.put(prefix, kv)

    def _forward_rows(
        self, rests: list[tuple[int, ...]], heads: list[CachedHead]
    ) -> Generator[None, None, _Forward]:
        """The forward for rows that each continue a cached head with their rest: row i is
        [padding | head i | padding | rest i] (no head: [padding | rest i]), the padding
        masked out, positions counting each row's own tokens. One forward, or with
        `prefill_chunk` one per chunk of columns; pauses before each."""
        torch = self.torch
        n, width = len(rests), max(len(r) for r in rests)
        ids, mask, positions = left_padded(rests, [h.length for h in heads], self.pad_id)
        cache = _new_cache()
        head_width = max(h.length for h in heads)
        if head_width:
            for i, (keys, values) in enumerate(_stack_heads(heads, head_width)):
                cache.update(keys.to(self.device), values.to(self.device), i)
            head_mask = torch.zeros((n, head_width), dtype=torch.long)
            for row, h in enumerate(heads):
                if h.length:
                    head_mask[row, head_width - h.length :] = 1
            mask = torch.cat([head_mask, mask], dim=1)
        mask, ids, positions = mask.to(self.device), ids.to(self.device), positions.to(self.device)
        chunked = self.prefill_chunk is not None
        span = max(1, self.prefill_chunk // n) if self.prefill_chunk is not None else width
        for start in range(0, width, span):
            end = min(start + span, width)
            yield
            logits = self._forward(
                ids[:, start:end],
                mask[:, : head_width + end],
                positions[:, start:end],
                cache,
                prefill=True,
            )
            self.stats.max_prefill_tokens = max(self.stats.max_prefill_tokens, n * (end - start))
            self.stats.prefill_chunks += int(chunked)
        _check_cache(cache)
        lead = [
            head_width - h.length if h.length else head_width + width - len(r)
            for h, r in zip(heads, rests, strict=True)
        ]
        return _Forward(cache, mask, logits, lead)

    def _prefill(
        self, prompts: list[tuple[int, ...]], heads: list[CachedHead], members: list[GenSequence]
    ) -> Generator[None, None, Prefilled]:
        """One forward for `prompts` (their parts after their heads), then one row per member
        sequence (n samples of a prompt share its prefill), first tokens sampled."""
        torch = self.torch
        rests = [p[h.length :] for p, h in zip(prompts, heads, strict=True)]
        run = yield from self._forward_rows(rests, heads)
        self.stats.prefill_calls += 1
        self.stats.prefilled_prompts += len(rests)
        self.stats.prefilled_tokens += sum(len(r) for r in rests)
        cache, mask, logits = run.cache, run.mask, run.logits
        where = {p: i for i, p in enumerate(prompts)}
        rows = [where[tuple(s.prompt_ids)] for s in members]
        index = torch.tensor(rows, device=self.device)
        if rows != list(range(len(rests))):  # samples share their prompt's prefill
            for layer in cache.layers:
                layer.select(index)
            mask, logits = mask[index], logits[index]
        first = self._sample(logits, members)
        for s, token in zip(members, first, strict=True):
            self._append(s, token)
        return Prefilled(
            rows=list(members),
            cache=cache,
            mask=mask,
            last=torch.tensor(first, device=self.device),
            positions=torch.tensor([len(s.prompt_ids) for s in members], device=self.device),
            lead=torch.tensor(run.lead, device=self.device)[index],
        )

    def _step(self) -> list[GenSequence]:
        torch = self.torch
        run = self._run
        assert run is not None
        ones = torch.ones((len(self.rows), 1), dtype=run.mask.dtype, device=self.device)
        run.mask = torch.cat([run.mask, ones], dim=1)
        logits = self._forward(run.last[:, None], run.mask, run.positions[:, None], run.cache)
        run.positions = run.positions + 1
        tokens = self._sample(logits, self.rows)
        self.stats.decode_steps += 1
        self.stats.decoded_tokens += len(tokens)
        rows = self.stats.decode_rows
        rows[len(tokens)] = rows.get(len(tokens), 0) + 1
        self.stats.decode_columns += len(tokens) * int(run.mask.shape[1])
        self.stats.decode_live_columns += sum(len(s.prompt_ids) + len(s.tokens) for s in self.rows)
        run.last = torch.tensor(tokens, device=self.device)
        for s, token in zip(self.rows, tokens, strict=True):
            self._append(s, token)
        return self._evict_finished()

    def _forward(
        self, ids: Any, mask: Any, positions: Any, cache: Any, prefill: bool = False
    ) -> Any:
        """Last-position logits [rows, vocab] in float32, in eval mode. Its time is counted
        as prefill or decode.

        Switching modes walks every module (0.9 ms for 30 layers, measured on a 2-core CPU),
        so it is done when needed, not every step: at each prefill (the whole tree, a
        submodule switched meanwhile included) and whenever the model is found in train mode.
        A model found training (a trainer holds it) goes back to train mode once this batcher
        is idle (`_when_idle`), before the replies it was generating are handed over."""
        model = self.model
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if self._keep_logits else {}
        if prefill or model.training:
            self._train_when_idle = self._train_when_idle or model.training
            model.eval()
        t0 = time.perf_counter()
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **kwargs,
        )
        logits = out.logits[:, -1, :].float()
        seconds = time.perf_counter() - t0
        if prefill:
            self.stats.prefill_seconds += seconds
        else:
            self.stats.decode_seconds += seconds
        return logits

    def _when_idle(self) -> None:
        """Once nothing runs or joins: a model found in train mode goes back to it."""
        if self._train_when_idle and not self.rows and not self._joining:
            self._train_when_idle = False
            self.model.train()

    def _merge(self, block: Prefilled) -> None:
        """Add a prefilled block to the running batch, left-padding the narrower of the two."""
        torch = self.torch
        if self.rows:
            self.stats.refills += 1
        run = self._run
        if run is None or not self.rows:
            self._run, self.rows = block, list(block.rows)
        else:
            width = max(self.width, int(block.mask.shape[1]))
            old_pad, new_pad = width - self.width, width - int(block.mask.shape[1])
            for old, new in zip(run.cache.layers, block.cache.layers, strict=True):
                old.stack(new, old_pad, new_pad)
            run.mask = torch.cat(
                [_pad_left(run.mask, old_pad, dim=1), _pad_left(block.mask, new_pad, dim=1)]
            )
            run.last = torch.cat([run.last, block.last])
            run.positions = torch.cat([run.positions, block.positions])
            run.lead = torch.cat([run.lead + old_pad, block.lead + new_pad])
            self.rows.extend(block.rows)
        self.stats.max_rows = max(self.stats.max_rows, len(self.rows))
        self._maybe_compact()

    def _append(self, s: GenSequence, token: int) -> None:
        if not s.tokens:
            s.first_token_at = time.perf_counter()
        s.tokens.append(token)
        if token in self.eos_ids or (s.stop and self._cut_at_stop(s)):
            s.finish_reason = "stop"
        elif len(s.tokens) >= s.max_new_tokens:
            s.finish_reason = "length"

    def _cut_at_stop(self, s: GenSequence) -> bool:
        text = self.decode(s.tokens)
        cut = min((i for i in (text.find(x) for x in s.stop or () if x) if i >= 0), default=-1)
        if cut < 0:
            return False
        s.stop_text = text[:cut]
        return True

    def _evict_finished(self) -> list[GenSequence]:
        done = [s for s in self.rows if s.finished]
        if done:
            self._cache_replies([i for i, s in enumerate(self.rows) if s.finished and s.keep_kv])
            self._keep([i for i, s in enumerate(self.rows) if not s.finished])
        return done

    def _cache_replies(self, rows: list[int]) -> None:
        """Keep the keys and values of finished rows (prompt and reply, all but the last
        token, which was never fed) as cached prefixes: the next turn of an episode is this
        conversation plus a tool result, and prefills only what is new."""
        cache, run = self.prefix_cache, self._run
        if cache is None or run is None:
            return
        for i in rows:
            s = self.rows[i]
            valid = run.mask[i].bool()
            kv = [
                (ly.keys[i : i + 1, :, valid], ly.values[i : i + 1, :, valid])
                for ly in run.cache.layers
            ]
            cache.put(tuple(s.prompt_ids) + tuple(s.tokens[:-1]), kv)
            self.stats.replies_cached += 1

    def _keep(self, keep: list[int]) -> None:
        """Keep only rows `keep`, then drop the leading columns that are padding in every
        row."""
        run = self._run
        if not keep or run is None:
            self.rows, self._run = [], None  # the sequences joining stay
            return
        torch = self.torch
        index = torch.tensor(keep, device=self.device)
        self.rows = [self.rows[i] for i in keep]
        run.rows = self.rows
        run.mask, run.last = run.mask[index], run.last[index]
        run.positions, run.lead = run.positions[index], run.lead[index]
        crop = int(run.lead.min())
        for layer in run.cache.layers:
            layer.select(index, crop)
        run.mask, run.lead = run.mask[:, crop:], run.lead - crop
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        """With `compact_at` set: when the columns no row needs are at least that fraction of
        the cache's width, pack each row's valid columns to the right, in order. Only rows
        joining or leaving change that, so it is checked then, not every step."""
        run = self._run
        if self.compact_at is None or run is None or not self.rows:
            return
        torch = self.torch
        width = int(run.mask.shape[1])
        counts = run.mask.sum(dim=1)
        need = int(counts.max())
        if width - need < max(1.0, self.compact_at * width):
            return
        # Valid columns numbered from 1, padding 0: sorted, each row is its padding then its
        # valid columns in order; the last `need` are its packed layout.
        numbered = run.mask * torch.arange(1, width + 1, device=run.mask.device)
        order = numbered.sort(dim=1).values[:, width - need :]
        index = (order - 1).clamp(min=0)
        for layer in run.cache.layers:
            layer.pack(index)
        run.mask = (order > 0).to(run.mask.dtype)
        run.lead = need - counts
        self.stats.compactions += 1
        self.stats.compacted_columns += width - need

    def _sample(self, logits: Any, rows: Sequence[GenSequence]) -> list[int]:
        """One token per row: argmax for greedy rows; for sampled rows temperature, top_p
        (nucleus, no top-k: OpenAI semantics) and one uniform draw from the row's generator."""
        torch = self.torch
        best = logits.argmax(dim=-1)
        sampled = [i for i, s in enumerate(rows) if s.temperature > 0]
        if not sampled:
            tokens: list[int] = best.tolist()  # the step's one wait for the device
            return tokens
        device = logits.device
        # The rows' settings and draws are made on the host and moved once each: no
        # decision here waits for the device.
        temps = torch.tensor([rows[i].temperature for i in sampled])
        top_p = torch.tensor([rows[i].top_p for i in sampled])
        nucleus = bool((top_p < 1).any())
        draws = torch.stack([torch.rand((), generator=rows[i].generator) for i in sampled])
        index = torch.tensor(sampled).to(device)
        temps, top_p, draws = temps.to(device), top_p.to(device), draws.to(device)
        probs = torch.softmax(logits[index] / temps[:, None], dim=-1)
        order = None
        if nucleus:
            probs, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest head whose mass reaches top_p (always the top token).
            outside = probs.cumsum(dim=-1) - probs >= top_p[:, None]
            probs = probs.masked_fill(outside, 0.0)
        cdf = probs.cumsum(dim=-1)
        targets = draws[:, None] * cdf[:, -1:]
        picks = torch.searchsorted(cdf, targets, right=True).clamp(max=cdf.shape[-1] - 1)
        if order is not None:
            picks = order.gather(-1, picks)
        best[index] = picks[:, 0]
        tokens = best.tolist()  # the step's one wait for the device
        return tokens


# ---------------------------------------------------------------------- helpers


def _stack_heads(heads: list[CachedHead], width: int) -> list[tuple[Any, Any]]:
    """Per layer, the heads' keys and values stacked into [rows, heads, width, dim], each
    left-padded with zeros to `width` (a row without a head is all padding)."""
    import torch

    first = next(h for h in heads if h.length)
    if all(h.entry is first.entry and h.length == width for h in heads):  # the usual case
        return [
            (k.expand(len(heads), -1, -1, -1), v.expand(len(heads), -1, -1, -1))
            for k, v in first.kv
        ]
    kvs = [h.kv if h.length else None for h in heads]
    layers = []
    for i, (k0, _) in enumerate(first.kv):
        empty = k0.new_zeros((1, k0.shape[1], width, k0.shape[3]))
        parts = [
            [_pad_left(t, width - h.length) for t in kv[i]] if kv else [empty, empty]
            for h, kv in zip(heads, kvs, strict=True)
        ]
        layers.append((torch.cat([k for k, _ in parts]), torch.cat([v for _, v in parts])))
    return layers


def longest_shared_prefixes(
    prompts: Sequence[tuple[int, ...]], others: Sequence[tuple[int, ...]] = ()
) -> list[int]:
    """For each of `prompts` (distinct), the longest prefix it shares with another prompt or
    one of `others`. In sorted order the most alike of a set are neighbours, so each prompt is
    compared with its two, not with all (the first admission of a busy period brings many)."""
    pool = sorted({*prompts, *others})
    where = {p: i for i, p in enumerate(pool)}
    shares = []
    for p in prompts:
        i = where[p]
        near = [pool[j] for j in (i - 1, i + 1) if 0 <= j < len(pool)]
        shares.append(max((common_prefix_len(p, q) for q in near), default=0))
    return shares


def left_padded(rests: Sequence[Sequence[int]], starts: Sequence[int], pad_id: int) -> Any:
    """The prefill's inputs for rows that continue `starts[i]` cached tokens with `rests[i]`:
    token ids [rows, width] left-padded with `pad_id`, the mask of real tokens, and position
    ids counting each row's own tokens (padding at 0)."""
    import torch

    n, width = len(rests), max(len(r) for r in rests)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for row, rest in enumerate(rests):
        ids[row, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
        mask[row, width - len(rest) :] = 1
    positions = torch.tensor(starts, dtype=torch.long)[:, None] + (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def check_engine_settings(prefill_chunk: int | None, compact_at: float | None) -> None:
    """Refuse a chunk under one token or a compaction threshold outside (0, 1]."""
    if prefill_chunk is not None and (isinstance(prefill_chunk, bool) or prefill_chunk < 1):
        raise ConfigError(f"prefill_chunk must be >= 1 token (or None: off), got {prefill_chunk}")
    if compact_at is not None and not 0 < compact_at <= 1:
        raise ConfigError(f"compact_at must be in (0, 1] (or None: off), got {compact_at}")


def resume_admission(steps: Generator[None, None, Prefilled]) -> tuple[bool, Prefilled | None]:
    """Run a paused admission to its next pause: (False, None), or (True, its block)."""
    try:
        next(steps)
    except StopIteration as stop:
        return True, stop.value
    return False, None


def _run_through(steps: Generator[None, None, Prefilled]) -> Prefilled:
    """Run an admission to its end, every forward at once."""
    while True:
        done, block = resume_admission(steps)
        if done:
            assert block is not None
            return block


def _pad_left(x: Any, n: int, dim: int = 2) -> Any:
    """`x` with `n` zero columns prepended along `dim` (2: a [rows, heads, time, dim] cache
    tensor; 1: a [rows, time] mask)."""
    if n == 0:
        return x
    import torch

    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def _new_cache() -> Any:
    """A `DynamicCache` whose layers are `_growing_layer()`s."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = _growing_layer()
    return cache


def _roomy(like: Any, n: int) -> Any:
    """An empty buffer shaped like `like`, with room for `n` columns and spare ones after."""
    rows, heads, _, dim = like.shape
    return like.new_empty((rows, heads, n + max(_HEADROOM, n // 4), dim))


def _packed(old: Any, index: Any) -> Any:
    """`old`'s columns `index[i]` for each row i, in a new buffer with spare columns after."""
    rows, heads, _, dim = old.shape
    n = int(index.shape[1])
    buffer = _roomy(old, n)
    buffer[:, :, :n] = old.gather(2, index[:, None, :, None].expand(rows, heads, n, dim))
    return buffer


# `DynamicLayer` with spare columns. transformers' layer concatenates on every update, so each
# decode step copies every row's whole history (measured: 13% of the quick-start eval's serving
# time); this one keeps keys and values in buffers with room to grow and writes one column a
# step, `keys` / `values` being views of the valid part.


@functools.cache
def _growing_layer() -> type:  # the layer class (above), made once transformers is imported
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        buffers: tuple[Any, Any] | None = None
        length = 0

        def update(self, key_states: Any, value_states: Any, *args: Any, **kw: Any) -> Any:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = self.length + key_states.shape[-2]
            if self.buffers is None or n > self.buffers[0].shape[-2]:
                self._reserve(n, key_states)
            keys, values = self._buffers()
            keys[:, :, self.length : n] = key_states
            values[:, :, self.length : n] = value_states
            self._set_length(n)
            return self.keys, self.values

        def _reserve(self, n: int, like: Any) -> None:
            keys, values = _roomy(like, n), _roomy(like, n)
            if self.length:
                keys[:, :, : self.length] = self.keys
                values[:, :, : self.length] = self.values
            self.buffers = (keys, values)

        def _buffers(self) -> tuple[Any, Any]:
            if self.buffers is None:  # `_reserve` runs first: never
                raise RunError("the layer's buffers are not reserved")
            return self.buffers

        def _set_length(self, n: int) -> None:
            keys, values = self._buffers()
            self.length = n
            self.keys, self.values = keys[:, :, :n], values[:, :, :n]

        def select(self, index: Any, crop: int = 0) -> None:
            """Keep rows `index` without their first `crop` columns (one copy)."""
            keys, values = self._buffers()
            self.buffers = (keys[index, :, crop:], values[index, :, crop:])
            self._set_length(self.length - crop)

        def pack(self, index: Any) -> None:
            """Keep, for each row i, the columns `index[i]` in that order (one copy)."""
            self.buffers = (_packed(self.keys, index), _packed(self.values, index))
            self._set_length(int(index.shape[1]))

        def stack(self, other: Any, pad: int, other_pad: int) -> None:
            """Append `other`'s rows below these, left-padded (`pad`, `other_pad`) to one width."""
            width = self.length + pad
            self.buffers = (
                _stacked(self.keys, other.keys, pad, other_pad, width),
                _stacked(self.values, other.values, pad, other_pad, width),
            )
            self._set_length(width)

        def reset(self) -> None:
            self.buffers, self.length = None, 0
            super().reset()

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ConfigError("crop takes the negative number of tokens to remove")
            if tokens_to_remove and self.is_initialized:
                self._set_length(self.length + tokens_to_remove)

        def batch_select_indices(self, indices: Any) -> None:
            if self.length:
                self.select(indices)

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.length:
                keys, values = self._buffers()
                self.buffers = (
                    keys.repeat_interleave(repeats, 0),
                    values.repeat_interleave(repeats, 0),
                )
                self._set_length(self.length)

    return GrowingLayer


def _stacked(mine: Any, theirs: Any, pad: int, their_pad: int, width: int) -> Any:
    """One buffer with `mine`'s rows over `theirs`, each left-padded with zeros to `width`
    columns, and spare columns after."""
    rows = mine.shape[0]
    size = (rows + theirs.shape[0], mine.shape[1], width + max(_HEADROOM, width // 4))
    buffer = mine.new_empty((*size, mine.shape[3]))
    buffer[:rows, :, :pad] = 0
    buffer[:rows, :, pad:width] = mine
    buffer[rows:, :, :their_pad] = 0
    buffer[rows:, :, their_pad:width] = theirs
    return buffer


def _check_cache(cache: Any) -> None:
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    for layer in getattr(cache, "layers", None) or [None]:
        ok = (
            isinstance(layer, DynamicLayer)
            and not isinstance(layer, DynamicSlidingWindowLayer)
            and (keys := getattr(layer, "keys", None)) is not None
            and keys.dim() == 4
        )
        if not ok:
            raise UnsupportedCacheError(
                f"continuous batching needs a plain key/value cache per layer; this model "
                f"uses {type(layer).__name__}"
            )


def model_device(model: Any) -> Any:
    device = getattr(model, "device", None)
    if device is None:
        device = next(model.parameters()).device
    return device


def _accepts_logits_to_keep(model: Any) -> bool:
    """Whether the causal LM's forward takes `logits_to_keep` (saves the vocab projection of
    every prompt token in a prefill)."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False
