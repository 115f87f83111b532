"""A local model with a LoRA adapter folded in: how an adopted or staged adapter is served.

The adapter is applied to a copy of the base weights and merged (`weights.sft.apply_adapter`),
so replies cost what the base's cost and the base stays untouched for other adapters (and
for training the next one, which starts from the adapter, not from the merged weights)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from selftaught.errors import InputError
from selftaught.models.local import LocalModel


class AdapterError(InputError):
    """An adapter folder that cannot be served on this base; the message says why."""


class AdaptedLocalModel(LocalModel):
    """`base` with the adapter in `adapter_dir` merged in; named like the base, so clients and
    logs see one model whichever adapter serves."""

    base: LocalModel
    adapter_dir: Path


def check_adapter(base: LocalModel, adapter_dir: Path) -> None:
    """Refuse a folder that is not a peft adapter, or one trained on another base folder."""
    config_file = Path(adapter_dir) / "adapter_config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdapterError(
            f"{adapter_dir} is not a LoRA adapter (no adapter_config.json)"
        ) from None
    except ValueError as err:
        raise AdapterError(f"{config_file} is malformed: {err}") from None
    trained_on = config.get("base_model_name_or_path")
    if base._in_memory or not trained_on or not Path(trained_on).exists():
        return  # nothing on disk to compare with; peft checks the shapes when it loads
    if Path(trained_on).resolve() != base.path.resolve():
        raise AdapterError(
            f"the adapter in {adapter_dir} was trained on {trained_on}, not on the served model "
            f"{base.path}; serve that model, or train an adapter for this one"
        )


def with_adapter(base: LocalModel, adapter_dir: str | Path) -> AdaptedLocalModel:
    """A new model: a copy of `base`'s weights with the adapter merged in (base unchanged)."""
    from selftaught.weights.sft import apply_adapter

    adapter_dir = Path(adapter_dir)
    check_adapter(base, adapter_dir)
    weights = apply_adapter(copy.deepcopy(base.model), adapter_dir).eval()
    served = AdaptedLocalModel(model=weights, tokenizer=base.tokenizer, name=base.name)
    served._max_batch_arg = base._max_batch_arg
    served.base, served.adapter_dir = base, adapter_dir
    return served
