"""OpenAI-compatible backend (OpenAI, vLLM, SGLang, llama.cpp server, Ollama, `selftaught serve`)
on the official `openai` SDK. The SDK's own retries are off: our policy classifies errors."""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from typing import Any

import openai

from selftaught.models.base import (
    AsyncChatModel,
    Completion,
    GenerationParams,
    Message,
    check_n,
    close_with_loop,
    params_for_sample,
)
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
        self._clients: weakref.WeakKeyDictionary[Any, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary()
        )
        self._checked = False
        self._n_supported: bool | None = None  # None: not tried yet

    def _client(self) -> openai.AsyncOpenAI:
        # httpx clients are bound to the event loop that created them: one per loop (keyed
        # by the loop itself: a new loop may reuse a dead one's id), closed with it.
        import asyncio

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed():
            client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=self._key, timeout=self.timeout_s, max_retries=0
            )
            self._clients[loop] = client
            close_with_loop(client.close)
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

    @property
    def fingerprint(self) -> str:
        """Endpoint and model name: all that tells one served model from another."""
        return f"{self.base_url or 'https://api.openai.com/v1'}#{self.model}"

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        completions = await self._choices(messages, params, 1)
        return completions[0]

    async def achat_n(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        """n completions in one request (OpenAI's `n`). A server that rejects `n` (llama.cpp's
        answers "Only one completion choice is allowed") gets n single requests from then on;
        choices it left out or left empty are topped up by single requests."""
        check_n(n)
        if n == 1 or self._n_supported is False:
            return await super().achat_n(messages, params, n)
        try:
            completions = await self._choices(messages, params, n)
        except _NRejected:
            self._n_supported = False
            return await super().achat_n(messages, params, n)
        self._n_supported = True
        kept = [c for c in completions if c.text.strip()][:n]
        missing = range(len(kept), n)
        extra = await asyncio.gather(
            *(self.achat(messages, params_for_sample(params, i)) for i in missing)
        )
        return kept + list(extra)

    async def _choices(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        """One request for `n` choices, with retries. With n == 1 an empty reply is a
        transient error; with n > 1 empty choices are returned for the caller to top up."""
        await self.preflight()
        retries_seen = 0

        async def call() -> list[Completion]:
            t0 = time.perf_counter()
            kwargs: dict[str, Any] = {
                "model": self.model,
                "messages": messages,
                "max_tokens": params.max_tokens,  # llama.cpp ignores max_completion_tokens
                "temperature": params.temperature,
                "top_p": params.top_p,
            }
            if n > 1:
                kwargs["n"] = n
            if params.seed is not None:
                kwargs["seed"] = params.seed
            if params.stop:
                kwargs["stop"] = params.stop
            try:
                resp = await self._client().chat.completions.create(**kwargs)
            except Exception as err:  # noqa: BLE001 - classified below
                if n > 1 and _rejects_n(err):
                    raise _NRejected from err
                raise classify_openai_error(self.backend, err) from err
            choices = sorted(resp.choices or [], key=lambda c: c.index)
            if not choices:
                raise TransientBackendError(self.backend, "reply had no choices")
            if n == 1 and not (choices[0].message.content or "").strip():
                raise TransientBackendError(self.backend, "empty reply")
            return _completions(resp, choices, self.model, time.perf_counter() - t0)

        def count(attempt: int, _err: TransientBackendError) -> None:
            nonlocal retries_seen
            retries_seen = attempt

        completions, retries = await with_retries(call, self.retry, on_retry=count)
        for c in completions:
            c.retries = retries
        return completions


class _NRejected(Exception):
    """The server refused a request for several choices (`n` > 1)."""


def _rejects_n(err: Exception) -> bool:
    """Whether an error answers the `n` parameter itself: a 400/422, or any status whose
    message is about choices (llama.cpp's server says so with a 500)."""
    if not isinstance(err, openai.APIStatusError):
        return False
    message = _error_message(err).lower()
    return err.status_code in (400, 422) or "choice" in message


def _completions(resp: Any, choices: list[Any], model: str, latency_s: float) -> list[Completion]:
    """One Completion per choice. Usage covers the whole request: the prompt is charged to
    the first choice (the others are marked `prompt_shared`), and with several choices the
    completion tokens are split in proportion to each choice's text (marked estimated)."""
    usage = resp.usage
    prompt = usage.prompt_tokens if usage else 0
    total = usage.completion_tokens if usage else 0
    texts = [c.message.content or "" for c in choices]
    if len(choices) == 1:
        shares = [total]
    else:
        chars = [max(1, len(t)) for t in texts]
        shares = [total * k // sum(chars) for k in chars]
        shares[0] += total - sum(shares)
    out = []
    for i, (choice, text, tokens) in enumerate(zip(choices, texts, shares, strict=True)):
        c = Completion(
            text=text,
            prompt_tokens=prompt,
            completion_tokens=tokens,
            latency_s=latency_s,
            finish_reason=choice.finish_reason or "stop",
            model=resp.model or model,
        )
        if i > 0:
            c.extra["prompt_shared"] = True
        if len(choices) > 1:
            c.extra["completion_tokens_estimated"] = True
        out.append(c)
    return out
