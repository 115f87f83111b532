"""Usage accounting per role (target, optimizer, judge, ...): calls, tokens, latency, USD, and
the run's budget.

A budget counts every call of every role charged to the ledger (target, optimizer, judge,
repairs, gate evaluations). A call is reserved before it is sent, so `calls` is never
exceeded even with many calls in flight; tokens and USD are known only after a call, so they
can overshoot by what the calls already in flight spend. Work that must stay outside a
budget (a run's final test evaluation) is charged to a ledger of its own."""

from __future__ import annotations

import math
import re
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, cast

from selftaught.errors import BudgetExhausted as BudgetExhausted
from selftaught.errors import ConfigError
from selftaught.models.base import AsyncChatModel, ChatModel, Completion, GenerationParams, Message

# USD per 1M tokens (input, output) for models whose price is public; unknown → no USD.
PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1": (2.00, 8.00),
    # Anthropic, https://docs.anthropic.com/en/docs/about-claude/pricing (read 2026)
    "claude-opus-4-6": (5.00, 25.00),
    "claude-opus-4-5": (5.00, 25.00),
    "claude-opus-4-1": (15.00, 75.00),
    "claude-sonnet-4-6": (3.00, 15.00),
    "claude-sonnet-4-5": (3.00, 15.00),
    "claude-haiku-4-5": (1.00, 5.00),
    # Google, https://ai.google.dev/gemini-api/docs/pricing (text, prompts up to 200k tokens)
    "gemini-2.5-pro": (1.25, 10.00),
    "gemini-2.5-flash": (0.30, 2.50),
    "gemini-2.5-flash-lite": (0.10, 0.40),
}

# USD per 1M prompt tokens (cache read, cache write) where the provider prices its prompt cache
# apart (same sources): Anthropic's cache hits are 0.1x input and its 5-minute cache writes
# 1.25x; Gemini's implicit cache reads are discounted and it has no write surcharge. A priced
# model absent here pays its input price for cached tokens.
CACHE_PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "claude-opus-4-6": (0.50, 6.25),
    "claude-opus-4-5": (0.50, 6.25),
    "claude-opus-4-1": (1.50, 18.75),
    "claude-sonnet-4-6": (0.30, 3.75),
    "claude-sonnet-4-5": (0.30, 3.75),
    "claude-haiku-4-5": (0.10, 1.25),
    "gemini-2.5-pro": (0.125, 1.25),
    "gemini-2.5-flash": (0.03, 0.30),
    "gemini-2.5-flash-lite": (0.01, 0.10),
}

_DATED = re.compile(r"-\d{8}$")  # a dated snapshot (claude-haiku-4-5-20251001) prices as its alias


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
    # provider prompt caching (anthropic:, gemini:): parts of prompt_tokens
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class RoleUsageDict(TypedDict, total=False):
    """One role's `RoleUsage` as JSON holds it (a run written before a key existed lacks it)."""

    calls: int
    cached_calls: int
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    retries: int
    errors: int
    truncated: int
    usd: float | None
    cache_read_tokens: int
    cache_write_tokens: int


Usage = dict[str, RoleUsageDict]
"""What a run spent, role by role (`UsageLedger.to_dict()`, `RunResult.usage`)."""


LOCAL_PREFIX = "local:"  # in-process models cost no USD
AGENT_PREFIXES = ("claude-code:", "codex:")


def price_name(model: str) -> str:
    """The price table's name for a model: its last path part, an agent's prefix and a
    snapshot date dropped."""
    name = model.split("/")[-1]
    for prefix in AGENT_PREFIXES:
        name = name.removeprefix(prefix)
    return name if name in PRICES_PER_MTOK else _DATED.sub("", name)


REPORTS_COST = ("claude-code",)
"""CLI agents whose own output says what a run cost (Claude Code's `total_cost_usd`): that
figure is what the run is charged, whatever its model. Codex reports tokens only, so a
`codex:MODEL` run is priced by its tokens at MODEL's price (unknown without one)."""


