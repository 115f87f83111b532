"""Google's Gemini API (`gemini:MODEL`) on the official `google-genai` SDK, an optional extra
imported only when such a model is built. The SDK's own retries are off (no retry options):
our policy classifies errors (`classify_status`), as for every HTTP backend.

System messages become `system_instruction`; n samples are one request (`candidate_count`),
or n requests from then on where the model refuses it. Gemini caches repeated prompt
prefixes by itself (implicit caching): the tokens it read from its cache come back in usage
(`cachedContentTokenCount`) and are priced at its cache rate."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

from selftaught.errors import MissingDependency
from selftaught.given_keys import add_secret
from selftaught.models.base import (
    AsyncChatModel,
    Completion,
    GenerationParams,
    Message,
    PerLoop,
    check_n,
    params_for_sample,
)
from selftaught.models.errors import (
    CALL_TIMEOUT_S,
    FatalBackendError,
    RetryPolicy,
    TransientBackendError,
    classify_status,
    with_retries,
)
from selftaught.models.native_messages import text_of, tool_call, tool_input

LOCAL_KEY = "EMPTY"  # a scripted or self-hosted server accepts any key
BASE_URL_ENV = ("GEMINI_BASE_URL", "GOOGLE_GEMINI_BASE_URL")  # ours, then the SDK's own
KEY_ENV = ("GEMINI_API_KEY", "GOOGLE_API_KEY")

FINISH = {
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
}
TOOL_MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY"}


def genai_sdk() -> Any:
    """The `google.genai` module, or a clear error naming the extra that installs it."""
    try:
        from google import genai
    except ImportError:
        raise MissingDependency(
            "gemini:MODEL needs Google's google-genai SDK: pip install 'selftaught[gemini]'"
        ) from None
    return genai


def _transport_error(err: Exception) -> bool:
    """A timeout or a connection failure of the SDK's HTTP client (httpx or httpx2)."""
    if isinstance(err, (asyncio.TimeoutError, ConnectionError)):
        return True
    return any(
        cls.__module__.split(".")[0] in ("httpx", "httpx2") and cls.__name__ == "TransportError"
        for cls in type(err).__mro__
    )


def classify_gemini_error(genai: Any, backend: str, err: Exception) -> Exception:
    """Map an SDK exception onto transient (retry) or fatal (stop the run)."""
    if isinstance(err, genai.errors.APIError):
        detail = str(err.message or err.status or "")
        return classify_status(backend, int(err.code or 0), detail)
    if _transport_error(err):
        kind = "timed out" if "Timeout" in type(err).__name__ else f"failed ({err})"
        return TransientBackendError(backend, f"request {kind}")
    return err


