"""The in-process local model: any transformers causal LM folder (or GGUF file), the embedded
SmolLM2-135M-Instruct by default, or a model already in memory (the one a trainer holds).

`LocalModel` is a facade over three parts, each usable alone:
- `selftaught.models.local_weights.LocalWeights`: which model this is and its weights (name,
  spec, folder, load / unload, fingerprint);
- `selftaught.models.local_prompts.ChatFormat`: the prompt format (chat template, offered
  tools, token ids in, reply text out);
- `selftaught.models.local_scheduler.RequestScheduler`: the requests of every thread and event
  loop, served by stepping the continuous batcher (`selftaught.models.batching`, the engine)
  in the thread of the loop that awaits them; its docstring says how.
The facade wires them together and keeps the hooks (`_ensure_loaded`, `_ensure_batcher`,
`_encode`, `_context_length`, `_completion`) a subclass may override.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from selftaught.errors import ConfigError, InputError
from selftaught.models.base import (
    AsyncChatModel,
    Completion,
    GenerationParams,
    Message,
    check_n,
    run_sync,
)
from selftaught.models.batching import (
    DEFAULT_COMPACT_AT,
    DEFAULT_PREFILL_CHUNK,
    BatcherStats,
    ContinuousBatcher,
    GenSequence,
    UnsupportedCacheError,
    check_engine_settings,
)
from selftaught.models.errors import FatalBackendError
from selftaught.models.kv_pool import (
    KVShape,
    check_pool_mb,
    default_pool_mb,
    kv_layout,
    kv_shape,
)
from selftaught.models.local_prompts import BACKEND, check_messages, check_params
from selftaught.models.local_scheduler import (
    FOLLOW_UP_TURNS,
    Driver,
    Request,
    RequestScheduler,
)
from selftaught.models.local_weights import LocalWeights
from selftaught.models.paged import PagedBatcher
from selftaught.models.prefix_cache import DEFAULT_PREFIX_CACHE_MB

CPU_MAX_BATCH = 8  # rows decoded together on a CPU (more adds latency, little throughput)
ACCELERATOR_MAX_BATCH = 64
_FOLLOW_UP_TURNS = FOLLOW_UP_TURNS  # read when a model is made (tests change it)
log = logging.getLogger(__name__)


class LocalModel(AsyncChatModel):
    """A transformers causal LM answering chat messages in this process.

    The model runs in the thread of the event loop that awaits it
    (`selftaught.models.local_scheduler` says how): a forward blocks that loop while it
    runs, and `chat` / `generate_batch` without a running loop run one of their own
    (`run_sync`). Safe to share between threads and loops; a model nobody references any
    more is freed once its requests are answered.

    Args:
        path: a transformers model folder, a `.gguf` file (converted once into a cache
            folder), or None for the embedded SmolLM2-135M-Instruct.
        model, tokenizer: a model already in memory (a peft-wrapped one too) and its
            tokenizer, instead of `path`; see `from_pretrained_model`.
        name: the model's name in replies and logs (default: from the folder or config).
        max_batch_size: most sequences decoded together (default 8 on a CPU, 64 on an
            accelerator).
        dtype: torch dtype (or its name, e.g. "bfloat16") for a loaded model; default
            `SELFTAUGHT_DTYPE`, else `auto` (`selftaught.models.device.inference_dtype`):
            bfloat16/float16 on accelerators, float32 on a CPU unless bf16 is on for it.
        device: "cpu", "cuda", "cuda:1", "mps", or None for the best available one. An
            in-memory model stays where it is.
        batch_wait_ms: how long an idle model waits for more requests before the first
            prefill (requests arriving together share it).
        chat_template: a Jinja chat template to use when the tokenizer has none.
        prefix_cache_mb: most megabytes of prompt-prefix keys/values kept between requests
            (a skill, its examples, the tool schemas: computed once, see
            `selftaught.models.prefix_cache`); 0 turns prefix reuse off.
        prefill_chunk: chunked prefill: most tokens (rows x columns) in one prefill forward,
            run one chunk a decode step beside the running rows; None (the default for now)
            prefills each admission in one forward. See docs/local-engine-performance.md.
        compact_at: pack the running KV cache when the columns no row needs are at least
            this fraction of its width; None (the default for now) never packs. The dynamic
            layout's only: the pool keeps no padding to pack.
        kv: where keys and values live: `pool` (fixed blocks allocated once,
            `selftaught.models.kv_pool`) or `dynamic` (one dense cache that grows); default
            `SELFTAUGHT_KV`, else `pool`. A model the pool cannot serve (sliding-window
            layers) uses `dynamic`.
        kv_pool_mb: the pool's size in megabytes; default `kv_pool.default_pool_mb` (from
            the model's config, its context and `max_batch_size`, within 1 GB on a CPU).
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        name: str | None = None,
        max_batch_size: int | None = None,
        dtype: Any = None,
        device: str | None = None,
        batch_wait_ms: float = 5.0,
        chat_template: str | None = None,
        prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB,
        prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
        compact_at: float | None = DEFAULT_COMPACT_AT,
        kv: str | None = None,
        kv_pool_mb: float | None = None,
    ) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait_ms < 0:
            raise ConfigError(f"batch_wait_ms must be >= 0, got {batch_wait_ms}")
        if prefix_cache_mb < 0:
            raise ConfigError(f"prefix_cache_mb must be >= 0, got {prefix_cache_mb}")
        check_engine_settings(prefill_chunk, compact_at)
        check_pool_mb(kv_pool_mb)
        self.kv = kv_layout(kv)
        self.kv_pool_mb = kv_pool_mb
        self._max_batch_arg = max_batch_size
        self.prefix_cache_mb = prefix_cache_mb
        self.prefill_chunk, self.compact_at = prefill_chunk, compact_at
        self.stats = BatcherStats()
        self._weights = LocalWeights(
            path,
            model=model,
            tokenizer=tokenizer,
            name=name,
            dtype=dtype,
            device=device,
            chat_template=chat_template,
        )
        self.name = self._weights.name
        self._scheduler = RequestScheduler(
            batch_wait_ms=batch_wait_ms, follow_up_turns=_FOLLOW_UP_TURNS
        )

    @classmethod
    def from_pretrained_model(
        cls, model: Any, tokenizer: Any, *, name: str | None = None, **kwargs: Any
    ) -> LocalModel:
        """Wrap a transformers model already in memory (e.g. the one being trained, peft
        adapters included). Cheap: nothing is copied or moved. The model may stay in train
        mode: each forward switches it to eval and back. Update its weights only while no
        request is in flight (the running KV caches are the weights of the moment; the cached
        prompt prefixes are dropped when the next request finds the parameters or the active
        adapters changed, and `fingerprint` follows in-place updates). `close()` lets go of
        it."""
        return cls(model=model, tokenizer=tokenizer, name=name, **kwargs)

    # ------------------------------------------------------------------ identity and weights

    @property
    def spec(self) -> str | None:
        """The model spec that loads these weights again: `local` (the embedded model) or
        `local:PATH`; None for a model in memory (it has no files)."""
        return self._weights.spec

    @property
    def path(self) -> Path:
        """The resolved transformers folder (converting a GGUF / the embedded model once)."""
        return self._weights.path

    @property
    def model(self) -> Any:
        """The Hugging Face model, loaded on first access."""
        self._ensure_loaded()
        return self._weights.model

    @property
    def tokenizer(self) -> Any:
        """The tokenizer."""
        self._ensure_loaded()
        return self._weights.tokenizer

    @property
    def device(self) -> Any:
        """The torch device the model runs on (loads the model)."""
        from selftaught.models.batching import model_device

        return model_device(self.model)

    @property
    def max_batch_size(self) -> int:
        """Most sequences decoded together (loads the model when the default depends on
        its device)."""
        if self._max_batch_arg is None:
            on_cpu = self.device.type == "cpu"
            self._max_batch_arg = CPU_MAX_BATCH if on_cpu else ACCELERATOR_MAX_BATCH
        return self._max_batch_arg

    @property
    def batch_wait_ms(self) -> float:
        """How long an idle model waits for more requests before the first prefill."""
        return self._scheduler.batch_wait_ms

    @batch_wait_ms.setter
    def batch_wait_ms(self, value: float) -> None:
        self._scheduler.batch_wait_ms = value

    @property
    def answer_dtype(self) -> str:
        """The dtype it answers in ("float32", "bfloat16", ...): a folder model's is decided
        without loading it, an in-memory model's is its weights' (score caches key on it)."""
        from selftaught.models.device import dtype_name

        weights = self._weights
        if not weights.in_memory:
            return dtype_name(weights.placement()[1])
        model = weights.model
        if model is None:  # let go of (closed)
            return "float32"
        return dtype_name(next(p.dtype for p in model.parameters() if p.is_floating_point()))

    @property
    def fingerprint(self) -> str:
        """A hash of the weights (of the files for a folder, of the parameters for an
        in-memory model), so that two models of the same name are told apart, e.g. by the
        response cache. An in-memory model's is taken again once its parameters changed
        in place (a training step), which torch's tensor version counters tell cheaply."""
        return self._weights.fingerprint

    # The parts' state under the names it had when it lived here (tests, doctor, adapters).
    @property
    def _in_memory(self) -> bool:
        return self._weights.in_memory

    @property
    def _eos_ids(self) -> list[int]:
        chat = self._weights.chat
        return [] if chat is None else chat.eos_ids

    @property
    def _batcher(self) -> ContinuousBatcher | None:
        return self._scheduler.batcher

    @_batcher.setter
    def _batcher(self, batcher: ContinuousBatcher | None) -> None:
        self._scheduler.batcher = batcher

    @property
    def _step_lock(self) -> Any:
        return self._scheduler.step_lock

    @property
    def _drivers(self) -> dict[asyncio.AbstractEventLoop, Driver]:
        return self._scheduler.drivers

    # ------------------------------------------------------------------ public API

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        return (await self._generate(messages, params, 1))[0]

    async def achat_n(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        """n completions of one prompt, prefilled once. Sampled (temperature > 0) with a
        seed, sample i uses `derive_seed(seed, i)`; greedy, the n replies are one sequence
        (identical by definition)."""
        return await self._generate(messages, params, n)

    def generate_batch(
        self,
        messages_list: Sequence[list[Message]],
        params: GenerationParams,
        num_return_sequences: int = 1,
        *,
        k: int | None = None,
    ) -> list[list[Completion]]:
        """`num_return_sequences` completions for each conversation, blocking (the
        synchronous form of `achat_n` over many prompts; `k` is an alias)."""
        if k is not None:
            num_return_sequences = k
        if num_return_sequences < 1:
            raise InputError(f"num_return_sequences must be >= 1, got {num_return_sequences}")
        for messages in messages_list:  # all checked before any is generated
            check_messages(messages)

        async def generate_all() -> list[list[Completion]]:
            return list(
                await asyncio.gather(
                    *(self.achat_n(m, params, num_return_sequences) for m in messages_list)
                )
            )

        return run_sync(generate_all())

    def format_prompt(self, messages: list[Message], params: GenerationParams | None = None) -> str:
        """The exact text the model sees for `messages`: the chat template applied with the
        generation prompt (for ChatML models it ends with the `<|im_start|>assistant` header),
        and the tools of `params` when it offers some."""
        check_messages(messages)
        if params is not None:
            check_params(params)
        self._ensure_loaded()
        return self._weights.chat_format.text(messages, params)

    def close(self) -> None:
        """Answer the requests already made (here, in the calling thread), then let go of
        the model (a folder model is loaded again on the next call; an in-memory one cannot
        be used again)."""
        self._after_fork()
        scheduler = self._scheduler
        with scheduler.step_lock:
            scheduler.drain(self)
            scheduler.batcher = None
            self._weights.unload()

    async def aclose(self) -> None:
        self.close()  # in the loop's thread, like every forward

    # ------------------------------------------------------------------ submission

    async def _generate(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        return await asyncio.wrap_future(self._submit(messages, params, n).future)

    def _submit(self, messages: list[Message], params: GenerationParams, n: int) -> Request:
        """Check a request, queue it and make sure the running loop has a driver serving it."""
        check_messages(messages)
        check_params(params)
        check_n(n)
        self._after_fork()
        if self._weights.closed:
            raise FatalBackendError(BACKEND, f"{self.name} was closed; wrap the model again")
        return self._scheduler.submit(self, messages, params, n)

    def _after_fork(self) -> None:
        """In a forked child: the scheduler forgets the parent's requests and drivers and
        both parts make fresh locks (one may have been held at the fork)."""
        if self._scheduler.after_fork():
            self._weights.after_fork()

    # ------------------------------------------------------------------ the scheduler's hooks

    def _ensure_loaded(self) -> None:
        self._weights.load()

    def _ensure_batcher(self) -> ContinuousBatcher:
        scheduler = self._scheduler
        if scheduler.batcher is None:
            self._ensure_loaded()
            weights = self._weights
            chat = weights.chat_format
            pad = weights.tokenizer.pad_token_id
            model, eos, pad_id = (
                weights.model,
                chat.eos_ids,
                chat.eos_ids[0] if pad is None else pad,
            )
            batcher: ContinuousBatcher | None = None
            if self.kv == "pool":
                try:
                    shape = kv_shape(model)
                    batcher = PagedBatcher(
                        model,
                        eos,
                        pad_id,
                        chat.decode,
                        pool_mb=self._pool_mb(shape),
                        shape=shape,
                        stats=self.stats,
                        prefix_cache_mb=self.prefix_cache_mb,
                        prefill_chunk=self.prefill_chunk,
                    )
                except UnsupportedCacheError as err:
                    log.info("%s: %s; the dynamic KV cache serves it", self.name, err)
            if batcher is None:
                batcher = ContinuousBatcher(
                    model,
                    eos,
                    pad_id,
                    chat.decode,
                    stats=self.stats,
                    prefix_cache_mb=self.prefix_cache_mb,
                    prefill_chunk=self.prefill_chunk,
                    compact_at=self.compact_at,
                )
            scheduler.batcher = batcher
        return scheduler.batcher

    def _pool_mb(self, shape: KVShape) -> float:
        """`kv_pool_mb`, or the default for this model, batch size and prefix cache."""
        if self.kv_pool_mb is not None:
            return self.kv_pool_mb
        return default_pool_mb(
            shape, self.max_batch_size, self._context_length(), self.prefix_cache_mb
        )

    def _encode(self, messages: list[Message], params: GenerationParams | None = None) -> list[int]:
        """The prompt's token ids (see `ChatFormat.encode`)."""
        self._ensure_loaded()
        return self._weights.chat_format.encode(messages, params)

    def _context_length(self) -> int | None:
        return self._weights.context_length()

    def _completion(self, seq: GenSequence, prompt_tokens: int) -> Completion:
        return self._weights.chat_format.completion(seq, prompt_tokens, self.name)
