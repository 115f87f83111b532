"""The in-process local model: any transformers causal LM folder (or GGUF file), the embedded
SmolLM2-135M-Instruct by default, or a model already in memory (the one a trainer holds).

Every call (`achat`, `achat_n`, and through `run_sync` the blocking `chat` and
`generate_batch`) becomes one or more sequences in a thread-safe inbox, each request with a
`concurrent.futures.Future`, and makes sure a driver task runs in the calling event loop. The
driver steps the continuous batcher (`selftaught.models.batching`: a sequence that finishes
frees its slot for the next waiting one at once) and yields to its loop between steps, until
every request made in that loop is answered; then it exits. So the model runs in the thread
that awaits it, usually the only thread of the process that runs torch (a second one costs
every forward on a CPU: libgomp keeps one OpenMP team per calling thread, and two teams on
too few cores make both spin politely and slowly). The cost: while a forward runs (one
decode step, or one prefill), nothing else runs in that loop. How many torch threads that
forward uses follows the cores other processes leave free, checked again while serving
(`selftaught.models.threads`; `SELFTAUGHT_THREADS` fixes it).

Several loops in several threads may use one model at once (`run_sync` inside a running loop
runs in a helper thread; a sync scorer calls a local judge from a worker thread): one step
runs at a time (a lock), and each step serves every request, from any thread. A driver
whose lock attempt fails lets the stepping thread serve its requests and tries again a
little later, so it takes over when that thread stops stepping, also when that thread's loop
is blocked waiting for it. Nothing here is bound to one loop, which is why `run_sync` may
create a fresh one per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selftaught.errors import ConfigError, InputError, MissingDependency
from selftaught.models.base import (
    AsyncChatModel,
    Completion,
    GenerationParams,
    Message,
    check_n,
    params_for_sample,
    run_sync,
)
from selftaught.models.batching import BatcherStats, ContinuousBatcher, GenSequence
from selftaught.models.errors import BackendError, FatalBackendError
from selftaught.models.prefix_cache import DEFAULT_PREFIX_CACHE_MB
from selftaught.models.threads import governor
from selftaught.models.tools import (
    apply_tool_reply,
    check_tool_choice,
    check_tool_messages,
    check_tools,
    offered_tools,
    render_prompt,
)

BACKEND = "local"
CPU_MAX_BATCH = 8  # rows decoded together on a CPU (more adds latency, little throughput)
ACCELERATOR_MAX_BATCH = 64
_VALID_ROLES = {"system", "user", "assistant", "tool"}
_MAX_POLL_S = 0.02  # longest wait of a driver while another thread steps
_FOLLOW_UP_TURNS = 4  # loop turns an answered caller gets to ask again before the next step
log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Request:
    """One `achat`/`achat_n`/`chat` call: its n completions arrive in `future` as a list."""

    messages: list[Message]
    params: GenerationParams
    n: int = 1
    future: Future[list[Completion]] = field(default_factory=Future)
    submitted_at: float = field(default_factory=time.perf_counter)
    prompt_tokens: int = 0
    completions: list[Completion | None] = field(default_factory=list)
    pending: int = 0  # sequences still generating

    @property
    def abandoned(self) -> bool:
        """Cancelled by its caller, or already failed: its sequences are dropped."""
        return self.future.done()


@dataclass(eq=False)
class _Driver:
    """The serving task of one event loop and the requests made in that loop."""

    requests: list[_Request] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    finished: bool = False  # decided to exit: a new request in its loop starts a new one


class LocalModel(AsyncChatModel):
    """A transformers causal LM answering chat messages in this process.

    The model runs in the thread of the event loop that awaits it (the module docstring
    says how): a forward blocks that loop while it runs, and `chat` / `generate_batch`
    without a running loop run one of their own (`run_sync`). Safe to share between
    threads and loops; a model nobody references any more is freed once its requests are
    answered.

    Args:
        path: a transformers model folder, a `.gguf` file (converted once into a cache
            folder), or None for the embedded SmolLM2-135M-Instruct.
        model, tokenizer: a model already in memory (a peft-wrapped one too) and its
            tokenizer, instead of `path`; see `from_pretrained_model`.
        name: the model's name in replies and logs (default: from the folder or config).
        max_batch_size: most sequences decoded together (default 8 on a CPU, 64 on an
            accelerator).
        dtype: torch dtype (or its name, e.g. "bfloat16") for a loaded model; default from
            `resolve_device`: float32 on CPU, bfloat16/float16 on accelerators.
        device: "cpu", "cuda", "cuda:1", "mps", or None for the best available one. An
            in-memory model stays where it is.
        batch_wait_ms: how long an idle model waits for more requests before the first
            prefill (requests arriving together share it).
        chat_template: a Jinja chat template to use when the tokenizer has none.
        prefix_cache_mb: most megabytes of prompt-prefix keys/values kept between requests
            (a skill, its examples, the tool schemas: computed once, see
            `selftaught.models.prefix_cache`); 0 turns prefix reuse off.
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
    ) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait_ms < 0:
            raise ConfigError(f"batch_wait_ms must be >= 0, got {batch_wait_ms}")
        if prefix_cache_mb < 0:
            raise ConfigError(f"prefix_cache_mb must be >= 0, got {prefix_cache_mb}")
        if (model is None) != (tokenizer is None):
            raise ConfigError("pass both model= and tokenizer= (or neither)")
        if model is not None and path:
            raise ConfigError("pass either a path or an in-memory model, not both")
        self._requested_path = path
        self._max_batch_arg = max_batch_size
        self._device_arg = device
        self.batch_wait_ms = batch_wait_ms
        self.prefix_cache_mb = prefix_cache_mb
        self._dtype_arg = dtype
        self._chat_template = chat_template
        self._in_memory = model is not None
        self._closed = False
        self._path: Path | None = None
        self._model: Any = None
        self._tokenizer: Any = None
        self._batcher: ContinuousBatcher | None = None
        self._eos_ids: list[int] = []
        self._fingerprint: str | None = None
        self._fingerprint_version: tuple[tuple[int, int], ...] = ()
        self.stats = BatcherStats()
        self._load_lock = threading.Lock()
        # Serving state. _inbox_lock guards the inbox and the drivers (held briefly);
        # _step_lock guards the waiting sequences and the batcher (held for one step).
        self._inbox_lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._inbox: list[_Request] = []
        self._drivers: dict[asyncio.AbstractEventLoop, _Driver] = {}
        self._waiting: deque[GenSequence] = deque()
        self._gather_until: float | None = None  # end of an idle model's wait for more
        self._answered = False  # the last step answered a request (its caller may ask again)
        self._pid = os.getpid()
        if model is not None:
            config_name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
            self.name = name or f"local:{Path(config_name).name or 'in-memory'}"
            self._adopt(model, tokenizer)
        elif path:
            # Name the model without loading it; the path is checked now so that a typo
            # fails before anything else starts.
            self.name = name or f"local:{Path(path).expanduser().name.removesuffix('.gguf')}"
            if not Path(path).expanduser().exists():
                raise FatalBackendError(
                    BACKEND,
                    f"local model path {path} does not exist",
                    exit_code=InputError.exit_code,
                )
            if not str(path).endswith(".gguf"):
                _ = self.path  # cheap for a folder: fail now if it is not a model
        else:
            from selftaught.models.embedded import EMBEDDED_NAME

            self.name = name or f"local:{EMBEDDED_NAME}"

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

    # ------------------------------------------------------------------ loading

    @property
    def spec(self) -> str | None:
        """The model spec that loads these weights again: `local` (the embedded model) or
        `local:PATH`; None for a model in memory (it has no files)."""
        if self._in_memory:
            return None
        return f"local:{self._requested_path}" if self._requested_path else "local"

    @property
    def path(self) -> Path:
        """The resolved transformers folder (converting a GGUF / the embedded model once)."""
        if self._in_memory:
            raise AttributeError(f"{self.name} is an in-memory model; it has no folder")
        if self._path is None:
            from selftaught.models.embedded import EmbeddedModelMissing, resolve_local_path

            try:
                self._path = resolve_local_path(self._requested_path)
            except EmbeddedModelMissing as err:
                raise FatalBackendError(BACKEND, str(err), exit_code=err.exit_code) from err
            except (FileNotFoundError, ValueError) as err:  # the path the user gave
                raise FatalBackendError(BACKEND, str(err), exit_code=InputError.exit_code) from err
            except ImportError as err:
                raise FatalBackendError(
                    BACKEND, _missing_extra(err), exit_code=MissingDependency.exit_code
                ) from err
            except Exception as err:  # e.g. a corrupt .gguf failing to convert
                raise FatalBackendError(
                    BACKEND,
                    f"could not prepare {self._requested_path or 'the embedded model'}: "
                    f"{type(err).__name__}: {err}",
                ) from err
        return self._path

    @property
    def model(self) -> Any:
        """The Hugging Face model, loaded on first access."""
        self._ensure_loaded()
        return self._model

    @property
    def tokenizer(self) -> Any:
        """The tokenizer."""
        self._ensure_loaded()
        return self._tokenizer

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
    def fingerprint(self) -> str:
        """A hash of the weights (of the files for a folder, of the parameters for an
        in-memory model), so that two models of the same name are told apart, e.g. by the
        response cache. An in-memory model's is taken again once its parameters changed
        in place (a training step), which torch's tensor version counters tell cheaply."""
        from selftaught.models.fingerprint import fingerprint_module, fingerprint_path

        if not self._in_memory:
            if self._fingerprint is None:
                self._fingerprint = f"local:files:{fingerprint_path(self.path)}"
            return self._fingerprint
        self._ensure_loaded()
        version = _weights_version(self._model)
        if self._fingerprint is None or version != self._fingerprint_version:
            self._fingerprint = f"local:module:{fingerprint_module(self._model)}"
            self._fingerprint_version = version
        return self._fingerprint

    def _ensure_loaded(self) -> None:
        if self._model is not None:
            return
        if self._closed:
            raise FatalBackendError(BACKEND, f"{self.name} was closed; wrap the model again")
        with self._load_lock:
            if self._model is not None:
                return
            path = self.path
            first = governor().start()  # the busy reading spans the load
            try:
                from transformers import AutoModelForCausalLM, AutoTokenizer

                from selftaught.models.device import resolve_device, resolve_dtype
            except ImportError as err:
                raise FatalBackendError(
                    BACKEND, _missing_extra(err), exit_code=MissingDependency.exit_code
                ) from err
            try:
                device, default_dtype = resolve_device(self._device_arg)
                dtype = resolve_dtype(self._dtype_arg, default_dtype)
            except ValueError as err:  # the --device / --dtype the user gave
                raise FatalBackendError(BACKEND, str(err), exit_code=InputError.exit_code) from err
            try:
                tokenizer = AutoTokenizer.from_pretrained(path)
                # Any, as `_adopt` takes it: mypy reads transformers' wrapped `to` unbound
                model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            except Exception as err:  # OSError, ValueError, safetensors errors, ...
                raise FatalBackendError(
                    BACKEND, f"could not load a causal language model from {path}: {err}"
                ) from err
            model.to(device)
            model.eval()
            self._adopt(model, tokenizer)
            governor().on_load(first)

    def _adopt(self, model: Any, tokenizer: Any) -> None:
        """Check and keep a model + tokenizer (the tokenizer is not modified: it may be a
        trainer's)."""
        if self._chat_template is not None:
            tokenizer.chat_template = self._chat_template
        if not getattr(tokenizer, "chat_template", None):
            raise FatalBackendError(
                BACKEND,
                f"{self.name} has no chat template (a base model?); prompts must go through "
                "one, so pass chat_template=... or use an instruction-tuned model",
            )
        eos_ids = _eos_token_ids(tokenizer, model)
        if not eos_ids:
            raise FatalBackendError(BACKEND, f"{self.name}: the tokenizer has no eos token")
        self._eos_ids = eos_ids
        self._tokenizer = tokenizer
        self._model = model

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
            _check_messages(messages)

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
        _check_messages(messages)
        if params is not None:
            _check_params(params)
        self._ensure_loaded()
        return self._prompt_text(messages, params)

    def close(self) -> None:
        """Answer the requests already made (here, in the calling thread), then let go of
        the model (a folder model is loaded again on the next call; an in-memory one cannot
        be used again)."""
        self._after_fork()
        with self._step_lock:
            self._drain()
            with self._load_lock:
                self._batcher = None
                self._model = self._tokenizer = None
                self._closed = self._in_memory

    async def aclose(self) -> None:
        self.close()  # in the loop's thread, like every forward

    # ------------------------------------------------------------------ submission

    async def _generate(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        return await asyncio.wrap_future(self._submit(messages, params, n).future)

    def _submit(self, messages: list[Message], params: GenerationParams, n: int) -> _Request:
        """Queue a request and make sure the running loop has a driver serving it."""
        _check_messages(messages)
        _check_params(params)
        check_n(n)
        loop = asyncio.get_running_loop()
        self._after_fork()
        request = _Request(messages, params, n)
        with self._inbox_lock:  # atomic with a driver's decision to exit: nothing is stranded
            if self._closed:
                raise FatalBackendError(BACKEND, f"{self.name} was closed; wrap the model again")
            self._inbox.append(request)
            driver = self._drivers.get(loop)
            if driver is None or driver.finished:
                driver = self._drivers[loop] = _Driver()
                driver.task = loop.create_task(
                    self._drive(loop, driver), name=f"selftaught-{self.name}-driver"
                )
            driver.requests.append(request)
        return request

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's requests and drivers (their threads do
        not exist here) and make fresh locks (one may have been held at the fork)."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._load_lock = threading.Lock()
        self._inbox_lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._inbox, self._drivers, self._waiting = [], {}, deque()
        self._gather_until = None
        if self._batcher is not None:
            self._batcher.reset()

    # ------------------------------------------------------------------ serving

    async def _drive(self, loop: asyncio.AbstractEventLoop, driver: _Driver) -> None:
        """Step the batcher, yielding to the loop between steps, until every request made
        in this loop is answered. While another thread steps (it serves these requests too),
        try again after a short, growing pause."""
        pause = 0.0
        try:
            while True:
                if self._step_lock.acquire(blocking=False):
                    try:
                        delay = self._drive_step(driver)
                    finally:
                        self._step_lock.release()
                    pause = 0.0
                elif self._settled(driver):
                    return
                else:
                    pause = delay = min(max(2 * pause, 0.001), _MAX_POLL_S)
                if delay is None:
                    return
                await asyncio.sleep(delay)
                if self._answered:
                    await self._follow_ups()
        finally:
            with self._inbox_lock:
                driver.finished = True
                if self._drivers.get(loop) is driver:
                    del self._drivers[loop]

    async def _follow_ups(self) -> None:
        """A caller answered by the last step often asks again at once (the next rollout
        of a batch, an episode's next turn): while slots are free, give it the few loop
        turns it takes to reach the inbox, so that it joins the next step, not the one after."""
        self._answered = False
        for _ in range(_FOLLOW_UP_TURNS):
            if self._inbox or len(self._waiting) + self._running() >= self.max_batch_size:
                return
            await asyncio.sleep(0)

    def _drive_step(self, driver: _Driver) -> float | None:
        """One serving step (caller holds _step_lock). Returns how long to yield before the
        next one, or None when the driver's requests are all answered."""
        self._intake()
        if self._settled(driver):
            self._drop_abandoned()  # a cancelled request's rows must not outlive its driver
            return None
        if not self._waiting and not self._has_running():
            # Unreachable by design (a request is in the inbox, waiting, running or done);
            # never leave a caller waiting on it.
            _fail(driver.requests, BackendError(BACKEND, "internal error: request lost"))
            return None
        if not self._has_running() and len(self._waiting) < self.max_batch_size:
            now = time.perf_counter()
            if self._gather_until is None:  # idle: let requests arriving together share a prefill
                self._gather_until = now + self.batch_wait_ms / 1000
            if now < self._gather_until:
                return self._gather_until - now
        self._gather_until = None
        self._serve_guarded()
        return 0.0

    def _settled(self, driver: _Driver) -> bool:
        """Whether every request of `driver`'s loop is answered (or abandoned); if so the
        driver is finished, atomically with `_submit`'s look at it."""
        with self._inbox_lock:
            driver.requests = [r for r in driver.requests if not r.future.done()]
            if not driver.requests:
                driver.finished = True
            return driver.finished

    def _drain(self) -> None:
        """Serve until nothing is queued or running (caller holds _step_lock)."""
        while True:
            self._intake()
            if not self._waiting and not self._has_running():
                return
            self._serve_guarded()

    def _intake(self) -> None:
        """Move the inbox's requests into the waiting sequences (caller holds _step_lock). A
        request that cannot be prepared (a prompt too long, a template error, a failed load)
        fails alone."""
        with self._inbox_lock:
            taken, self._inbox = self._inbox, []
        for request in taken:
            if request.abandoned:
                continue
            try:
                self._waiting.extend(self._sequences(request))
            except Exception as err:
                _fail([request], err if isinstance(err, BackendError) else _as_backend_error(err))

    def _serve_guarded(self) -> None:
        """`_serve_step`, failing what is waiting and running if anything escapes it: a
        caller must never be left waiting on a step that will not come."""
        try:
            self._serve_step()
        except Exception as err:
            error = err if isinstance(err, BackendError) else _as_backend_error(err)
            _fail([s.owner for s in self._waiting], error)
            self._waiting.clear()
            self._fail_running(error)

    def _sequences(self, request: _Request) -> list[GenSequence]:
        """The sequences of one request: n samples, or one for a greedy request (its n
        replies are copies); the token cap is clamped to what the context leaves."""
        ids = self._encode(request.messages, request.params)
        context = self._context_length()
        if context and len(ids) >= context:
            raise FatalBackendError(
                BACKEND,
                f"prompt of {len(ids)} tokens does not fit {self.name}'s context of "
                f"{context} tokens",
            )
        params = request.params
        max_new = min(params.max_tokens, context - len(ids)) if context else params.max_tokens
        count = request.n if params.temperature > 0 else 1
        request.prompt_tokens = len(ids)
        request.completions = [None] * request.n
        request.pending = count
        return [
            GenSequence(
                owner=request,
                index=i,
                prompt_ids=ids,
                max_new_tokens=max_new,
                temperature=params.temperature,
                top_p=params.top_p,
                generator=_generator(params_for_sample(params, i).seed)
                if params.temperature > 0
                else None,
                stop=params.stop,
                keep_kv=bool(params.tools),  # an episode's turn: the next one extends it
            )
            for i in range(count)
        ]

    def _encode(self, messages: list[Message], params: GenerationParams | None = None) -> list[int]:
        """The prompt's token ids: the chat template's text, no special tokens added (the
        template already holds them, e.g. <|im_start|>)."""
        self._ensure_loaded()
        text = self._prompt_text(messages, params)
        ids: list[int] = self._tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def _context_length(self) -> int | None:
        return getattr(self._model.config, "max_position_embeddings", None)

    def _has_running(self) -> bool:
        return self._batcher is not None and bool(self._batcher.rows)

    def _running(self) -> int:
        return 0 if self._batcher is None else len(self._batcher.rows)

    def _drop_abandoned(self) -> None:
        """Forget the sequences of cancelled or failed requests, running or waiting."""
        if self._batcher is not None:
            self._batcher.drop(lambda s: s.owner.abandoned)
        if any(s.owner.abandoned for s in self._waiting):
            self._waiting = deque(s for s in self._waiting if not s.owner.abandoned)

    def _serve_step(self) -> None:
        """Drop abandoned sequences, refill free slots from the waiting ones, decode one
        step, deliver what finished. A failure fails only the requests it touched."""
        batcher = self._ensure_batcher()
        _follow_free_cores()
        self._drop_abandoned()
        waiting = self._waiting
        free = self.max_batch_size - len(batcher.rows)
        if free > 0 and waiting:
            newcomers = [waiting.popleft() for _ in range(min(free, len(waiting)))]
            try:
                self._deliver(batcher.admit(newcomers))
            except Exception as err:
                error = err if isinstance(err, BackendError) else _as_backend_error(err)
                _fail([s.owner for s in newcomers], error)
                if any(s in batcher.rows for s in newcomers):  # failed mid-merge
                    self._fail_running(error)
        if batcher.rows:
            try:
                self._deliver(batcher.step())
            except Exception as err:
                self._fail_running(err if isinstance(err, BackendError) else _as_backend_error(err))

    def _ensure_batcher(self) -> ContinuousBatcher:
        if self._batcher is None:
            self._ensure_loaded()
            tokenizer = self._tokenizer
            pad = tokenizer.pad_token_id
            self._batcher = ContinuousBatcher(
                self._model,
                self._eos_ids,
                self._eos_ids[0] if pad is None else pad,
                lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                stats=self.stats,
                prefix_cache_mb=self.prefix_cache_mb,
            )
        return self._batcher

    def _fail_running(self, error: BaseException) -> None:
        if self._batcher is not None:
            _fail([s.owner for s in self._batcher.rows], error)
            self._batcher.reset()

    def _deliver(self, finished: list[GenSequence]) -> None:
        done = time.perf_counter()
        for seq in finished:
            request: _Request = seq.owner
            if request.abandoned:
                continue
            completion = self._completion(seq, request.prompt_tokens)
            completion.latency_s = done - request.submitted_at
            if seq.first_token_at is not None:  # time to first token
                completion.extra["ttft_s"] = round(seq.first_token_at - request.submitted_at, 4)
            offered = offered_tools(request.params.tools, request.params.tool_choice)
            if offered:  # the reply's <tool_call> blocks become tool_calls (or errors)
                apply_tool_reply(completion, offered)
            if seq.index > 0:
                completion.extra["prompt_shared"] = True  # one call: its prompt counts once
            request.completions[seq.index] = completion
            request.pending -= 1
            if request.pending:
                continue
            if request.params.temperature <= 0:  # greedy: the n replies are one
                request.completions = [
                    completion,
                    *(_shared_copy(completion) for _ in range(request.n - 1)),
                ]
            # pending is 0: every index holds its completion
            _resolve(request.future, [c for c in request.completions if c is not None])
            self._answered = True

    # ------------------------------------------------------------------ text

    def _prompt_text(self, messages: list[Message], params: GenerationParams | None = None) -> str:
        """The chat template's text for `messages`, with the offered tools: rendered by the
        template itself when it has a tools section, else by the documented fallback (a
        system-prompt section; past calls and results as text), see `models.tools`."""
        try:
            return render_prompt(
                self._tokenizer,
                messages,
                params.tools if params else None,
                params.tool_choice if params else None,
            )
        except Exception as err:  # jinja errors: e.g. a template that rejects a role order
            raise FatalBackendError(
                BACKEND, f"the chat template rejected these messages: {err}"
            ) from err

    def _completion(self, seq: GenSequence, prompt_tokens: int) -> Completion:
        tokens = seq.tokens
        if seq.stop_text is not None:  # a stop string ended it: the text before it
            text = seq.stop_text
            completion_tokens = len(self._tokenizer.encode(text, add_special_tokens=False))
        elif tokens and tokens[-1] in self._eos_ids:  # the end-of-turn token counts
            text = self._tokenizer.decode(tokens[:-1], skip_special_tokens=True)
            completion_tokens = len(tokens)
        else:
            text = self._tokenizer.decode(tokens, skip_special_tokens=True)
            completion_tokens = len(tokens)
        return Completion(
            text=text,
            prompt_tokens=int(prompt_tokens),
            completion_tokens=completion_tokens,
            finish_reason=seq.finish_reason or "length",
            model=self.name,
        )


