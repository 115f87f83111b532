"""A small transformer trained from random init, for game strategies: Llama-style blocks of
the chosen depth and width over the embedded model's tokenizer (its vocabulary and chat
template ship with the package's default model, so nothing is fetched)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selftaught.weights.config import BackendConfig


def scratch_tokenizer(tokenizer_dir: str | Path | None = None) -> Any:
    """The embedded model's tokenizer (or the one in `tokenizer_dir`)."""
    from transformers import AutoTokenizer

    from selftaught.models.embedded import resolve_local_path

    tok = AutoTokenizer.from_pretrained(
        str(resolve_local_path(str(tokenizer_dir) if tokenizer_dir else None))
    )
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def build_scratch_model(
    tokenizer: Any, backend: BackendConfig, *, seed: int = 0, max_positions: int = 2048
) -> Any:
    """A freshly initialised causal LM sized by `backend.scratch_*`, seeded for repeatability."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    width = backend.scratch_width
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=4 * width,
        num_hidden_layers=backend.scratch_layers,
        num_attention_heads=backend.scratch_heads,
        num_key_value_heads=backend.scratch_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model
