"""ReST-EM on the embedded SmolLM2-135M, on CPU: base vs shipped test accuracy, per-round
val (and test), sampling throughput and SFT step time.

    HF_HUB_OFFLINE=1 python benchmarks/bench_rest.py [--task SPEC] [--rounds 3] [--threads 1]

Writes benchmarks/results/rest_<task>.json and prints a Markdown table. The gate uses val
only; test per round is recorded for the report (`eval_test_each_round`)."""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path
from typing import Any

from common import RESULTS

from selftaught.runs import atomic_write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="gym:basic_arithmetic?max_terms=2&max_digits=1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-size", type=int, default=96)
    ap.add_argument("--val-size", type=int, default=50)
    ap.add_argument("--test-size", type=int, default=200)
    ap.add_argument("-k", "--samples-per-prompt", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", type=Path, default=None)
    return ap.parse_args()


def round_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per ReST round: val / test with intervals, sampling and SFT speed."""
    rows = []
    for h in history:
        val, test, train = h.get("val", {}), h.get("test", {}), h.get("train", {})
        rows.append(
            {
                "round": h["round"],
                "val": val.get("hard"),
                "val_ci": val.get("hard_ci"),
                "val_truncated": val.get("truncated"),
                "test": test.get("hard"),
                "test_ci": test.get("hard_ci"),
                "test_truncated": test.get("truncated"),
                "sample_solved": h.get("sample_solved"),
                "samples_per_s": h.get("samples_per_s"),
                "elite": h.get("elite", {}).get("kept"),
                "sft_steps": train.get("steps"),
                "sft_step_s": train.get("step_seconds"),
                "round_s": h.get("seconds"),
            }
        )
    return rows


def print_rounds(rows: list[dict[str, Any]]) -> None:
    print("| round | val | test (95% CI) | sampled solved | samples/s | elite | SFT step s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ci = r["test_ci"] or [0, 0]
        test = f"{r['test']:.3f} ({ci[0]:.3f}-{ci[1]:.3f})" if r["test"] is not None else "-"
        val = f"{r['val']:.3f}" if r["val"] is not None else "-"
        print(
            f"| {r['round']} | {val} | {test} | {r['sample_solved'] or '-'} | "
            f"{r['samples_per_s'] or '-'} | {r['elite'] or '-'} | {r['sft_step_s'] or '-'} |"
        )


def main() -> None:
    args = parse_args()

    import selftaught
    from selftaught.models.threads import fix_threads
    from selftaught.weights.config import RestConfig, SFTTrainConfig

    fix_threads(args.threads)  # the local model keeps to it
    sizes = {"train_size": args.train_size, "val_size": args.val_size, "test_size": args.test_size}
    name = re.sub(r"[^A-Za-z0-9]+", "_", args.task).strip("_")
    run_dir = args.output or Path("runs") / f"bench-rest-{name}-s{args.seed}"
    cfg = RestConfig(
        rounds=args.rounds,
        samples_per_prompt=args.samples_per_prompt,
        max_tokens=args.max_tokens,
        eval_test_each_round=True,
        seed=args.seed,
        sft=SFTTrainConfig(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr),
    )
    t0 = time.perf_counter()
    result = selftaught.train(
        args.task,
        "local",
        method="rest",
        config=cfg,
        output_dir=run_dir,
        task_options={"seed": args.seed, **sizes},
        progress=False,
    )
    wall = time.perf_counter() - t0
    rows = round_rows([r.to_dict() for r in result.rounds])
    report = {
        "task": args.task,
        "sizes": {"train": args.train_size, "val": args.val_size, "test": args.test_size},
        "config": cfg.to_dict(),
        "threads": args.threads,
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(time.process_time(), 1),  # all threads of this process
        "result": result.to_dict(),
        "rounds": rows,
    }
    out = RESULTS / f"rest_{name}.json"
    atomic_write_json(out, report)
    print_rounds(rows)
    b, s = result.base_test, result.shipped_test
    print(f"\nbase {b.line()}\nshipped (round {result.best_round}) {s.line()}")
    print(f"gain {result.gain:+.3f}; wall {wall / 60:.1f} min; written {out}")


if __name__ == "__main__":
    main()
