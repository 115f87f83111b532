"""Anthropic's Messages API (`anthropic:MODEL`) on the official `anthropic` SDK, an optional
extra imported only when such a model is built. The SDK's own retries are off: our policy
classifies errors (`classify_status`), as for every HTTP backend.

The system prompt (the skill and memory) goes in `system` with `cache_control: ephemeral` on
its last block, so the stable prefix (tools, then system) is cached between calls and cache
reads / writes come back in `usage`. The SDK (2.x) targets an API version that refuses
sampling settings (temperature, top_p) with a 400, so none are sent; n samples are n calls."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from selftaught.errors import MissingDependency
from selftaught.given_keys import add_secret
from selftaught.models.base import (
    AsyncChatModel,
    Completion,
    GenerationParams,
    Message,
    PerLoop,
    Signer,
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
from selftaught.models.native_messages import text_of, tool_call, tool_input

LOCAL_KEY = "EMPTY"  # a scripted or self-hosted Messages server accepts any key
CACHED = {"type": "ephemeral"}

FINISH = {
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def anthropic_sdk() -> Any:
    """The `anthropic` module, or a clear error naming the extra that installs it."""
    try:
        import anthropic
    except ImportError:
        raise MissingDependency(
            "anthropic:MODEL needs Anthropic's SDK: pip install 'selftaught[anthropic]'"
        ) from None
    return anthropic


def classify_anthropic_error(sdk: Any, backend: str, err: Exception) -> Exception:
    """Map an SDK exception onto transient (retry) or fatal (stop the run)."""
    if isinstance(err, sdk.APITimeoutError):
        return TransientBackendError(backend, "request timed out")
    if isinstance(err, sdk.APIConnectionError):
        return TransientBackendError(backend, f"connection failed ({err.__cause__ or err})")
    if isinstance(err, sdk.APIStatusError):
        detail = err.api_message or err.message or ""
        return classify_status(backend, err.status_code, str(detail))
    return err


class AnthropicModel(AsyncChatModel):
    """`anthropic:MODEL`: key from `api_key` or ANTHROPIC_API_KEY, endpoint from `base_url` or
    ANTHROPIC_BASE_URL (default api.anthropic.com)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = CALL_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        cache_prompt: bool = True,
        sign: Signer | None = None,
    ):
        """`sign`: headers to add to each request, made from its path and body (a night marks
        its own calls, so that a selftaught proxy at ANTHROPIC_BASE_URL relays, not logs,
        them). `cache_prompt`: mark the stable prefix for the prompt cache."""
        self._sdk = anthropic_sdk()
        self.base_url = (base_url or os.environ.get("ANTHROPIC_BASE_URL") or "").rstrip("/")
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            if not self.base_url:
                raise FatalBackendError(
                    "anthropic", "no API key: set ANTHROPIC_API_KEY or pass --api-key"
                )
            key = LOCAL_KEY
        self.model = self.name = model
        self.backend = f"anthropic {self.base_url or 'api.anthropic.com'}"
        self.retry = retry or RetryPolicy()
        self.timeout_s = timeout_s
        self.cache_prompt = cache_prompt
        self._key = key
        add_secret(key)  # cut from any text redacted: an upstream may quote it
        self._clients: PerLoop[Any] = PerLoop()
        self._sign = sign

    @property
    def fingerprint(self) -> str:
        return f"anthropic {self.base_url or 'https://api.anthropic.com'}#{self.model}"

    def _client(self) -> Any:
        return self._clients.get(
            lambda: self._sdk.AsyncAnthropic(
                api_key=self._key,
                base_url=self.base_url or None,
                timeout=self.timeout_s,
                max_retries=0,
                http_client=signing_http_client(self._sdk.DefaultAsyncHttpxClient, self._sign),
            ),
            close=lambda client: client.close,
            is_closed=lambda client: client.is_closed(),
        )

    def request(self, messages: list[Message], params: GenerationParams) -> dict[str, Any]:
        """The Messages API request for a chat in the OpenAI shape."""
        system, turns = to_messages(messages)
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": params.max_tokens,
            "messages": turns,
        }
        tools = to_tools(params) if params.tools else None
        if self.cache_prompt:  # the stable prefix's last block: system, else the tools
            if system:
                system[-1]["cache_control"] = CACHED
            elif tools:
                tools[-1]["cache_control"] = CACHED
        if system:
            kwargs["system"] = system
        if tools:
            kwargs["tools"] = tools
            if params.tool_choice is not None:
                kwargs["tool_choice"] = to_tool_choice(params.tool_choice)
        if params.stop:
            kwargs["stop_sequences"] = params.stop
        return kwargs

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        from selftaught.models.openai_compat import checked_completion

        kwargs = self.request(messages, params)

        async def call() -> Completion:
            t0 = time.perf_counter()
            try:
                resp = await self._client().messages.create(**kwargs)
            except Exception as err:  # noqa: BLE001 - classified below
                raise classify_anthropic_error(self._sdk, self.backend, err) from err
            c = to_completion(resp, self.model, time.perf_counter() - t0)
            if not c.text.strip() and not c.tool_calls:
                raise TransientBackendError(self.backend, "empty reply")
            return checked_completion(c, params)

        c, retries = await with_retries(call, self.retry)
        c.retries = retries
        return c


