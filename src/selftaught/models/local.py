"""The in-process local model: any transformers causal LM folder (or GGUF file), the embedded
SmolLM2-135M-Instruct by default.

Concurrent `achat` calls are batched into one `generate` call by a dedicated worker thread:
requests go into a thread-safe queue with a `concurrent.futures.Future` each, so any event
loop (or none: `chat` blocks on the future directly) can wait on them. `run_sync` creates a
fresh loop per call, which is why nothing here is bound to a loop.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selftaught.models.base import AsyncChatModel, Completion, GenerationParams, Message
from selftaught.models.errors import BackendError, FatalBackendError

BACKEND = "local"
_VALID_ROLES = {"system", "user", "assistant", "tool"}


@dataclass
class _Request:
    """One queued `achat`/`chat` call waiting for the batching worker."""

    messages: list[Message]
    params: GenerationParams
    future: Future = field(default_factory=Future)
    submitted_at: float = field(default_factory=time.perf_counter)

    def batch_key(self) -> tuple[Any, ...]:
        """Requests with equal keys can share one `generate` call."""
        p = self.params
        if p.temperature <= 0:  # greedy: seed and top_p do not matter
            return ("greedy", p.max_tokens)
        if p.seed is not None:
            # A seeded sample must not depend on which other requests shared its batch,
            # so it runs alone: the same (messages, params) always gives the same reply.
            return ("seeded", id(self))
        return ("sample", p.max_tokens, p.temperature, p.top_p)


_STOP_WORKER = object()


class LocalModel(AsyncChatModel):
    """A transformers causal LM answering chat messages in this process.

    Args:
        path: a transformers model folder, a `.gguf` file (converted once into a cache
            folder), or None for the embedded SmolLM2-135M-Instruct.
        max_batch_size: most prompts in one `generate` call.
        dtype: torch dtype (or its name, e.g. "bfloat16"); default float32 on CPU (fastest
            and exact there), bfloat16 on accelerators that support it.
        device: "cpu", "cuda", "cuda:1", "mps", ...
        batch_wait_ms: how long the worker waits for more requests before starting a batch.
        chat_template: a Jinja chat template to use when the tokenizer has none.
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        max_batch_size: int = 8,
        dtype: Any = None,
        device: str = "cpu",
        batch_wait_ms: float = 5.0,
        chat_template: str | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {batch_wait_ms}")
        self._requested_path = path
        self.max_batch_size = max_batch_size
        self.device = device
        self.batch_wait_ms = batch_wait_ms
        self._dtype_arg = dtype
        self._chat_template = chat_template
        self._path: Path | None = None
        self._model: Any = None
        self._tokenizer: Any = None
        self._eos_ids: list[int] = []
        self._load_lock = threading.Lock()
        self._generate_lock = threading.Lock()  # one `generate` at a time on this model
        self._worker_lock = threading.Lock()
        self._queue: queue.Queue | None = None
        self._worker: threading.Thread | None = None
        self._worker_pid: int | None = None
        self.generate_calls = 0  # number of `model.generate` invocations (batching is visible)
        if path:
            # Name the model without loading it; the path is checked now so that a typo
            # fails before anything else starts.
            self.name = f"local:{Path(path).expanduser().name.removesuffix('.gguf')}"
            if not Path(path).expanduser().exists():
                raise FatalBackendError(BACKEND, f"local model path {path} does not exist")
            if not str(path).endswith(".gguf"):
                _ = self.path  # cheap for a folder: fail now if it is not a model
        else:
            from selftaught.models.embedded import EMBEDDED_NAME

            self.name = f"local:{EMBEDDED_NAME}"

    # ------------------------------------------------------------------ loading

    @property
    def path(self) -> Path:
        """The resolved transformers folder (converting a GGUF / the embedded model once)."""
        if self._path is None:
            from selftaught.models.embedded import EmbeddedModelMissing, resolve_local_path

            try:
                self._path = resolve_local_path(self._requested_path)
            except EmbeddedModelMissing as err:
                raise FatalBackendError(BACKEND, str(err)) from err
            except (FileNotFoundError, ValueError) as err:
                raise FatalBackendError(BACKEND, str(err)) from err
            except ImportError as err:
                raise FatalBackendError(
                    BACKEND,
                    f"the local backend needs the [local] extra ({err}); "
                    'run: pip install "selftaught[local]"',
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
        """The tokenizer (left padding, pad token = eos when the model has none)."""
        self._ensure_loaded()
        return self._tokenizer

    def _resolve_dtype(self, torch: Any) -> Any:
        if self._dtype_arg is None or self._dtype_arg == "auto":
            if self.device.startswith("cuda") and torch.cuda.is_available():
                return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            return torch.float32
        if isinstance(self._dtype_arg, str):
            dtype = getattr(torch, self._dtype_arg, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown torch dtype {self._dtype_arg!r}")
            return dtype
        return self._dtype_arg

    def _ensure_loaded(self) -> None:
        if self._model is not None:
            return
        with self._load_lock:
            if self._model is not None:
                return
            path = self.path
            try:
                import torch
                from transformers import AutoModelForCausalLM, AutoTokenizer
            except ImportError as err:
                raise FatalBackendError(
                    BACKEND,
                    f"the local backend needs the [local] extra ({err}); "
                    'run: pip install "selftaught[local]"',
                ) from err
            try:
                tokenizer = AutoTokenizer.from_pretrained(path)
                model = AutoModelForCausalLM.from_pretrained(path, dtype=self._resolve_dtype(torch))
            except Exception as err:  # OSError, ValueError, safetensors errors, ...
                raise FatalBackendError(
                    BACKEND, f"could not load a causal language model from {path}: {err}"
                ) from err
            model.to(self.device)
            model.eval()
            if self._chat_template is not None:
                tokenizer.chat_template = self._chat_template
            if not getattr(tokenizer, "chat_template", None):
                raise FatalBackendError(
                    BACKEND,
                    f"{path} has no chat template (a base model?); prompts must go through "
                    "one, so pass chat_template=... or use an instruction-tuned model",
                )
            tokenizer.padding_side = "left"  # decoder-only batches must end at the prompt
            self._eos_ids = _eos_token_ids(tokenizer, model)
            if not self._eos_ids:
                raise FatalBackendError(BACKEND, f"{path}: the tokenizer has no eos token")
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.convert_ids_to_tokens(self._eos_ids[0])
            self._tokenizer = tokenizer
            self._model = model

    # ------------------------------------------------------------------ public API

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        import asyncio

        return await asyncio.wrap_future(self._submit(messages, params))

    def chat(self, messages: list[Message], params: GenerationParams | None = None) -> Completion:
        # No event loop needed: block on the worker's future.
        return self._submit(messages, params or GenerationParams()).result()

    def generate_batch(
        self,
        messages_list: Sequence[list[Message]],
        params: GenerationParams,
        num_return_sequences: int = 1,
        *,
        k: int | None = None,
    ) -> list[list[Completion]]:
        """Sample `num_return_sequences` completions for each conversation (for the
        weight-space trainers; `k` is an alias, matching `weights.sampling.Sampler`). Prompts
        are batched in chunks of `max_batch_size`; with a seed, the whole call is
        reproducible."""
        if k is not None:
            num_return_sequences = k
        if num_return_sequences < 1:
            raise ValueError(f"num_return_sequences must be >= 1, got {num_return_sequences}")
        _check_params(params)
        for messages in messages_list:
            _check_messages(messages)
        self._ensure_loaded()
        results: list[list[Completion]] = []
        started = time.perf_counter()
        with self._generate_lock, _seeded(params):
            for start in range(0, len(messages_list), self.max_batch_size):
                chunk = list(messages_list[start : start + self.max_batch_size])
                results.extend(self._generate(chunk, params, num_return_sequences, started))
        return results

    def format_prompt(self, messages: list[Message]) -> str:
        """The exact text the model sees for `messages`: the chat template applied with the
        generation prompt (for ChatML models it ends with the `<|im_start|>assistant` header)."""
        _check_messages(messages)
        self._ensure_loaded()
        return self._prompt_text(messages)

    def close(self) -> None:
        """Stop the batching worker (it restarts on the next call)."""
        with self._worker_lock:
            if self._queue is not None and self._worker is not None and self._worker.is_alive():
                self._queue.put(_STOP_WORKER)
                self._worker.join(timeout=60)
            self._queue = None
            self._worker = None

    async def aclose(self) -> None:
        import asyncio

        await asyncio.to_thread(self.close)

    # ------------------------------------------------------------------ batching worker

    def _submit(self, messages: list[Message], params: GenerationParams) -> Future:
        _check_messages(messages)
        _check_params(params)
        request = _Request(messages, params)
        # Under the lock: `close` cannot stop the worker between choosing a queue and putting.
        with self._worker_lock:
            self._ensure_worker().put(request)
        return request.future

    def _ensure_worker(self) -> queue.Queue:
        """The live worker's queue, starting a worker when needed. Caller holds _worker_lock."""
        # After a fork the worker thread does not exist in the child: start a new one.
        alive = self._worker is not None and self._worker.is_alive()
        if self._queue is None or not alive or self._worker_pid != os.getpid():
            requests: queue.Queue = queue.Queue()
            # The thread holds only a weak reference, so a model nobody uses any more
            # (e.g. last round's weights) is freed, and the finalizer stops its thread.
            self._worker = threading.Thread(
                target=_worker_main,
                args=(weakref.ref(self), requests),
                name=f"selftaught-{self.name}-batcher",
                daemon=True,
            )
            weakref.finalize(self, requests.put, _STOP_WORKER)
            self._queue = requests
            self._worker_pid = os.getpid()
            self._worker.start()
        return self._queue

    def _collect(self, requests: queue.Queue, pending: list[_Request]) -> bool:
        """Wait up to batch_wait_ms for more requests (until a batch is full). Returns True
        when the stop sentinel arrived."""
        deadline = time.perf_counter() + self.batch_wait_ms / 1000
        while len(pending) < self.max_batch_size:
            timeout = deadline - time.perf_counter()
            try:
                item = requests.get(timeout=timeout) if timeout > 0 else requests.get_nowait()
            except queue.Empty:
                return False
            if item is _STOP_WORKER:
                return True
            pending.append(item)
        return False

    def _take_batch(self, pending: list[_Request]) -> list[_Request]:
        """The oldest request and the compatible ones after it (removed from `pending`)."""
        key = pending[0].batch_key()
        batch = [r for r in pending if r.batch_key() == key][: self.max_batch_size]
        taken = {id(r) for r in batch}
        pending[:] = [r for r in pending if id(r) not in taken]
        return batch

    def _run_requests(self, batch: list[_Request]) -> None:
        # Callers that gave up (timeout / cancel) are dropped before spending compute.
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        try:
            if not live:
                return
            self._ensure_loaded()
            live = self._reject_overlong(live)
            if not live:
                return
            params = live[0].params
            with self._generate_lock, _seeded(params):
                groups = self._generate(
                    [r.messages for r in live], params, 1, None, [r.params for r in live]
                )
            done = time.perf_counter()
            for r, (completion,) in zip(live, groups, strict=True):
                completion.latency_s = done - r.submitted_at
                completion.extra["batch_size"] = len(live)
                r.future.set_result(completion)
        except Exception as err:  # every waiting caller must hear about it
            error = err if isinstance(err, BackendError) else _as_backend_error(err)
            _fail(live, error)

    def _reject_overlong(self, requests: list[_Request]) -> list[_Request]:
        """Fail, one by one, the requests whose prompt alone fills the context, so that they
        do not sink the others in their batch."""
        context = getattr(self._model.config, "max_position_embeddings", None)
        if not context:
            return requests
        kept = []
        for r in requests:
            n = len(
                self._tokenizer(self._prompt_text(r.messages), add_special_tokens=False)[
                    "input_ids"
                ]
            )
            if n >= context:
                r.future.set_exception(
                    FatalBackendError(
                        BACKEND,
                        f"prompt of {n} tokens does not fit {self.name}'s context of "
                        f"{context} tokens",
                    )
                )
            else:
                kept.append(r)
        return kept

    # ------------------------------------------------------------------ generation

    def _prompt_text(self, messages: list[Message]) -> str:
        try:
            return self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        except Exception as err:  # jinja errors: e.g. a template that rejects a role order
            raise FatalBackendError(
                BACKEND, f"the chat template rejected these messages: {err}"
            ) from err

    def _generate(
        self,
        conversations: list[list[Message]],
        params: GenerationParams,
        num_return_sequences: int,
        started: float | None,
        row_params: list[GenerationParams] | None = None,
    ) -> list[list[Completion]]:
        """One `generate` call for up to max_batch_size conversations sharing the sampling
        settings of `params`; `row_params` carries each row's own stop strings. The caller
        holds the generate lock."""
        import torch

        tokenizer, model = self._tokenizer, self._model
        t0 = time.perf_counter()
        prompts = [self._prompt_text(m) for m in conversations]
        # The template already holds the special tokens (e.g. <|im_start|>): add none.
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        input_ids = encoded["input_ids"].to(model.device)
        attention_mask = encoded["attention_mask"].to(model.device)
        prompt_lengths = attention_mask.sum(dim=1).tolist()
        prompt_width = input_ids.shape[1]
        max_new_tokens = params.max_tokens
        context = getattr(model.config, "max_position_embeddings", None)
        if context:
            if prompt_width >= context:
                raise FatalBackendError(
                    BACKEND,
                    f"prompt of {prompt_width} tokens does not fit the model's context of "
                    f"{context} tokens",
                )
            max_new_tokens = min(max_new_tokens, context - prompt_width)
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": self._eos_ids,
            "num_return_sequences": num_return_sequences,
        }
        if params.temperature > 0:
            # top_k=0 disables the top-k filter some configs set: OpenAI semantics.
            kwargs.update(
                do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0
            )
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        was_training = model.training  # a trainer may hold this model in train mode
        model.eval()
        try:
            with torch.inference_mode():
                output = model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, **kwargs
                )
        finally:
            model.train(was_training)
        self.generate_calls += 1
        elapsed = time.perf_counter() - (started if started is not None else t0)
        generated = output[:, prompt_width:].tolist()
        results: list[list[Completion]] = []
        for i in range(len(conversations)):
            row: list[Completion] = []
            for j in range(num_return_sequences):
                tokens = generated[i * num_return_sequences + j]
                own = row_params[i] if row_params is not None else params
                row.append(self._completion(tokens, prompt_lengths[i], own))
                row[-1].latency_s = elapsed
            results.append(row)
        return results

    def _completion(
        self, tokens: list[int], prompt_tokens: int, params: GenerationParams
    ) -> Completion:
        eos = set(self._eos_ids)
        end = next((k for k, t in enumerate(tokens) if t in eos), None)
        if end is None:  # no end-of-turn token: the reply hit max_tokens
            kept, finish_reason, completion_tokens = tokens, "length", len(tokens)
        else:
            kept, finish_reason, completion_tokens = tokens[:end], "stop", end + 1
        text = self._tokenizer.decode(kept, skip_special_tokens=True)
        if params.stop:
            cut = min((i for i in (text.find(s) for s in params.stop if s) if i >= 0), default=-1)
            if cut >= 0:
                text, finish_reason = text[:cut], "stop"
                completion_tokens = len(self._tokenizer.encode(text, add_special_tokens=False))
        return Completion(
            text=text,
            prompt_tokens=int(prompt_tokens),
            completion_tokens=completion_tokens,
            finish_reason=finish_reason,
            model=self.name,
        )


