"""Who answers: one chat protocol over an OpenAI-compatible endpoint or the local model."""

from __future__ import annotations

from pathlib import Path

from selftaught.models.base import (
    AsyncChatModel,
    ChatModel,
    Completion,
    GenerationParams,
    Message,
)
from selftaught.models.errors import (
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
    "ModelSpec",
    "ModelSpecError",
    "RetryPolicy",
    "TrackedModel",
    "TransientBackendError",
    "UsageLedger",
    "load_model",
    "parse_model_spec",
]


def load_model(
    spec: str,
    *,
    api_key: str | None = None,
    timeout_s: float = 120.0,
    retry: RetryPolicy | None = None,
    cache_path: str | Path | None = None,
    max_batch_size: int = 8,
) -> ChatModel:
    """Build a model from a spec string (see `selftaught.models.spec`)."""
    parsed = parse_model_spec(spec)
    model: ChatModel
    if parsed.backend == "local":
        from selftaught.models.local import LocalModel

        model = LocalModel(parsed.model or None, max_batch_size=max_batch_size)
    else:
        from selftaught.models.openai_compat import OpenAICompatModel

        model = OpenAICompatModel(
            parsed.model,
            base_url=parsed.base_url,
            api_key=api_key,
            timeout_s=timeout_s,
            retry=retry or RetryPolicy(),
        )
    if cache_path is not None:
        from selftaught.models.cache import CachedModel, ResponseCache

        model = CachedModel(model, ResponseCache(cache_path))
    return model