def to_messages(messages: list[Message]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system blocks, turns): system messages become `system` text blocks; tool results go
    in a user turn; consecutive turns of one role are merged (the API alternates roles)."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role in ("system", "developer"):
            text = text_of(m.get("content"))
            if text:
                system.append({"type": "text", "text": text})
            continue
        blocks = _blocks(m)
        if not blocks:
            continue
        who = "assistant" if role == "assistant" else "user"
        if turns and turns[-1]["role"] == who:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": who, "content": blocks})
    return system, turns


def _blocks(m: Message) -> list[dict[str, Any]]:
    """A message's content blocks: its text, its tool calls (tool_use), or a tool result."""
    text = text_of(m.get("content"))
    if m.get("role") == "tool":
        return [{"type": "tool_result", "tool_use_id": m.get("tool_call_id", ""), "content": text}]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for call in m.get("tool_calls") or []:
        fn = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": fn.get("name", ""),
                "input": tool_input(fn.get("arguments")),
            }
        )
    return blocks


def to_tools(params: GenerationParams) -> list[dict[str, Any]]:
    """OpenAI function tools as Messages API tools (name, description, input_schema)."""
    out = []
    for tool in params.tools or []:
        fn = tool.get("function") or {}
        spec: dict[str, Any] = {
            "name": fn.get("name", ""),
            "input_schema": fn.get("parameters") or {"type": "object", "properties": {}},
        }
        if fn.get("description"):
            spec["description"] = fn["description"]
        out.append(spec)
    return out


def to_tool_choice(choice: str | dict[str, Any]) -> dict[str, Any]:
    """OpenAI's tool_choice in the Messages API's words."""
    if isinstance(choice, dict):
        return {"type": "tool", "name": (choice.get("function") or {}).get("name", "")}
    return {"type": {"required": "any"}.get(choice, choice)}  # "auto" / "none" as they are


def to_completion(resp: Any, model: str, latency_s: float) -> Completion:
    """A Messages API reply as a Completion: text blocks joined, tool_use blocks as OpenAI
    tool calls; prompt_tokens counts every input token, cached or not."""
    texts, calls = [], []
    for block in resp.content or []:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            calls.append(tool_call(block.id, block.name, json.dumps(block.input)))
    usage = resp.usage
    read = (usage.cache_read_input_tokens or 0) if usage else 0
    write = (usage.cache_creation_input_tokens or 0) if usage else 0
    return Completion(
        text="".join(texts),
        prompt_tokens=(usage.input_tokens if usage else 0) + read + write,
        completion_tokens=usage.output_tokens if usage else 0,
        latency_s=latency_s,
        finish_reason=FINISH.get(resp.stop_reason or "", "stop"),
        model=resp.model or model,
        tool_calls=calls or None,
        cache_read_tokens=read,
        cache_write_tokens=write,
    )
