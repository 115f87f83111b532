"""The one place a model given to the library becomes what a trainer needs: a spec string
(`local`, `local:PATH`, `openai:NAME`, `anthropic:NAME`, `gemini:NAME`,
`http://HOST:PORT/v1#NAME`, ...) or a `ChatModel` object.

- `resolve_model`: the `ChatModel` that answers (text space: evaluation, skill runs, nights);
- `local_model_path`: where the weights a weight-space trainer changes are (a local model
  only: `local`, `local:PATH`, a path, or a `LocalModel` loaded from one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selftaught.errors import ConfigError
from selftaught.models.base import ChatModel

ModelLike = str | ChatModel
"""A model spec string or a `ChatModel` object."""


def resolve_model(model: ModelLike, **options: Any) -> ChatModel:
    """A ChatModel from a spec string (`options`: `load_model` keywords) or as given."""
    if isinstance(model, str):
        from selftaught.models import load_model

        return load_model(model, **options)
    if not isinstance(model, ChatModel):
        raise ConfigError(f"a model is a spec string or a ChatModel, got {type(model).__name__}")
    return model


def local_model_path(model: ModelLike | Path | None) -> Path | None:
    """Where the weights to train are: None (the embedded model) for None or `local`, the
    path of `local:PATH`, a path as given, or the files a `LocalModel` was loaded from. Any
    other model is refused: training changes weights, so the model must be local."""
    if model is None or isinstance(model, Path):
        return model
    if not isinstance(model, str):
        model = _local_spec(model)
    from selftaught.models.spec import parse_model_spec

    try:
        spec = parse_model_spec(model)
    except ValueError:
        spec = None
    if spec is None or spec.backend != "local":
        raise ConfigError(
            f"training changes weights, so the model must be local or local:PATH, got {model!r}"
        )
    return Path(spec.model) if spec.model else None


def _local_spec(model: Any) -> str:
    """The spec of a LocalModel's files (a model in memory has none)."""
    from selftaught.models.local import LocalModel

    if not isinstance(model, LocalModel):
        name = getattr(model, "name", type(model).__name__)
        raise ConfigError(
            f"training changes weights, so the model must be local or local:PATH, got {name!r}"
        )
    if model.spec is None:
        raise ConfigError(
            f"{model.name} is a model in memory: save it (save_pretrained) and train from "
            "its folder (local:PATH)"
        )
    return model.spec
