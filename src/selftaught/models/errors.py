"""Backend errors and the retry policy: transient errors are retried with backoff and
jitter (bounded); fatal errors stop the run at once. Neither is ever scored as a wrong answer."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from selftaught.errors import BackendError as BackendError
from selftaught.errors import InputError

T = TypeVar("T")

CALL_TIMEOUT_S = 120.0
"""Seconds one model call may take before it counts as failed (then retried)."""


class ModelSpecError(InputError):
    """A model spec that names no known backend or model."""


class TransientBackendError(BackendError):
    """Timeout, 429, 5xx, connection reset, empty reply: worth retrying."""


class FatalBackendError(BackendError):
    """401/403, unknown model, unreachable endpoint after retries, bad request: stop the run."""


DETAIL_CHARS = 300  # of a server's message, kept in the error


def server_detail(message: str) -> str:
    """A server's error message as an error may hold it: redacted (a server may quote the key
    it was sent), then cut to DETAIL_CHARS, so that the cut never leaves a key's first part."""
    from selftaught.redact import redact_for_model

    return redact_for_model(message[: 16 * DETAIL_CHARS])[:DETAIL_CHARS]


def classify_status(backend: str, status: int, detail: str) -> BackendError:
    """One rule for every HTTP backend: 408, 409, 425, 429 and 5xx (Anthropic's 529
    "overloaded" too) are transient; 401/403 (a rejected key), 404 (no such model or URL) and
    any other 4xx are fatal, each with the server's own message (`server_detail`)."""
    detail = server_detail(detail)
    if status in (408, 409, 425, 429) or status >= 500:
        return TransientBackendError(backend, f"HTTP {status}: {detail}", status=status)
    if status in (401, 403):
        return FatalBackendError(
            backend, f"HTTP {status}: the API key was rejected ({detail})", status=status
        )
    if status == 404:
        return FatalBackendError(
            backend, f"HTTP 404: model or URL not found ({detail})", status=status
        )
    return FatalBackendError(backend, f"HTTP {status}: {detail}", status=status)


@dataclass
class RetryPolicy:
    max_retries: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    jitter: float = 0.5  # fraction of the delay drawn at random

    def delay(self, attempt: int) -> float:
        d = min(self.max_delay_s, self.base_delay_s * (2.0**attempt))
        return d * (1 - self.jitter + self.jitter * random.random())


async def with_retries(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    on_retry: Callable[[int, TransientBackendError], None] | None = None,
) -> tuple[T, int]:
    """Run `call`, retrying transient errors. Returns (result, retries used)."""
    attempt = 0
    while True:
        try:
            return await call(), attempt
        except TransientBackendError as err:
            if attempt >= policy.max_retries:
                final = TransientBackendError(
                    err.backend, f"{err.cause} (gave up after {attempt} retries)", status=err.status
                )
                final.retries = attempt
                raise final from err
            if on_retry is not None:
                on_retry(attempt + 1, err)
            await asyncio.sleep(policy.delay(attempt))
            attempt += 1
