"""ReST sampling throughput: the one engine (LocalModel wrapping the model in memory →
rollout, k completions per prompt in one `achat_n` request, scored by the task) against the
path ReST used before it (`HFGenerator.generate_batch`: static batches of `model.generate`,
then scoring), on the same model, prompts and sampling settings, interleaved A/B/A/B.

The old path is taken verbatim from the commit before the engine (572ec18,
`src/selftaught/weights/sampling.py`, class HFGenerator) with `git show`, so it must run in a
git checkout of this repository.

    HF_HUB_OFFLINE=1 python benchmarks/bench_rest_sampling.py            # 32 prompts, k=4, 3 pairs
    HF_HUB_OFFLINE=1 python benchmarks/bench_rest_sampling.py --quick    # 8 prompts, 1 pair

Writes benchmarks/results/rest_sampling.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from common import RESULTS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
OLD_COMMIT = "572ec18"
ROOT = Path(__file__).resolve().parents[1]
TASK = "gym:basic_arithmetic?max_terms=2&max_digits=1"


def old_generator_class() -> Any:
    """HFGenerator as it was at OLD_COMMIT (its source executed in a fresh namespace)."""
    source = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:src/selftaught/weights/sampling.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    start = source.index("class HFGenerator:")
    end = source.index("class RandomStrategySampler:")
    namespace: dict[str, Any] = {}
    exec(  # noqa: S102 - our own code from git history, for the comparison
        "from __future__ import annotations\nimport time\nfrom typing import Any\n"
        "from collections.abc import Sequence\n"
        "from selftaught.models.base import Completion, GenerationParams, Message\n"
        + source[start:end],
        namespace,
    )
    return namespace["HFGenerator"]


def old_path(model: Any, tok: Any, task: Any, prompts: list[Any], k: int, params: Any) -> int:
    generator = old_generator_class()(model, tok, max_batch_size=32)
    examples = task.examples("train")
    samples = 0
    per_call = max(1, 32 // k)  # ReST's old chunking: 32 // k prompts a call
    for start in range(0, len(prompts), per_call):
        chunk = prompts[start : start + per_call]
        rows = generator.generate_batch(chunk, params, k=k)
        for ex, completions in zip(examples[start : start + per_call], rows, strict=True):
            for c in completions:
                task.score(c.text, ex)
                samples += 1
    return samples


def new_path(model: Any, tok: Any, task: Any, k: int, params: Any) -> int:
    from selftaught.models.local import LocalModel
    from selftaught.policy import Policy
    from selftaught.rollout import RolloutConfig, run_rollouts

    chat = LocalModel.from_pretrained_model(model, tok, max_batch_size=32)
    try:
        rollouts = run_rollouts(
            chat,
            Policy(),
            task,
            task.examples("train"),
            RolloutConfig(concurrency=32 // k, samples=k, params=params, progress=False),
        )
    finally:
        chat.close()
    return sum(r.ok for r in rollouts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.pairs = 8, 1
    from selftaught.models.base import GenerationParams
    from selftaught.models.embedded import embedded_model_dir
    from selftaught.policy import Policy
    from selftaught.runs import atomic_write_json
    from selftaught.tasks import load_task
    from selftaught.weights.sft import load_causal_lm

    task = load_task(TASK, train_size=args.prompts, val_size=4, test_size=4)
    prompts = [Policy().messages(task, ex) for ex in task.examples("train")]
    model, tok = load_causal_lm(embedded_model_dir(), device="cpu")
    params = GenerationParams(max_tokens=args.max_tokens, temperature=0.8, seed=0)
    rows = []
    for i in range(args.pairs):
        order = ("new", "old") if i % 2 == 0 else ("old", "new")
        result: dict[str, Any] = {"load": os.getloadavg()[0]}
        for name in order:
            t0 = time.perf_counter()
            if name == "new":
                n = new_path(model, tok, task, args.k, params)
            else:
                n = old_path(model, tok, task, prompts, args.k, params)
            result[f"{name}_samples_per_s"] = round(n / (time.perf_counter() - t0), 2)
        result["ratio"] = round(result["new_samples_per_s"] / result["old_samples_per_s"], 3)
        rows.append(result)
        print(json.dumps(result))
    report = {
        "benchmark": "rest_sampling",
        "task": TASK,
        "prompts": args.prompts,
        "k": args.k,
        "max_tokens": args.max_tokens,
        "pairs": rows,
        "new_vs_old_median": round(statistics.median(r["ratio"] for r in rows), 3),
    }
    name = "rest_sampling_quick.json" if args.quick else "rest_sampling.json"
    out = RESULTS / name
    atomic_write_json(out, report)
    print(f"new / old samples per second: {report['new_vs_old_median']} (median); wrote {out}")


if __name__ == "__main__":
    main()
