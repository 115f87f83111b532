"""OpenAI-compatible backend (OpenAI, vLLM, SGLang, llama.cpp server, Ollama, `selftaught serve`)
on the official `openai` SDK. The SDK's own retries are off: our policy classifies errors."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import openai

from selftaught.errors import SelftaughtError
from selftaught.given_keys import add_secret
from selftaught.models.base import (
    AsyncChatModel,
    Completion,
    GenerationParams,
    Message,
    PerLoop,
    Signer,
    ToolCall,
    check_n,
    params_for_sample,
    signing_http_client,
)
from selftaught.models.errors import (
    CALL_TIMEOUT_S,
    FatalBackendError,
    RetryPolicy,
    TransientBackendError,
    classify_status,
    with_retries,
)
from selftaught.models.tools import check_tool_calls, tool_names

LOCAL_KEY = "EMPTY"  # local servers accept any key


def classify_openai_error(backend: str, err: Exception) -> Exception:
    """Map an SDK exception onto transient (retry) or fatal (stop the run)."""
    if isinstance(err, openai.APITimeoutError):
        return TransientBackendError(backend, "request timed out")
    if isinstance(err, openai.APIConnectionError):
        return TransientBackendError(backend, f"connection failed ({err.__cause__ or err})")
    if isinstance(err, openai.APIStatusError):
        return classify_status(backend, err.status_code, _error_message(err))
    return err


def _error_message(err: openai.APIStatusError) -> str:
    body: Any = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return err.message or ""


class OpenAICompatModel(AsyncChatModel):
    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = CALL_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        sign: Signer | None = None,
        strict_model: bool = False,
    ):
        """`sign`: headers to add to each request, made from its path and body (a night marks
        its own calls so that a selftaught proxy in front of this model does not log them).
        `strict_model`: a reply must name the model asked for (vLLM names a LoRA adapter's
        replies after it; one that answers as another model, e.g. its base, is a fatal
        error, never a reply of the adapter's)."""
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        # an endpoint the spec names gets the key given for it, never the user's OpenAI key
        key = api_key or (os.environ.get("OPENAI_API_KEY") if base_url is None else None)
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
        add_secret(key)  # cut from any text redacted: an upstream may quote it
        self._clients: PerLoop[openai.AsyncOpenAI] = PerLoop()
        self._checked = False
        self._n_supported: bool | None = None  # None: not tried yet
        self._sign = sign
        self.strict_model = strict_model

    def _client(self) -> openai.AsyncOpenAI:
        return self._clients.get(
            lambda: openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self._key,
                timeout=self.timeout_s,
                max_retries=0,
                http_client=signing_http_client(openai.DefaultAsyncHttpxClient, self._sign),
            ),
            close=lambda client: client.close,
            is_closed=lambda client: client.is_closed(),
        )

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
        kept = [c for c in completions if c.text.strip() or c.tool_calls][:n]
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
            if params.tools:  # only when set: plain requests stay as they were
                kwargs["tools"] = params.tools
                if params.tool_choice is not None:  # servers refuse it without tools
                    kwargs["tool_choice"] = params.tool_choice
            try:
                resp = await self._client().chat.completions.create(**kwargs)
            except Exception as err:  # noqa: BLE001 - classified below
                if n > 1 and _rejects_n(err):
                    raise _NRejected from err
                raise classify_openai_error(self.backend, err) from err
            if self.strict_model and resp.model != self.model:
                raise FatalBackendError(
                    self.backend,
                    f"asked for model {self.model!r}, the reply came from {resp.model!r}: the "
                    "server did not use the adapter asked for",
                )
            choices = sorted(resp.choices or [], key=lambda c: c.index)
            if not choices:
                raise TransientBackendError(self.backend, "reply had no choices")
            if n == 1 and _empty(choices[0].message):
                raise TransientBackendError(self.backend, "empty reply")
            completions = _completions(resp, choices, self.model, time.perf_counter() - t0)
            return [checked_completion(c, params) for c in completions]

        completions, retries = await with_retries(call, self.retry)
        for c in completions:
            c.retries = retries
        return completions


class _NRejected(SelftaughtError):
    """The server refused a request for several choices (`n` > 1)."""


def _rejects_n(err: Exception) -> bool:
    """Whether an error answers the `n` parameter itself: a 400/422, or any status whose
    message is about choices (llama.cpp's server says so with a 500)."""
    if not isinstance(err, openai.APIStatusError):
        return False
    message = _error_message(err).lower()
    return err.status_code in (400, 422) or "choice" in message


def _empty(message: Any) -> bool:
    """A reply with neither text nor tool calls."""
    return not (message.content or "").strip() and not message.tool_calls


def _tool_calls(message: Any) -> list[ToolCall] | None:
    """The message's tool calls as plain OpenAI-shaped dicts (None: none)."""
    calls = message.tool_calls
    if not calls:
        return None
    out = []
    for call in calls:
        fn = getattr(call, "function", None)  # a custom (non-function) call has none
        out.append(
            {
                "id": call.id,
                "type": call.type,
                "function": {
                    "name": getattr(fn, "name", None),
                    "arguments": getattr(fn, "arguments", None),
                },
            }
        )
    return out


def checked_completion(c: Completion, params: GenerationParams) -> Completion:
    """Hold a server's tool calls to the rules parsed ones meet (an offered tool, arguments a
    JSON object, a reply not cut by max_tokens): malformed ones move to
    `extra["malformed_tool_calls"]` and are reported in `tool_call_errors`; a reply of valid
    calls has finish_reason "tool_calls" (some servers say "stop")."""
    if c.tool_calls is None:
        return c
    names = tool_names(params.tools)
    errors = check_tool_calls(c.tool_calls, names) if params.tools else []
    if c.truncated:
        errors.append(
            {"index": len(c.tool_calls), "error": "the reply was cut by max_tokens", "raw": ""}
        )
    if errors:
        c.tool_call_errors = errors
        c.extra["malformed_tool_calls"] = c.tool_calls
        c.tool_calls = None
        if c.finish_reason == "tool_calls":
            c.finish_reason = "stop"
    elif c.finish_reason == "stop":
        c.finish_reason = "tool_calls"
    return c


def _completions(resp: Any, choices: list[Any], model: str, latency_s: float) -> list[Completion]:
    """One Completion per choice. Usage covers the whole request: the prompt is charged to
    the first choice (the others are marked `prompt_shared`), and with several choices the
    completion tokens are split in proportion to each choice's text (marked estimated)."""
    usage = resp.usage
    prompt = usage.prompt_tokens if usage else 0
    total = usage.completion_tokens if usage else 0
    texts = [c.message.content or "" for c in choices]
    calls = [_tool_calls(c.message) for c in choices]
    if len(choices) == 1:
        shares = [total]
    else:  # a choice's size: its text and its calls
        pairs = zip(texts, calls, strict=True)
        chars = [max(1, len(t) + (len(json.dumps(k)) if k else 0)) for t, k in pairs]
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
            tool_calls=calls[i],
        )
        if i > 0:
            c.extra["prompt_shared"] = True
        if len(choices) > 1:
            c.extra["completion_tokens_estimated"] = True
        out.append(c)
    return out
