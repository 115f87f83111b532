"""Throughput of the local model: 8 prompts answered one after another vs sent concurrently
(batched by LocalModel into shared `generate` calls).

    python benchmarks/bench_local_batching.py [--model PATH] [--max-tokens 64] [--prompts 8]

Prints tok/s for both and their ratio; writes benchmarks/results/local_batching.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from selftaught.models.base import GenerationParams  # noqa: E402
from selftaught.models.local import LocalModel  # noqa: E402

PROMPTS = [
    "Tell me a short story about a dragon.",
    "Explain why the sky is blue.",
    "Write a poem about the sea.",
    "What are three uses of a paperclip?",
    "Describe your favourite meal.",
    "How does a bicycle work?",
    "Give advice to a new programmer.",
    "Why do cats purr?",
    "Describe a walk in the forest.",
    "What makes a good friend?",
    "Explain rain to a child.",
    "List some fun weekend activities.",
]

RESULTS = Path(__file__).parent / "results" / "local_batching.json"


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(data, f, indent=2)
        tmp = f.name
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder or .gguf (default: embedded)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not 1 <= args.prompts <= len(PROMPTS):
        parser.error(f"--prompts must be between 1 and {len(PROMPTS)}")

    import torch

    model = LocalModel(args.model, max_batch_size=args.prompts)
    t0 = time.perf_counter()
    _ = model.model
    load_s = time.perf_counter() - t0
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS[: args.prompts]]
    # Greedy, and no early stop: every reply runs to max_tokens unless the model ends it.
    params = GenerationParams(max_tokens=args.max_tokens, temperature=0.0)
    model.chat(conversations[0], GenerationParams(max_tokens=4))  # warm-up

    calls = model.generate_calls
    t0 = time.perf_counter()
    sequential = [model.chat(c, params) for c in conversations]
    sequential_s = time.perf_counter() - t0
    sequential_calls = model.generate_calls - calls

    async def concurrently():
        return await asyncio.gather(*(model.achat(c, params) for c in conversations))

    calls = model.generate_calls
    t0 = time.perf_counter()
    batched = asyncio.run(concurrently())
    batched_s = time.perf_counter() - t0
    batched_calls = model.generate_calls - calls
    model.close()

    sequential_tokens = sum(c.completion_tokens for c in sequential)
    batched_tokens = sum(c.completion_tokens for c in batched)
    result = {
        "model": model.name,
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "load_s": round(load_s, 2),
        "sequential": {
            "seconds": round(sequential_s, 2),
            "completion_tokens": sequential_tokens,
            "tok_per_s": round(sequential_tokens / sequential_s, 2),
            "generate_calls": sequential_calls,
        },
        "batched": {
            "seconds": round(batched_s, 2),
            "completion_tokens": batched_tokens,
            "tok_per_s": round(batched_tokens / batched_s, 2),
            "generate_calls": batched_calls,
        },
        "speedup": round((batched_tokens / batched_s) / (sequential_tokens / sequential_s), 2),
        "same_texts": [c.text for c in sequential] == [c.text for c in batched],
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
    }
    write_json_atomic(args.out, result)
    print(
        f"{model.name}: {args.prompts} prompts x {args.max_tokens} tokens\n"
        f"  sequential: {result['sequential']['tok_per_s']:.1f} tok/s "
        f"({sequential_s:.1f} s, {sequential_calls} generate calls)\n"
        f"  batched:    {result['batched']['tok_per_s']:.1f} tok/s "
        f"({batched_s:.1f} s, {batched_calls} generate calls)\n"
        f"  speedup:    {result['speedup']:.2f}x   same texts: {result['same_texts']}\n"
        f"  wrote {args.out}"
    )


if __name__ == "__main__":
    main()