# ---------------------------------------------------------------------- helpers


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


class _seeded:
    """Within the block, torch's RNG is seeded from `params.seed` (when sampling with one);
    the global RNG state is restored afterwards."""

    def __init__(self, params: GenerationParams) -> None:
        self.seed = params.seed if params.temperature > 0 else None
        self._fork: Any = None

    def __enter__(self) -> None:
        if self.seed is None:
            return
        import torch

        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        self._fork = torch.random.fork_rng(devices=devices)
        self._fork.__enter__()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc: Any) -> None:
        if self._fork is not None:
            self._fork.__exit__(*exc)
            self._fork = None


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {m!r}")
        if m["role"] not in _VALID_ROLES:
            raise ValueError(f"message {i} has unknown role {m['role']!r}")
        if not isinstance(m["content"], str):
            raise ValueError(f"message {i} content must be a string")


def _check_params(params: GenerationParams) -> None:
    if params.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")


def _worker_main(model_ref: weakref.ref, requests: queue.Queue) -> None:
    """The batching loop: block for a request, gather the ones that arrive within
    batch_wait_ms, run the oldest compatible group in one `generate`, repeat. After the stop
    sentinel, the requests already taken are still answered."""
    pending: list[_Request] = []
    stop = False
    while True:
        if not pending:
            if stop:
                return
            item = requests.get()
            if item is _STOP_WORKER:
                return
            pending.append(item)
        model = model_ref()
        if model is None:
            _fail(pending, FatalBackendError(BACKEND, "the local model was garbage-collected"))
            return
        try:
            if not stop:
                stop = model._collect(requests, pending)
            model._run_requests(model._take_batch(pending))
        except Exception as err:  # never leave a caller waiting on a dead worker
            _fail(pending, _as_backend_error(err))
            pending = []
        del model  # hold no strong reference while blocked on the queue


def _fail(requests: list[_Request], error: BaseException) -> None:
    for r in requests:
        if r.future.done():
            continue
        if r.future.running() or r.future.set_running_or_notify_cancel():
            r.future.set_exception(error)


def _as_backend_error(err: BaseException) -> BackendError:
    return FatalBackendError(BACKEND, f"generation failed: {type(err).__name__}: {err}")
