"""Where a local model runs and in which dtype: one choice for generation and training.

CUDA when present, else Apple's MPS, else the CPU; half precision on accelerators (bfloat16
where supported, float16 otherwise) and float32 on the CPU, where it is both the fastest and
the exact choice for these small models."""

from __future__ import annotations

from typing import Any

from selftaught.errors import ConfigError


def resolve_device(device: str | None = None) -> tuple[str, Any]:
    """The device to use and the dtype that fits it.

    Args:
        device: None or "auto" to pick the best available one, or an explicit torch device
            ("cpu", "cuda", "cuda:1", "mps"), which must be available.

    Returns:
        (device string, torch dtype), e.g. ("cuda", torch.bfloat16) or ("cpu", torch.float32).

    Raises:
        ValueError: an unknown device or one this machine does not have.
    """
    import torch

    name = (device or "auto").strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif _mps_available(torch):
            name = "mps"
        else:
            name = "cpu"
    try:
        kind = torch.device(name).type
    except RuntimeError as err:
        raise ConfigError(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps") from err
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {device!r} requested but CUDA is not available here")
        index = torch.device(name).index
        if index is not None and index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {device!r} requested but only {torch.cuda.device_count()} CUDA "
                "device(s) exist"
            )
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return name, dtype
    if kind == "mps":
        if not _mps_available(torch):
            raise ConfigError(f"device {device!r} requested but MPS is not available here")
        return name, torch.float16
    if kind == "cpu":
        return "cpu", torch.float32
    raise ConfigError(f"unsupported device {device!r}; use auto, cpu, cuda, cuda:N or mps")


def resolve_dtype(dtype: Any, default: Any) -> Any:
    """A torch dtype from a dtype, its name ("bfloat16") or None / "auto" (→ `default`)."""
    import torch

    if dtype is None or dtype == "auto":
        return default
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise ConfigError(f"unknown torch dtype {dtype!r}")
        return resolved
    if not isinstance(dtype, torch.dtype):
        raise ConfigError(f"dtype must be a torch dtype or its name, got {dtype!r}")
    return dtype


def _mps_available(torch: Any) -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())
