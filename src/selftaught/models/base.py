"""The one chat protocol every backend speaks."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]  # {"role": "system" | "user" | "assistant", "content": str}


@dataclass
class GenerationParams:
    """Sampling settings for one call. `max_tokens` is always sent (llama.cpp ignores
    `max_completion_tokens` and would generate to the context limit)."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | None = None

    def cache_key(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": self.stop,
        }


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

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@runtime_checkable
class ChatModel(Protocol):
    """Anything that answers chat messages. Implement `achat`; `chat` is the sync form."""

    name: str

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion: ...

    def chat(self, messages: list[Message], params: GenerationParams) -> Completion: ...


class AsyncChatModel:
    """Base class: implement `achat`; get a sync `chat` for free."""

    name: str = "model"

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        raise NotImplementedError

    def chat(self, messages: list[Message], params: GenerationParams | None = None) -> Completion:
        return run_sync(self.achat(messages, params or GenerationParams()))

    async def achat_n(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        """n completions of one conversation; by default n concurrent calls (each with its
        own derived seed when `params.seed` is set). Backends that can share the prompt
        (OpenAI's `n`, the local model) override this."""
        import dataclasses

        calls = [
            self.achat(
                messages,
                params
                if params.seed is None
                else dataclasses.replace(params, seed=params.seed + i),
            )
            for i in range(n)
        ]
        return list(await asyncio.gather(*calls))

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        pass


def run_sync(coro: Any) -> Any:
    """Run a coroutine from sync code, also when called inside a running loop's thread pool."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # Called from inside a loop (e.g. a scorer in a worker thread of a loop): use a fresh loop
    # in this thread is impossible, so run it in a helper thread.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