def reports_cost(model: str) -> bool:
    """A model whose every reply says what it cost (`REPORTS_COST`)."""
    return model.split(":", 1)[0] in REPORTS_COST


def price_known(model: str) -> bool:
    return (
        model.startswith(LOCAL_PREFIX)
        or reports_cost(model)
        or price_name(model) in PRICES_PER_MTOK
    )


def reported_usd(c: Completion) -> float | None:
    """What a coding agent said its run cost (`extra["agent"]["total_cost_usd"]`, Claude
    Code's), or None when it said nothing usable."""
    agent = c.extra.get("agent")
    value = agent.get("total_cost_usd") if isinstance(agent, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def call_usd(model: str, c: Completion, prompt_tokens: int) -> float | None:
    """What one completion cost (None: the price is unknown): what a coding agent reported it
    cost, else its tokens at the price table's rates. Cached prompt tokens are priced at the
    cache's rates; `prompt_tokens` is 0 for a sample that shared its call's prompt."""
    if model.startswith(LOCAL_PREFIX):
        return 0.0
    reported = reported_usd(c)
    if reported is not None:
        return reported
    name = price_name(model)
    price = PRICES_PER_MTOK.get(name)
    if price is None:
        return None
    read, write = (c.cache_read_tokens, c.cache_write_tokens) if prompt_tokens else (0, 0)
    read_price, write_price = CACHE_PRICES_PER_MTOK.get(name, (price[0], price[0]))
    uncached = max(0, prompt_tokens - read - write)
    cost = uncached * price[0] + read * read_price + write * write_price
    return (cost + c.completion_tokens * price[1]) / 1e6


@dataclass(frozen=True)
class Budget:
    """The most a run may spend; None means no limit. Every role counts by default (target,
    optimizer, judge); `roles` narrows what counts, e.g. GEPA's `max_metric_calls` (target
    rollouts only) is `Budget(calls=N, roles=("target",))`."""

    calls: int | None = None
    """Stop cleanly after this many calls."""
    tokens: int | None = None
    """Stop cleanly after this many tokens."""
    usd: float | None = None
    """Stop cleanly after this many USD (known prices only)."""
    roles: tuple[str, ...] | None = None
    """Roles the budget counts, comma-separated, e.g. 'target' (GEPA's metric calls); unset:
    every role."""

    def __post_init__(self) -> None:
        for name in ("calls", "tokens", "usd"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"budget {name} must be > 0 (or unset), got {value}")

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.calls, self.tokens, self.usd))

    def check_priced(self, models: list[str]) -> None:
        """A USD budget needs every model's price; refuse at the start, not mid-run."""
        if self.usd is None:
            return
        unknown = sorted({m for m in models if not price_known(m)})
        if unknown:
            raise ConfigError(
                f"--budget-usd needs a known price for every model; unknown: "
                f"{', '.join(unknown)} (known: {', '.join(sorted(PRICES_PER_MTOK))}, local:*, "
                "claude-code, which reports its cost); "
                "use --budget-calls or --budget-tokens instead"
            )


