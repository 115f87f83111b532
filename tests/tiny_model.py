"""A random 1-layer causal LM with the embedded model's tokenizer, saved as a folder: seconds
to train, never right (needs the [local] extra)."""

from __future__ import annotations

from pathlib import Path


def save_tiny_model(folder: Path) -> Path:
    from selftaught.weights.config import BackendConfig
    from selftaught.weights.scratch import build_scratch_model, scratch_tokenizer

    tok = scratch_tokenizer()
    model = build_scratch_model(
        tok, BackendConfig(scratch_layers=1, scratch_width=32, scratch_heads=2), seed=0
    )
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
