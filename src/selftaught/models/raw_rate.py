"""The machine's raw decode rate: what the hardware gives a model, engine aside.

A static batch of prompts through `model.generate`, greedy, every sequence forced to the same
length (`min_new_tokens = max_new_tokens`): no padding waste, no refills, no early ends. Its
tokens per second are the yardstick `benchmarks/bench_generation.py` measures the engine
against, and what `selftaught doctor` scales the README's measured times by. One function,
used by both.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RawRate:
    """One raw-decode measurement."""

    tokens: int
    seconds: float
    batch: int
    threads: int | None = None

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "batch": self.batch,
            "threads": self.threads,
            "tok_per_s": round(self.tok_per_s, 2),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RawRate:
        return cls(int(d["tokens"]), float(d["seconds"]), int(d["batch"]), d.get("threads"))


def static_generate(
    model: Any, tokenizer: Any, eos_ids: Sequence[int], texts: Sequence[str], **kwargs: Any
) -> list[list[int]]:
    """`model.generate` on `texts` (chat-template text, left-padded), greedy: the new token
    ids of each row."""
    import torch

    tokenizer.padding_side = "left"
    enc = tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
    enc = {k: v.to(model.device) for k, v in enc.items()}
    with torch.inference_mode():
        out = model.generate(
            **enc,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id or min(eos_ids),
            eos_token_id=sorted(eos_ids),
            **kwargs,
        )
    rows: list[list[int]] = out[:, enc["input_ids"].shape[1] :].tolist()
    return rows


def raw_decode(
    model: Any,
    tokenizer: Any,
    eos_ids: Sequence[int],
    texts: Sequence[str],
    *,
    batch: int,
    tokens: int,
    batches: int = 1,
) -> RawRate:
    """Time `batches` chunks of `batch` prompts, each row forced to `tokens` new tokens.
    Chunks short of `batch` prompts are skipped (unless there is no full one)."""
    chunks = [list(texts[s : s + batch]) for s in range(0, len(texts), batch)]
    chunks = [ch for ch in chunks if len(ch) == batch] or chunks[:1]
    chunks = chunks[:batches]
    _sync(model)
    t0 = time.perf_counter()
    for chunk in chunks:
        static_generate(
            model, tokenizer, eos_ids, chunk, max_new_tokens=tokens, min_new_tokens=tokens
        )
    _sync(model)
    seconds = time.perf_counter() - t0
    return RawRate(sum(len(ch) for ch in chunks) * tokens, seconds, batch, _torch_threads())


def _sync(model: Any) -> None:
    import torch

    if model.device.type == "cuda":
        torch.cuda.synchronize()


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())