@dataclass
class UsageLedger:
    """Thread-safe; one per run. Every call counts, the optimizer's and judge's too."""

    roles: dict[str, RoleUsage] = field(default_factory=dict)
    budget: Budget = field(default_factory=Budget)
    _in_flight: int = field(default=0, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def exhausted(self) -> str | None:
        """Why the budget is spent (None while it is not); counts the calls in flight."""
        with self._lock:
            return self._exhausted()

    def _counted(self, role: str) -> bool:
        return self.budget.roles is None or role in self.budget.roles

    def _exhausted(self) -> str | None:
        b = self.budget
        counted = [u for role, u in self.roles.items() if self._counted(role)]
        calls = sum(u.calls + u.errors for u in counted) + self._in_flight
        if b.calls is not None and calls >= b.calls:
            return f"{calls} of {b.calls} calls used"
        tokens = sum(u.prompt_tokens + u.completion_tokens for u in counted)
        if b.tokens is not None and tokens >= b.tokens:
            return f"{tokens} of {b.tokens} tokens used"
        usd = sum(u.usd or 0.0 for u in counted)
        if b.usd is not None and usd >= b.usd:
            return f"${usd:.4f} of ${b.usd:.4f} spent"
        return None

    def reserve(self, role: str) -> bool:
        """Before a call of `role`: raise BudgetExhausted when it would exceed the budget.
        Returns whether the call was reserved (it is only when its role counts)."""
        with self._lock:
            why = self._exhausted()
            if why is not None:
                raise BudgetExhausted(why)
            if not self._counted(role):
                return False
            self._in_flight += 1
            return True

    def _settle(self, reserved: bool) -> None:
        if reserved:
            self._in_flight = max(0, self._in_flight - 1)

    def record(self, role: str, model: str, c: Completion, *, reserved: bool = False) -> None:
        """Charge one completion (`reserved`: its call was reserved with `reserve()`). One of
        n samples that shared its call's prompt (`extra["prompt_shared"]`, from `achat_n`)
        adds its output, not another call or prompt."""
        shared = bool(c.extra.get("prompt_shared"))
        prompt_tokens = 0 if shared else c.prompt_tokens
        with self._lock:
            self._settle(reserved)
            u = self.roles.setdefault(role, RoleUsage())
            u.calls += int(not shared)
            u.cached_calls += int(c.cached and not shared)
            u.prompt_tokens += prompt_tokens
            u.completion_tokens += c.completion_tokens
            u.latency_s += 0.0 if shared else c.latency_s
            u.retries += c.retries
            u.truncated += int(c.truncated)
            if not shared:
                u.cache_read_tokens += c.cache_read_tokens
                u.cache_write_tokens += c.cache_write_tokens
            cost = call_usd(model, c, prompt_tokens)
            if cost is not None and not c.cached:
                u.usd = (u.usd or 0.0) + cost

    def record_error(self, role: str, retries: int = 0, *, reserved: bool = False) -> None:
        """Charge one failed, timed-out or cancelled call: it may have cost the backend work."""
        with self._lock:
            self._settle(reserved)
            u = self.roles.setdefault(role, RoleUsage())
            u.errors += 1
            u.retries += retries

    def total_calls(self) -> int:
        return sum(u.calls for u in self.roles.values())

    def total_tokens(self) -> int:
        return sum(u.prompt_tokens + u.completion_tokens for u in self.roles.values())

    def to_dict(self) -> Usage:
        with self._lock:
            return {role: cast(RoleUsageDict, asdict(u)) for role, u in self.roles.items()}


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

        reserved = self.ledger.reserve(self.role)
        try:
            c = await self.inner.achat(messages, params)
        except BackendError as err:
            self.ledger.record_error(self.role, err.retries, reserved=reserved)
            raise
        except BaseException:  # cancelled or timed out: still a call the backend saw
            self.ledger.record_error(self.role, reserved=reserved)
            raise
        self.ledger.record(self.role, self.name, c, reserved=reserved)
        return c

    async def achat_n(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        """One request for n completions: reserved (against the budget) as one call."""
        from selftaught.models.errors import BackendError

        reserved = self.ledger.reserve(self.role)
        try:
            completions = await self.inner.achat_n(messages, params, n)
        except BackendError as err:
            self.ledger.record_error(self.role, err.retries, reserved=reserved)
            raise
        except BaseException:  # cancelled or timed out: still a call the backend saw
            self.ledger.record_error(self.role, reserved=reserved)
            raise
        for i, c in enumerate(completions):
            self.ledger.record(self.role, self.name, c, reserved=reserved and i == 0)
        return completions

    def __getattr__(self, item: str) -> Any:  # expose backend extras (e.g. tokenizer)
        return getattr(self.inner, item)
