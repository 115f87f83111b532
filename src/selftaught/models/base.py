"""The one chat protocol every backend speaks."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from selftaught.errors import InputError

T = TypeVar("T")

# {"role": "system" | "user" | "assistant" | "tool", "content": str}, in the OpenAI shape: an
# assistant turn may carry "tool_calls", a tool turn carries "tool_call_id"
Message = dict[str, Any]
# OpenAI shape: {"id": str, "type": "function", "function": {"name": str, "arguments": str}}
ToolCall = dict[str, Any]


@dataclass
class GenerationParams:
    """Sampling settings for one call. `max_tokens` is always sent (llama.cpp ignores
    `max_completion_tokens` and would generate to the context limit)."""

    max_tokens: int = 256
    """Reply length cap (truncation is reported)."""
    temperature: float = 0.0
    """Sampling temperature (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling: the smallest set of tokens with this much probability."""
    seed: int | None = None
    """Sampling seed (None: unseeded)."""
    stop: list[str] | None = None
    """Strings that end the reply as soon as they appear."""
    tools: list[dict[str, Any]] | None = None
    """The OpenAI `tools` schema offered to the model (None: a plain chat reply)."""
    tool_choice: str | dict[str, Any] | None = None
    """OpenAI `tool_choice`: "auto" | "none" | "required" | {"type": "function", ...}."""

    def cache_key(self) -> dict[str, Any]:
        key: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": self.stop,
        }
        if self.tools is not None:  # plain calls keep the keys they always had
            key["tools"] = self.tools
            key["tool_choice"] = self.tool_choice
        return key


@dataclass
class Completion:
    """One reply. `finish_reason == "length"` means the reply was truncated by max_tokens."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    finish_reason: str = "stop"
    retries: int = 0
    cached: bool = False
    model: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    tool_calls: list[ToolCall] | None = None
    """The reply's tool calls in the OpenAI shape (finish_reason "tool_calls"); None: none."""
    tool_call_errors: list[dict[str, Any]] | None = None
    """Malformed tool calls, one {"index", "error", "raw"} each (bad JSON, an unknown tool,
    arguments not an object, a truncated call): the reply then keeps its text and finish
    reason and has no `tool_calls`. None: nothing malformed."""
    # provider prompt caching (anthropic:, gemini:): parts of `prompt_tokens`, priced apart
    cache_read_tokens: int = 0
    """Prompt tokens the provider read from its prompt cache."""
    cache_write_tokens: int = 0
    """Prompt tokens the provider wrote into its prompt cache."""

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


def derive_seed(seed: int, index: int) -> int:
    """The seed of sample `index` among n drawn with `seed`: sample 0 keeps `seed` (so n=1 is
    a plain seeded call), the others get well-mixed seeds (so seeds s and s+1 share none)."""
    if index == 0:
        return seed
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def params_for_sample(params: GenerationParams, index: int) -> GenerationParams:
    """`params` for sample `index` of n: its own derived seed when `params.seed` is set."""
    if params.seed is None or index == 0:
        return params
    return dataclasses.replace(params, seed=derive_seed(params.seed, index))


@runtime_checkable
class ChatModel(Protocol):
    """Anything that answers chat messages. Implement `achat`; `chat` is the sync form and
    `achat_n` draws n completions of one prompt."""

    name: str

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion: ...

    async def achat_n(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]: ...

    def chat(self, messages: list[Message], params: GenerationParams) -> Completion: ...


class AsyncChatModel:
    """Base class: implement `achat`; get a sync `chat` and an `achat_n` (n concurrent calls)
    for free. `fingerprint` names the weights behind the replies (the response cache keys on
    it); backends that can tell one model from another by more than its name override it."""

    name: str = "model"

    @property
    def fingerprint(self) -> str:
        return self.name

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        raise NotImplementedError

    async def achat_n(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        """n completions of one prompt, as n concurrent `achat` calls; with `params.seed` set,
        sample i uses `derive_seed(seed, i)`, so the whole call is reproducible. Backends that
        can share the prompt's work between samples override this."""
        check_n(n)
        return list(
            await asyncio.gather(
                *(self.achat(messages, params_for_sample(params, i)) for i in range(n))
            )
        )

    def chat(self, messages: list[Message], params: GenerationParams | None = None) -> Completion:
        return run_sync(self.achat(messages, params or GenerationParams()))

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        pass


def check_n(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InputError(f"n must be an integer >= 1, got {n!r}")


# Async resources bound to one event loop (e.g. an HTTP client's connection pool), closed when
# the `run_sync` call that runs that loop ends, before the loop itself closes.
_LOOP_CLEANUPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Callable[[], Any]]] = (
    weakref.WeakKeyDictionary()
)


def close_with_loop(close: Callable[[], Any]) -> None:
    """Call `await close()` when the running loop's `run_sync` call ends (backends register
    their per-loop clients here: closed in time, they never warn "Event loop is closed")."""
    _LOOP_CLEANUPS.setdefault(asyncio.get_running_loop(), []).append(close)


C = TypeVar("C")


class PerLoop(Generic[C]):
    """One SDK client per running event loop (an SDK's async HTTP client is bound to the loop
    that first used it), each closed with its loop (`close_with_loop`)."""

    def __init__(self) -> None:
        self._items: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, C] = (
            weakref.WeakKeyDictionary()
        )

    def get(
        self,
        make: Callable[[], C],
        close: Callable[[C], Callable[[], Any]],
        is_closed: Callable[[C], bool] = lambda _: False,
    ) -> C:
        """This loop's client: `make()` the first time (or after it was closed)."""
        loop = asyncio.get_running_loop()
        item = self._items.get(loop)
        if item is None or is_closed(item):
            item = make()
            self._items[loop] = item
            close_with_loop(close(item))
        return item


Signer = Callable[[str, bytes], Mapping[str, str]]
"""Headers for a request, made from its URL's path and its body's bytes (the night's mark)."""


def signing_http_client(client_class: Callable[..., Any], sign: Signer | None) -> Any:
    """An SDK's default async httpx client that signs each request (`sign`: the night's
    mark, from the request's path and body), or None (the SDK's own) when nothing is to be
    signed."""
    if sign is None:
        return None

    async def signed(request: Any) -> None:
        request.headers.update(sign(request.url.path, request.read()))

    return client_class(event_hooks={"request": [signed]})


async def _with_cleanup(coro: Awaitable[T]) -> T:
    try:
        return await coro
    finally:
        for close in _LOOP_CLEANUPS.pop(asyncio.get_running_loop(), []):
            with contextlib.suppress(Exception):
                await close()


def run_sync(coro: Awaitable[T]) -> T:
    """Run a coroutine from sync code, also when called inside a running loop's thread pool."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_with_cleanup(coro))
    # Called from inside a loop (e.g. a scorer in a worker thread of a loop): use a fresh loop
    # in this thread is impossible, so run it in a helper thread.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, _with_cleanup(coro)).result()
