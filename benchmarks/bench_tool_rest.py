"""Does the embedded model learn to use the calculator tool? `selftaught train --method rest`
on `tool:calculator` with SmolLM2-135M on CPU: test accuracy of the base and the shipped
model with 95% intervals and the paired sign test, and per round the share of episodes that
call the tool (sampled, val, test).

    HF_HUB_OFFLINE=1 python benchmarks/bench_tool_rest.py [--rounds 3] [--threads N]

The base model never calls the tool unprompted (measured: 0 of 8 greedy test episodes), so
sampling uses a teacher skill (`tool_calculator_teacher.md`: one rule and two worked examples
of the call format, as chat turns); the model is trained and evaluated without it (skill
distillation, `--teacher-skill`). Resumable: the same command continues the run directory.
Writes benchmarks/results/tool_rest.json and the `bench_tool_rest` section of
benchmarks/README.md (`--no-readme` for a smoke run)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    RESULTS,
    accuracy,
    command_line,
    compare_paired,
    fmt_acc,
    machine_info,
    markdown_table,
)
from tables import write_tables  # noqa: E402

TEACHER = Path(__file__).resolve().parent / "tool_calculator_teacher.md"


def _share(summary: Any, key: str = "call_share") -> float | None:
    use = summary.get("tool_use") if isinstance(summary, dict) else None
    return use.get(key) if isinstance(use, dict) else None


def round_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for h in history:
        val, test = h.get("val") or {}, h.get("test") or {}
        rows.append(
            {
                "round": h["round"],
                "val": val.get("hard"),
                "test": test.get("hard"),
                "test_ci": test.get("hard_ci"),
                "sample_solved": h.get("sample_solved"),
                "sample_call_share": _share({"tool_use": h.get("sample_tool_use")}),
                "val_call_share": _share(val),
                "test_call_share": _share(test),
                "test_ran_share": _share(test, "ran_share"),
                "elite": (h.get("elite") or {}).get("kept"),
                "gate": (h.get("gate") or {}).get("decision"),
                "round_s": h.get("seconds"),
                "sample_s": h.get("sample_seconds"),
                "train_s": (h.get("train") or {}).get("train_seconds"),
                "sft_step_s": (h.get("train") or {}).get("step_seconds"),
            }
        )
    return rows


def _seconds(r: dict[str, Any]) -> str:
    if r["round_s"] is None:
        return "–"
    if r.get("sample_s") is None:  # a report written before the phases were timed
        return f"{r['round_s']:.0f}"
    return f"{r['round_s']:.0f} ({r['sample_s']:.0f} / {r['train_s'] or 0:.0f})"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def readme_body(report: dict[str, Any]) -> str:
    from selftaught.stats import min_detectable_difference, sign_test_two_sided

    rows = [
        [
            r["round"],
            "–" if r["val"] is None else f"{r['val']:.3f}",
            "–" if r["test"] is None else f"{r['test']:.3f}",
            _pct(r["sample_solved"]),
            _pct(r["sample_call_share"]),
            _pct(r["test_call_share"]),
            r["gate"] or "",
            _seconds(r),
        ]
        for r in report["rounds"]
    ]
    head = [
        "round",
        "val",
        "test",
        "sampled solved",
        "sampled calling",
        "test calling",
        "gate",
        "s (sampling / SFT)",
    ]
    p = report["paired"]
    m = report["machine"]
    rss = report.get("max_rss_gb")  # absent from reports written before RSS was recorded
    return "\n".join(
        [
            f"`{report['command']}` — {m['date']}, {m['cpu_count']} cores, "
            f"{report['threads']} torch threads, load {m['loadavg']}, "
            f"{report['wall_seconds'] / 60:.1f} min wall"
            + (f", peak RSS {rss} GB." if rss is not None else "."),
            "",
            markdown_table(head, rows),
            "",
            f"Test: base {fmt_acc(report['base'])} → shipped (round {report['best_round']}) "
            f"{fmt_acc(report['shipped'])}; {p['wins']} wins / {p['losses']} losses, two-sided "
            f"exact sign test p = {sign_test_two_sided(p['wins'], p['losses']):.3g}, gain "
            f"beyond the intervals: {'yes' if p['gain_beyond_ci'] else 'no'}. The smallest "
            f"difference {report['sizes']['test']} test items can show (α 0.05, two-sided): "
            f"{min_detectable_difference(report['sizes']['test']) or 0:.3f}.",
        ]
    )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-size", type=int, default=64)
    ap.add_argument("--val-size", type=int, default=40)
    ap.add_argument("--test-size", type=int, default=100)
    ap.add_argument("-k", "--samples-per-prompt", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's, one per core; 1 on a machine others share)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--teacher-skill", type=Path, default=TEACHER)
    ap.add_argument("--output", type=Path, default=Path("runs/bench-tool-rest"))
    ap.add_argument("--result", type=Path, default=RESULTS / "tool_rest.json")
    ap.add_argument("--no-readme", action="store_true", help="leave benchmarks/README.md alone")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    import torch

    import selftaught
    from selftaught.models.device import precision
    from selftaught.runs import atomic_write_json, read_json
    from selftaught.weights.config import RestConfig, SFTTrainConfig

    if args.threads:
        from selftaught.models.threads import fix_threads

        fix_threads(args.threads)  # the local model keeps to it
    cfg = RestConfig(
        rounds=args.rounds,
        samples_per_prompt=args.samples_per_prompt,
        max_tokens=args.max_tokens,
        eval_test_each_round=True,
        teacher_skill=args.teacher_skill.read_text(encoding="utf-8"),
        seed=args.seed,
        sft=SFTTrainConfig(epochs=args.epochs, batch_size=args.batch_size, max_length=1024),
    )
    t0 = time.perf_counter()
    result = selftaught.train(
        "tool:calculator",
        "local",
        method="rest",
        config=cfg,
        output_dir=args.output,
        task_options={
            "seed": args.seed,
            "train_size": args.train_size,
            "val_size": args.val_size,
            "test_size": args.test_size,
        },
        progress=False,
    )
    wall = time.perf_counter() - t0
    scores = read_json(args.output / "state.json").get("test_scores", {})
    base = scores.get("0", {})
    shipped = scores.get(str(result.best_round), base)
    report = {
        "command": command_line(),
        "machine": machine_info(),
        "task": "tool:calculator",
        "sizes": {"train": args.train_size, "val": args.val_size, "test": args.test_size},
        "config": cfg.to_dict() | {"teacher_skill": str(args.teacher_skill)},
        "threads": torch.get_num_threads(),
        "precision": precision().to_dict(),  # the dtype rounds are served in, SFT's autocast
        "wall_seconds": round(wall, 1),  # of this invocation (a resumed run adds up)
        "max_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "best_round": result.best_round,
        "base": accuracy(base),
        "shipped": accuracy(shipped),
        "paired": compare_paired(base, shipped),
        "result": result.to_dict(),
        "rounds": round_rows([r.to_dict() for r in result.rounds]),
    }
    atomic_write_json(args.result, report)
    body = readme_body(report)
    if not args.no_readme:
        write_tables()
    print(body)
    print(f"\nwritten {args.result}")
    print(json.dumps(report["paired"]))


if __name__ == "__main__":
    main()
