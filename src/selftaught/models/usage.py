"""Usage accounting per role (target, optimizer, judge, ...): calls, tokens, latency, USD."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from selftaught.models.base import AsyncChatModel, ChatModel, Completion, GenerationParams, Message

# USD per 1M tokens (input, output) for models whose price is public; unknown → no USD.
PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1": (2.00, 8.00),
}


@dataclass
class RoleUsage:
    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    retries: int = 0
    errors: int = 0
    truncated: int = 0
    usd: float | None = None


@dataclass
class UsageLedger:
    """Thread-safe; one per run. Every call counts, the optimizer's and judge's too."""

    roles: dict[str, RoleUsage] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, role: str, model: str, c: Completion) -> None:
        """Charge one completion. One of n samples that shared its call's prompt
        (`extra["prompt_shared"]`, from `achat_n`) adds its output, not another call or prompt."""
        shared = bool(c.extra.get("prompt_shared"))
        prompt_tokens = 0 if shared else c.prompt_tokens
        with self._lock:
            u = self.roles.setdefault(role, RoleUsage())
            u.calls += int(not shared)
            u.cached_calls += int(c.cached and not shared)
            u.prompt_tokens += prompt_tokens
            u.completion_tokens += c.completion_tokens
            u.latency_s += 0.0 if shared else c.latency_s
            u.retries += c.retries
            u.truncated += int(c.truncated)
            price = PRICES_PER_MTOK.get(model.split("/")[-1])
            if price is not None and not c.cached:
                cost = (prompt_tokens * price[0] + c.completion_tokens * price[1]) / 1e6
                u.usd = (u.usd or 0.0) + cost

    def record_error(self, role: str, retries: int = 0) -> None:
        with self._lock:
            u = self.roles.setdefault(role, RoleUsage())
            u.errors += 1
            u.retries += retries

    def total_calls(self) -> int:
        return sum(u.calls for u in self.roles.values())

    def total_tokens(self) -> int:
        return sum(u.prompt_tokens + u.completion_tokens for u in self.roles.values())

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {role: asdict(u) for role, u in self.roles.items()}


class TrackedModel(AsyncChatModel):
    """Wraps a model so each call is charged to `role` in `ledger`."""

    def __init__(self, model: ChatModel, ledger: UsageLedger, role: str):
        self.inner = model
        self.ledger = ledger
        self.role = role
        self.name = model.name

    @property
    def fingerprint(self) -> str:
        return str(getattr(self.inner, "fingerprint", self.inner.name))

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        from selftaught.models.errors import BackendError

        try:
            c = await self.inner.achat(messages, params)
        except BackendError as err:
            self.ledger.record_error(self.role, err.retries)
            raise
        self.ledger.record(self.role, self.name, c)
        return c

    async def achat_n(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        from selftaught.models.errors import BackendError

        try:
            completions = await self.inner.achat_n(messages, params, n)
        except BackendError as err:
            self.ledger.record_error(self.role, err.retries)
            raise
        for c in completions:
            self.ledger.record(self.role, self.name, c)
        return completions

    def __getattr__(self, item: str) -> Any:  # expose backend extras (e.g. tokenizer)
        return getattr(self.inner, item)