class GeminiModel(AsyncChatModel):
    """`gemini:MODEL`: key from `api_key`, GEMINI_API_KEY or GOOGLE_API_KEY; endpoint from
    `base_url`, GEMINI_BASE_URL or GOOGLE_GEMINI_BASE_URL (default Google's)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = CALL_TIMEOUT_S,
        retry: RetryPolicy | None = None,
    ):
        self._genai = genai_sdk()
        env_url = next((os.environ[k] for k in BASE_URL_ENV if os.environ.get(k)), "")
        self.base_url = (base_url or env_url).rstrip("/")
        key = api_key or next((os.environ[k] for k in KEY_ENV if os.environ.get(k)), None)
        if not key:
            if not self.base_url:
                raise FatalBackendError(
                    "gemini", "no API key: set GEMINI_API_KEY (or GOOGLE_API_KEY) or pass --api-key"
                )
            key = LOCAL_KEY
        self.model = self.name = model.removeprefix("models/")
        self.backend = f"gemini {self.base_url or 'generativelanguage.googleapis.com'}"
        self.retry = retry or RetryPolicy()
        self.timeout_s = timeout_s
        self._key = key
        add_secret(key)  # cut from any text redacted: an upstream may quote it
        self._clients: PerLoop[Any] = PerLoop()
        self._n_supported: bool | None = None  # None: not tried yet

    @property
    def fingerprint(self) -> str:
        return f"gemini {self.base_url or 'https://generativelanguage.googleapis.com'}#{self.model}"

    def _client(self) -> Any:
        def make() -> Any:
            options: dict[str, Any] = {"timeout": int(self.timeout_s * 1000)}
            if self.base_url:
                options["base_url"] = self.base_url
            return self._genai.Client(api_key=self._key, vertexai=False, http_options=options)

        def close(client: Any) -> Callable[[], Any]:
            async def both() -> None:
                await client.aio.aclose()
                client.close()

            return both

        return self._clients.get(make, close)

    def config(self, messages: list[Message], params: GenerationParams, n: int) -> dict[str, Any]:
        """The GenerateContentConfig (as a dict) for a chat in the OpenAI shape."""
        config: dict[str, Any] = {
            "max_output_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            # our tools are schemas, never Python callables: the SDK must not call anything
            "automatic_function_calling": {"disable": True},
        }
        system = "\n\n".join(
            t
            for m in messages
            if m.get("role") in ("system", "developer")
            if (t := text_of(m.get("content")))
        )
        if system:
            config["system_instruction"] = system
        if n > 1:
            config["candidate_count"] = n
        if params.seed is not None:
            config["seed"] = params.seed
        if params.stop:
            config["stop_sequences"] = params.stop
        if params.tools:
            config["tools"] = [{"function_declarations": to_declarations(params)}]
            if params.tool_choice is not None:
                config["tool_config"] = {
                    "function_calling_config": to_tool_mode(params.tool_choice)
                }
        return config

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        return (await self._candidates(messages, params, 1))[0]

    async def achat_n(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        """n completions in one request (`candidate_count`); a model that refuses it (a 400)
        gets n single requests from then on; empty candidates are topped up one by one."""
        check_n(n)
        if n == 1 or self._n_supported is False:
            return await super().achat_n(messages, params, n)
        try:
            completions = await self._candidates(messages, params, n)
        except FatalBackendError as err:
            if err.status != 400:
                raise
            self._n_supported = False
            return await super().achat_n(messages, params, n)
        self._n_supported = True
        kept = [c for c in completions if c.text.strip() or c.tool_calls][:n]
        extra = await asyncio.gather(
            *(self.achat(messages, params_for_sample(params, i)) for i in range(len(kept), n))
        )
        return kept + list(extra)

    async def _candidates(
        self, messages: list[Message], params: GenerationParams, n: int
    ) -> list[Completion]:
        from selftaught.models.openai_compat import checked_completion

        contents = to_contents(messages)
        config = self.config(messages, params, n)

        async def call() -> list[Completion]:
            t0 = time.perf_counter()
            try:
                resp = await self._client().aio.models.generate_content(
                    model=self.model, contents=contents, config=config
                )
            except Exception as err:  # noqa: BLE001 - classified below
                raise classify_gemini_error(self._genai, self.backend, err) from err
            out = to_completions(resp, self.model, time.perf_counter() - t0)
            if not out or (n == 1 and not out[0].text.strip() and not out[0].tool_calls):
                raise TransientBackendError(self.backend, "empty reply")
            return [checked_completion(c, params) for c in out]

        completions, retries = await with_retries(call, self.retry)
        for c in completions:
            c.retries = retries
        return completions


def to_contents(messages: list[Message]) -> list[dict[str, Any]]:
    """The conversation (system messages left out: they are the system instruction) as Gemini
    contents: assistant turns are the `model` role, a tool result is a user turn's
    function_response, named after the call it answers."""
    names: dict[str, str] = {}  # tool call id -> function name
    contents: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role in ("system", "developer"):
            continue
        parts: list[dict[str, Any]] = []
        text = text_of(m.get("content"))
        if role == "tool":
            call_id = m.get("tool_call_id", "")
            answer = {"id": call_id, "name": names.get(call_id, ""), "response": {"result": text}}
            parts.append({"function_response": answer})
        elif text:
            parts.append({"text": text})
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            names[call.get("id", "")] = fn.get("name", "")
            args = tool_input(fn.get("arguments"))
            parts.append(
                {"function_call": {"id": call.get("id"), "name": fn.get("name"), "args": args}}
            )
        if not parts:
            continue
        who = "model" if role == "assistant" else "user"
        if contents and contents[-1]["role"] == who:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": who, "parts": parts})
    return contents


def to_declarations(params: GenerationParams) -> list[dict[str, Any]]:
    """OpenAI function tools as Gemini function declarations (JSON schema parameters)."""
    out = []
    for tool in params.tools or []:
        fn = tool.get("function") or {}
        decl: dict[str, Any] = {"name": fn.get("name", "")}
        if fn.get("description"):
            decl["description"] = fn["description"]
        if fn.get("parameters"):
            decl["parameters_json_schema"] = fn["parameters"]
        out.append(decl)
    return out


def to_tool_mode(choice: str | dict[str, Any]) -> dict[str, Any]:
    """OpenAI's tool_choice as Gemini's function calling config."""
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name", "")
        return {"mode": "ANY", "allowed_function_names": [name]}
    return {"mode": TOOL_MODES.get(choice, "AUTO")}


def to_completions(resp: Any, model: str, latency_s: float) -> list[Completion]:
    """One Completion per candidate. Usage covers the request: the prompt (and its cached
    part) is charged to the first candidate, the others marked `prompt_shared`; with several
    candidates the output tokens are split in proportion to each one's text (estimated)."""
    usage = resp.usage_metadata
    prompt = (usage.prompt_token_count or 0) if usage else 0
    read = (usage.cached_content_token_count or 0) if usage else 0
    total = (
        ((usage.candidates_token_count or 0) + (usage.thoughts_token_count or 0)) if usage else 0
    )
    out: list[Completion] = []
    for cand in sorted(resp.candidates or [], key=lambda c: c.index or 0):
        texts, calls = [], []
        for i, part in enumerate((cand.content.parts if cand.content else None) or []):
            if part.function_call is not None:
                fc = part.function_call
                call_id = fc.id or f"call_{len(out)}_{i}"
                calls.append(tool_call(call_id, fc.name or "", json.dumps(fc.args or {})))
            elif part.text and not part.thought:
                texts.append(part.text)
        reason = str(getattr(cand.finish_reason, "value", cand.finish_reason) or "STOP")
        out.append(
            Completion(
                text="".join(texts),
                latency_s=latency_s,
                finish_reason=FINISH.get(reason, "tool_calls" if calls else "stop"),
                model=resp.model_version or model,
                tool_calls=calls or None,
            )
        )
    sizes = [max(1, len(c.text) + len(json.dumps(c.tool_calls or ""))) for c in out]
    for i, c in enumerate(out):
        c.completion_tokens = total * sizes[i] // sum(sizes)
        if i == 0:
            c.prompt_tokens, c.cache_read_tokens = prompt, read
            c.completion_tokens += total - sum(total * s // sum(sizes) for s in sizes)
        else:
            c.extra["prompt_shared"] = True
        if len(out) > 1:
            c.extra["completion_tokens_estimated"] = True
    return out
