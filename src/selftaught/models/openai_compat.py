"""OpenAI-compatible backend (OpenAI, vLLM, SGLang, llama.cpp server, Ollama, `selftaught serve`)
on the official `openai` SDK. The SDK's own retries are off: our policy classifies errors."""

from __future__ import annotations

import os
import time
from typing import Any

import openai

from selftaught.models.base import AsyncChatModel, Completion, GenerationParams, Message
from selftaught.models.errors import (
    FatalBackendError,
    RetryPolicy,
    TransientBackendError,
    with_retries,
)

LOCAL_KEY = "EMPTY"  # local servers accept any key


def classify_openai_error(backend: str, err: Exception) -> Exception:
    """Map an SDK exception onto transient (retry) or fatal (stop the run)."""
    if isinstance(err, openai.APITimeoutError):
        return TransientBackendError(backend, "request timed out")
    if isinstance(err, openai.APIConnectionError):
        return TransientBackendError(backend, f"connection failed ({err.__cause__ or err})")
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        detail = _error_message(err)
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
    return err


def _error_message(err: openai.APIStatusError) -> str:
    body: Any = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:300]
        if isinstance(inner, str):
            return inner[:300]
    return (err.message or "")[:300]


class OpenAICompatModel(AsyncChatModel):
    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        retry: RetryPolicy | None = None,
    ):
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            if self.base_url is None:
                raise FatalBackendError(
                    "openai", "no API key: set OPENAI_API_KEY or pass --api-key"
                )
            key = LOCAL_KEY
        self.model = model
        self.backend = f"openai-compatible {self.base_url or 'api.openai.com'}"
        self.name = model or "default"
        self.retry = retry or RetryPolicy()
        self.timeout_s = timeout_s
        self._key = key
        self._clients: dict[int, openai.AsyncOpenAI] = {}
        self._checked = False

    def _client(self) -> openai.AsyncOpenAI:
        # httpx clients are bound to the event loop that created them: one per loop.
        import asyncio

        loop_id = id(asyncio.get_running_loop())
        client = self._clients.get(loop_id)
        if client is None:
            client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=self._key, timeout=self.timeout_s, max_retries=0
            )
            self._clients = {loop_id: client}  # old loops are gone; drop their clients
        return client

    async def list_models(self) -> list[str]:
        async def call() -> list[str]:
            try:
                page = await self._client().models.list()
            except Exception as err:  # noqa: BLE001 - classified below
                raise classify_openai_error(self.backend, err) from err
            return [m.id for m in page.data]

        models, _ = await with_retries(call, RetryPolicy(max_retries=1, base_delay_s=0.2))
        return models

    async def preflight(self) -> None:
        """Fail fast, in one sentence, on an unreachable endpoint, a rejected key or a model the
        server does not serve. Called once before the first chat."""
        if self._checked:
            return
        try:
            served = await self.list_models()
        except TransientBackendError as err:
            raise FatalBackendError(
                self.backend, f"cannot reach the endpoint: {err.cause}"
            ) from err
        except FatalBackendError as err:
            if err.status == 404:  # some servers have no /models route: let chat decide
                served = []
            else:
                raise
        if not self.model:
            if len(served) == 1:
                self.model = self.name = served[0]
            else:
                raise FatalBackendError(
                    self.backend,
                    "no model named; add '#MODEL' to the URL"
                    + (f" (served: {', '.join(served)})" if served else ""),
                )
        elif served and self.model not in served:
            raise FatalBackendError(
                self.backend,
                f"model {self.model!r} is not served here; available: {', '.join(served)}",
            )
        self._checked = True

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        await self.preflight()
        retries_seen = 0

        async def call() -> Completion:
            t0 = time.perf_counter()
            kwargs: dict[str, Any] = {
                "model": self.model,
                "messages": messages,
                "max_tokens": params.max_tokens,  # llama.cpp ignores max_completion_tokens
                "temperature": params.temperature,
                "top_p": params.top_p,
            }
            if params.seed is not None:
                kwargs["seed"] = params.seed
            if params.stop:
                kwargs["stop"] = params.stop
            try:
                resp = await self._client().chat.completions.create(**kwargs)
            except Exception as err:  # noqa: BLE001 - classified below
                raise classify_openai_error(self.backend, err) from err
            if not resp.choices:
                raise TransientBackendError(self.backend, "reply had no choices")
            choice = resp.choices[0]
            text = choice.message.content or ""
            if not text.strip():
                raise TransientBackendError(self.backend, "empty reply")
            usage = resp.usage
            return Completion(
                text=text,
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                latency_s=time.perf_counter() - t0,
                finish_reason=choice.finish_reason or "stop",
                model=resp.model or self.model,
            )

        def count(attempt: int, _err: TransientBackendError) -> None:
            nonlocal retries_seen
            retries_seen = attempt

        completion, retries = await with_retries(call, self.retry, on_retry=count)
        completion.retries = retries
        return completion
