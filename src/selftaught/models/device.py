"""Where a local model runs and in which dtype: the one place that decides, for generation and
training.

CUDA when present, else Apple's MPS, else the CPU; half precision on accelerators (bfloat16
where supported, float16 otherwise). On the CPU, weights load in float32 (training keeps its
master weights there), and bfloat16 is decided apart for the two uses, per CPU: it pays only
on a CPU with AVX512-BF16 or AMX instructions, and only where measured as fast and as accurate.

- **inference** (`inference_dtype`): the dtype a local model is loaded in to answer. The
  setting is `SELFTAUGHT_DTYPE` (`auto`, `float32`, `bfloat16`) or `LocalModel(dtype=...)`;
  `auto` is bfloat16 on a CPU with bf16 support when `CPU_BF16_INFERENCE`, float32 on others.
- **training** (`training_autocast`): bf16 autocast over float32 weights for a fine-tune. The
  setting is `SFTTrainConfig.bf16` (True / False force it); None (`auto`) is on for a CPU with
  bf16 support when `CPU_BF16_TRAINING`, off on accelerators (the weights are half already).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from selftaught.errors import ConfigError

DTYPE_ENV = "SELFTAUGHT_DTYPE"
DTYPE_SETTINGS = ("auto", "float32", "bfloat16")

# The per-CPU defaults, set from benchmarks/bench_dtype.py's measurements (SFT step time and
# replies / accuracy, fp32 against bf16) and tool ReST's accuracy (bench_tool_rest.py):
# `auto` chooses bf16 only on a CPU that has AVX512-BF16 or AMX *and* when the constant is
# True. Measured on AVX512-BF16 (results/dtype_cpu.json): decode 1.90x [1.65, 2.19] as fast,
# an SFT step 0.74x [0.65, 0.83] the time, the same accuracy (8 vs 7 of 40 items).
CPU_BF16_INFERENCE = True
CPU_BF16_TRAINING = True


@dataclass(frozen=True)
class CpuBf16:
    """The CPU's bfloat16 instructions, as torch detects them."""

    avx512_bf16: bool
    amx: bool

    @property
    def supported(self) -> bool:
        """bf16 matmuls run natively here (else torch emulates them, slower than fp32)."""
        return self.avx512_bf16 or self.amx

    def describe(self) -> str:
        yes = [name for name, on in (("AVX512-BF16", self.avx512_bf16), ("AMX", self.amx)) if on]
        return ", ".join(yes) if yes else "neither AVX512-BF16 nor AMX"


def cpu_bf16_support() -> CpuBf16:
    """This CPU's bf16 instructions (torch's own checks; False where torch lacks one)."""
    import torch

    def check(name: str) -> bool:
        probe = getattr(torch.cpu, name, None)
        return bool(probe()) if callable(probe) else False

    return CpuBf16(check("_is_avx512_bf16_supported"), check("_is_amx_tile_supported"))


def dtype_setting(env: Mapping[str, str] | None = None) -> str:
    """`SELFTAUGHT_DTYPE`: `auto` (also when unset or empty), `float32` or `bfloat16`."""
    value = (os.environ if env is None else env).get(DTYPE_ENV)
    name = (value or "").strip().lower() or "auto"
    if name not in DTYPE_SETTINGS:
        raise ConfigError(f"{DTYPE_ENV} must be one of {', '.join(DTYPE_SETTINGS)}, got {value!r}")
    return name


def inference_dtype(device: str, setting: Any = None) -> Any:
    """The dtype a local model answers in on `device`: `setting` (a torch dtype or its name;
    None reads `SELFTAUGHT_DTYPE`) when it names one; for `auto`, the accelerator's half
    precision, or on a CPU bfloat16 where it has bf16 instructions and `CPU_BF16_INFERENCE`
    is on, else float32."""
    import torch

    if setting is None:
        setting = dtype_setting()
    if setting != "auto":
        return resolve_dtype(setting, None)
    if torch.device(device).type != "cpu":
        return resolve_device(device)[1]
    if CPU_BF16_INFERENCE and cpu_bf16_support().supported:
        return torch.bfloat16
    return torch.float32


def training_autocast(setting: bool | None, device_type: str) -> bool:
    """Whether a fine-tune runs in bf16 autocast: `setting` (`SFTTrainConfig.bf16`) when
    given; None (auto): on a CPU with bf16 instructions when `CPU_BF16_TRAINING`, off on an
    accelerator (its weights are loaded in half precision already)."""
    if setting is not None:
        return setting
    if device_type != "cpu":
        return False
    return CPU_BF16_TRAINING and cpu_bf16_support().supported


@dataclass(frozen=True)
class Precision:
    """What `auto` resolves to on this machine's default device (`selftaught doctor`)."""

    device: str
    cpu: CpuBf16
    setting: str  # SELFTAUGHT_DTYPE
    inference: str  # the dtype's name, e.g. "float32"
    autocast: bool  # training's bf16 autocast under SFTTrainConfig.bf16 = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "avx512_bf16": self.cpu.avx512_bf16,
            "amx": self.cpu.amx,
            "setting": self.setting,
            "inference": self.inference,
            "autocast": self.autocast,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Precision:
        cpu = CpuBf16(bool(d.get("avx512_bf16")), bool(d.get("amx")))
        return cls(
            str(d["device"]), cpu, str(d["setting"]), str(d["inference"]), bool(d["autocast"])
        )


def precision(env: Mapping[str, str] | None = None) -> Precision:
    """The inference dtype and training autocast `auto` gives here, with the setting."""
    setting = dtype_setting(env)
    device = resolve_device(None)[0]
    kind = "cpu" if device == "cpu" else "accelerator"
    dtype = inference_dtype(device, setting)
    return Precision(
        device,
        cpu_bf16_support(),
        setting,
        dtype_name(dtype),
        training_autocast(None, kind),
    )


def dtype_name(dtype: Any) -> str:
    """`torch.bfloat16` → `bfloat16`."""
    return str(dtype).removeprefix("torch.")


def resolve_device(device: str | None = None) -> tuple[str, Any]:
    """The device to use and the dtype a model is loaded in there to train (on the CPU
    float32 always; the inference dtype is `inference_dtype`'s).

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
