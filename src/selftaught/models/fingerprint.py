"""Fingerprints of local weights: a short hash that changes when the weights change, so a
response cache never serves one model's replies to another that happens to share its name
(every trained model is named after its folder, `best`).

Both forms are sampled, not exhaustive, to stay cheap on large models: small files and small
tensors (adapters, norms) are hashed whole; large ones by their size, shape and dtype plus a
fixed, evenly spread sample of their content. Training changes essentially every weight of
the tensors it touches, so the sample sees it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

WHOLE_FILE_BYTES = 32 * 2**20  # files up to this size are hashed entirely
FILE_CHUNKS = 256  # evenly spaced chunks sampled from a larger file
CHUNK_BYTES = 64 * 2**10
WHOLE_TENSOR_ELEMENTS = 2**16  # tensors up to this size are hashed entirely
TENSOR_SAMPLES = 4096  # evenly spaced elements sampled from a larger tensor
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
CONFIG_NAMES = ("config.json", "adapter_config.json", "generation_config.json")


def fingerprint_path(path: str | Path) -> str:
    """Fingerprint of a model folder (its configs and weight files) or of one weight file."""
    root = Path(path)
    digest = hashlib.sha256()
    files = [root] if root.is_file() else sorted(_model_files(root))
    if not files:
        raise FileNotFoundError(f"no model files to fingerprint in {root}")
    for f in files:
        digest.update(f.relative_to(root).as_posix().encode() if f != root else f.name.encode())
        _hash_file(f, digest)
    return digest.hexdigest()[:32]


def fingerprint_module(model: Any) -> str:
    """Fingerprint of an in-memory torch model (adapters included): every named parameter
    and buffer's name, shape and dtype, and a sample of its values."""
    import torch

    digest = hashlib.sha256()
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        digest.update(json.dumps(config.to_dict(), sort_keys=True, default=str).encode())
    with torch.no_grad():
        for name, tensor in _named_tensors(model):
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
            flat = tensor.detach().reshape(-1)
            if flat.numel() > WHOLE_TENSOR_ELEMENTS:
                stride = flat.numel() // TENSOR_SAMPLES
                flat = flat[::stride][:TENSOR_SAMPLES]
            # float32 on the CPU: bytes independent of the device and of bf16 support.
            digest.update(flat.to(device="cpu", dtype=torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


def _model_files(root: Path) -> list[Path]:
    found = []
    for f in root.rglob("*"):
        if f.is_file() and (f.name in CONFIG_NAMES or f.suffix in WEIGHT_SUFFIXES):
            found.append(f)
    return found


def _hash_file(path: Path, digest: Any) -> None:
    size = path.stat().st_size
    digest.update(str(size).encode())
    with path.open("rb") as f:
        if size <= WHOLE_FILE_BYTES:
            for block in iter(lambda: f.read(2**20), b""):
                digest.update(block)
            return
        # safetensors and GGUF keep their header (names, shapes, dtypes) at the start.
        digest.update(f.read(CHUNK_BYTES * 16))
        step = size // FILE_CHUNKS
        for i in range(FILE_CHUNKS):
            f.seek(i * step)
            digest.update(f.read(CHUNK_BYTES))


def _named_tensors(model: Any) -> list[tuple[str, Any]]:
    seen: set[int] = set()
    tensors = []
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if id(t) in seen:  # tied weights count once
            continue
        seen.add(id(t))
        tensors.append((name, t))
    return sorted(tensors, key=lambda item: item[0])
