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
benchmarks/README.md (`--no-readme` for a smoke run).

Memory and the machine: the report has ru_maxrss (`max_rss_gb`), the resident memory sampled
every --rss-every seconds (`memory`: its peak and trace), and this machine's raw decode rate
measured just before in a process of its own (`raw_decode`; --no-raw-rate skips it), so a
time is read beside the rate it ran at. --kv pool|dynamic sets `SELFTAUGHT_KV` (where the
engine keeps keys and values) for the run.

--kv-arms pool dynamic: the KV layouts against each other (issue 67), each run a process of
its own with a fresh run directory (`--output`/ARM-N) and report (`--result`'s folder), the
order alternated per repeat (pool, dynamic, dynamic, pool, ...); the summary
(`tool_rest_kv.json` beside --result) gives each arm's wall time, memory, accuracy and raw
rate, and their ratios per repeat. An interrupted comparison resumes (finished units are
read back, an unfinished run directory resumes its run).

    HF_HUB_OFFLINE=1 python benchmarks/bench_tool_rest.py --kv-arms pool dynamic --repeats 1"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    RESULTS,
    RssTrace,
    accuracy,
    command_line,
    compare_paired,
    fmt_acc,
    machine_info,
    markdown_table,
    write_tables,
)

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
    ap.add_argument("--kv", choices=["pool", "dynamic"], default=None, help="SELFTAUGHT_KV")
    ap.add_argument("--rss-every", type=float, default=1.0, help="seconds between RSS samples")
    ap.add_argument("--no-raw-rate", action="store_true", help="skip the raw decode rate")
    ap.add_argument(
        "--kv-arms",
        nargs="+",
        choices=["pool", "dynamic"],
        default=None,
        help="compare KV layouts: one run per arm and repeat, each in its own process",
    )
    ap.add_argument("--repeats", type=int, default=1, help="for --kv-arms")
    return ap.parse_args()


def raw_rate() -> dict[str, Any]:
    """This machine's raw decode rate (`selftaught doctor`'s measurement), taken in a
    process of its own so that its memory is not the run's."""
    code = (
        "import json; from selftaught.doctor import measure_raw_rate; "
        "print(json.dumps(measure_raw_rate().to_dict()))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    rate: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return rate


# ---------------------------------------------------------------------- --kv-arms

RUN_FLAGS = (  # passed on to each arm's run
    "rounds",
    "train_size",
    "val_size",
    "test_size",
    "samples_per_prompt",
    "max_tokens",
    "epochs",
    "batch_size",
    "threads",
    "seed",
    "teacher_skill",
    "rss_every",
)


def kv_plan(arms: list[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, arm) in the order they run: the arms' order reversed every other repeat."""
    return [(r, arm) for r in range(repeats) for arm in (arms if r % 2 == 0 else arms[::-1])]


def kv_unit_paths(args: argparse.Namespace, repeat: int, arm: str) -> tuple[Path, Path]:
    """The run directory and report of one arm's run."""
    name = f"{arm}-{repeat}"
    return args.output.parent / f"{args.output.name}-kv" / name, args.result.parent / (
        f"tool_rest_kv_{name}.json"
    )


def run_kv_arms(args: argparse.Namespace) -> None:
    units = []
    for repeat, arm in kv_plan(list(args.kv_arms), args.repeats):
        output, result = kv_unit_paths(args, repeat, arm)
        if not result.exists():
            cmd = [sys.executable, str(Path(__file__).resolve()), "--kv", arm, "--no-readme"]
            cmd += ["--output", str(output), "--result", str(result)]
            for flag in RUN_FLAGS:
                value = getattr(args, flag)
                if value is not None:
                    cmd += [f"--{flag.replace('_', '-')}", str(value)]
            subprocess.run(cmd, check=True)
        units.append({"repeat": repeat, "arm": arm, "report": str(result)})
    summary = summarize_kv(units)
    out = args.result.parent / "tool_rest_kv.json"
    from selftaught.runs import atomic_write_json

    atomic_write_json(out, {"command": command_line(), "machine": machine_info(), **summary})
    for arm, e in summary["arms"].items():
        print(
            f"{arm}: {e['wall_seconds']:.0f} s, max RSS {e['max_rss_gb']:.2f} GB, test "
            f"{e['shipped_hard']:.2f}, raw {e['raw_tok_per_s']} tok/s"
        )
    print(f"wrote {out}")


def summarize_kv(units: list[dict[str, Any]]) -> dict[str, Any]:
    """Per unit the report's figures; per arm their medians; per repeat pool / dynamic."""
    from selftaught.runs import read_json

    rows = []
    for u in units:
        report = read_json(Path(u["report"]))
        raw = report.get("raw_decode") or {}
        rows.append(
            {
                **u,
                "wall_seconds": report["wall_seconds"],
                "max_rss_gb": report["max_rss_gb"],
                "peak_rss_gb": (report.get("memory") or {}).get("peak_rss_gb"),
                "shipped_hard": report["shipped"]["hard"],
                "raw_tok_per_s": raw.get("tok_per_s"),
            }
        )
    arms: dict[str, Any] = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        arms[arm] = {
            k: statistics.median(r[k] for r in mine if r[k] is not None)
            if any(r[k] is not None for r in mine)
            else None
            for k in ("wall_seconds", "max_rss_gb", "peak_rss_gb", "shipped_hard", "raw_tok_per_s")
        }
    by = {(r["repeat"], r["arm"]): r for r in rows}
    ratios = [
        {
            "repeat": rep,
            "wall": round(
                by[(rep, "pool")]["wall_seconds"] / by[(rep, "dynamic")]["wall_seconds"], 3
            ),
            "max_rss": round(
                by[(rep, "pool")]["max_rss_gb"] / by[(rep, "dynamic")]["max_rss_gb"], 3
            ),
        }
        for rep in sorted({r["repeat"] for r in rows})
        if (rep, "pool") in by and (rep, "dynamic") in by
    ]
    return {"units": rows, "arms": arms, "pool_vs_dynamic": ratios}


def main() -> None:
    args = parse_args()
    if args.kv_arms:
        run_kv_arms(args)
        return
    if args.kv:
        os.environ["SELFTAUGHT_KV"] = args.kv  # read when the engine starts
    raw = None if args.no_raw_rate else raw_rate()
    import torch

    import selftaught
    from selftaught.models.device import precision
    from selftaught.models.kv_pool import kv_layout
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
    with RssTrace(args.rss_every) as trace:
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
        "kv": kv_layout(),  # where the engine kept keys and values (SELFTAUGHT_KV)
        "raw_decode": raw,  # this machine's raw decode rate, just before (its own process)
        "wall_seconds": round(wall, 1),  # of this invocation (a resumed run adds up)
        "max_rss_gb": round(trace.summary()["max_rss_gb"], 2),
        "memory": trace.summary(),  # RSS sampled every --rss-every s: peak and trace
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
