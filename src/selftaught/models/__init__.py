"""Who answers: one chat protocol over an OpenAI-compatible endpoint, Anthropic's or Google's
API (their SDKs, optional extras), the local model or a CLI agent."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from selftaught.errors import ConfigError
from selftaught.models.base import (
    AsyncChatModel,
    ChatModel,
    Completion,
    GenerationParams,
    Message,
    Signer,
)
from selftaught.models.errors import (
    CALL_TIMEOUT_S,
    BackendError,
    FatalBackendError,
    RetryPolicy,
    TransientBackendError,
)
from selftaught.models.spec import ModelSpec, ModelSpecError, parse_model_spec
from selftaught.models.usage import TrackedModel, UsageLedger

__all__ = [
    "AsyncChatModel",
    "BackendError",
    "ChatModel",
    "Completion",
    "FatalBackendError",
    "GenerationParams",
    "Message",
    "ModelOptions",
    "ModelSpec",
    "ModelSpecError",
    "RetryPolicy",
    "TrackedModel",
    "TransientBackendError",
    "UsageLedger",
    "load_model",
    "parse_model_spec",
]


class ModelOptions(TypedDict, total=False):
    """`load_model`'s options that a caller gives every model it loads (the CLI: `--api-key`,
    `--timeout`, `--cache`, `--device`; `NightConfig.model_options`)."""

    api_key: str | None
    timeout_s: float
    retry: RetryPolicy | None
    cache_path: str | Path | None
    device: str | None


def load_model(
    spec: str,
    *,
    api_key: str | None = None,
    timeout_s: float = CALL_TIMEOUT_S,
    retry: RetryPolicy | None = None,
    cache_path: str | Path | None = None,
    max_batch_size: int | None = None,
    device: str | None = None,
    sign: Signer | None = None,
) -> ChatModel:
    """Build a model from a spec string (see `selftaught.models.spec`). A CLI agent
    (claude-code, codex, cmd:) runs under `timeout_s` per run and `retry`; its other settings
    come from the environment (`selftaught.models.agents.settings`).

    `max_batch_size` and `device` apply to a local model: most sequences decoded together
    (default 8 on a CPU, 64 on an accelerator) and where it runs (default: CUDA, else MPS,
    else the CPU; see `selftaught.models.device.resolve_device`). `sign` applies to an
    OpenAI-compatible endpoint and to `anthropic:`: headers made from each request's path and
    body (a night's mark).
    `api_key` is the key of `openai:`, `anthropic:` or `gemini:` (default: the vendor's
    environment variable)."""
    parsed = parse_model_spec(spec)
    model: ChatModel
    if parsed.backend in ("claude-code", "codex", "cmd"):
        from selftaught.models.agents import load_agent

        if cache_path is not None:
            raise ConfigError(
                f"a response cache cannot serve {spec!r}: an agent's work is the files it "
                "leaves in its workspace, which a cached reply does not replay; drop --cache"
            )
        return load_agent(parsed.backend, parsed.model, timeout_s=timeout_s, retry=retry)
    if parsed.backend == "local":
        from selftaught.models.local import LocalModel

        model = LocalModel(parsed.model or None, max_batch_size=max_batch_size, device=device)
    elif parsed.backend == "anthropic":
        from selftaught.models.anthropic_native import AnthropicModel

        model = AnthropicModel(
            parsed.model, api_key=api_key, timeout_s=timeout_s, retry=retry, sign=sign
        )
    elif parsed.backend == "gemini":
        from selftaught.models.gemini_native import GeminiModel

        model = GeminiModel(parsed.model, api_key=api_key, timeout_s=timeout_s, retry=retry)
    else:
        from selftaught.models.openai_compat import OpenAICompatModel

        model = OpenAICompatModel(
            parsed.model,
            base_url=parsed.base_url,
            api_key=api_key,
            timeout_s=timeout_s,
            retry=retry or RetryPolicy(),
            sign=sign,
        )
    if cache_path is not None:
        from selftaught.models.cache import CachedModel, ResponseCache

        model = CachedModel(model, ResponseCache(cache_path))
    return model