# ---------------------------------------------------------------------- helpers


def _follow_free_cores() -> None:
    """Between forward passes, in the thread that runs them: the torch threads follow the
    free cores (`selftaught.models.threads`). Tuning never fails a request."""
    try:
        governor().tick()
    except Exception as err:  # e.g. torch refusing a thread count: keep serving as before
        log.debug("thread tuning skipped: %s", err)


def _eos_token_ids(tokenizer: Any, model: Any) -> list[int]:
    """End-of-reply tokens: the generation config's and the tokenizer's (chat models often
    end a turn with a token only one of them names)."""
    ids: list[int] = []
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.append(configured)
    elif isinstance(configured, (list, tuple)):
        ids.extend(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return list(dict.fromkeys(ids))


def _weights_version(model: Any) -> tuple[tuple[int, int], ...]:
    """Identity and in-place version counter of every parameter: changes after an optimizer
    step, `load_state_dict`, or swapped modules."""
    return tuple((id(p), p._version) for p in model.parameters())


def _generator(seed: int | None) -> Any:
    """A private RNG for one sampled sequence (torch's global RNG is never touched)."""
    import torch

    return torch.Generator().manual_seed(secrets.randbits(63) if seed is None else seed)


def _shared_copy(completion: Completion) -> Completion:
    calls = copy.deepcopy(completion.tool_calls)  # each copy's own calls
    copy_ = Completion(
        **{**completion.__dict__, "extra": dict(completion.extra), "tool_calls": calls}
    )
    copy_.extra["prompt_shared"] = True
    return copy_


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InputError("messages must be a non-empty list of {'role', 'content'} dicts")
    for i, m in enumerate(messages):
        calls_only = isinstance(m, dict) and m.get("content") is None and m.get("tool_calls")
        if not isinstance(m, dict) or "role" not in m or ("content" not in m and not calls_only):
            raise InputError(f"message {i} must be a dict with 'role' and 'content', got {m!r}")
        if m["role"] not in _VALID_ROLES:
            raise InputError(f"message {i} has unknown role {m['role']!r}")
        if not isinstance(m.get("content"), str) and not calls_only:  # OpenAI: null with calls
            raise InputError(f"message {i} content must be a string")
    check_tool_messages(messages)


def _check_params(params: GenerationParams) -> None:
    if params.max_tokens < 1:
        raise InputError(f"max_tokens must be >= 1, got {params.max_tokens}")
    if params.temperature < 0:
        raise InputError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise InputError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.tools is not None:
        check_tools(params.tools)
    check_tool_choice(params.tool_choice, params.tools)


def _resolve(future: Future[list[Completion]], result: list[Completion]) -> None:
    with contextlib.suppress(InvalidStateError):  # cancelled meanwhile
        future.set_result(result)


def _fail(requests: Sequence[_Request], error: BaseException) -> None:
    for r in requests:
        with contextlib.suppress(InvalidStateError):  # done or cancelled already
            r.future.set_exception(error)


def _missing_extra(err: ImportError) -> str:
    return (
        f'the local backend needs the [local] extra ({err}); run: pip install "selftaught[local]"'
    )


def _as_backend_error(err: BaseException) -> BackendError:
    return FatalBackendError(BACKEND, f"generation failed: {type(err).__name__}: {err}")
