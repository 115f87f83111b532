"""bf16 on the CPU, fp32 against bf16 for training and for inference apart (issue 53): the
measurements `CPU_BF16_TRAINING` and `CPU_BF16_INFERENCE` in `selftaught/models/device.py`
are set from. bf16 pays only on a CPU with AVX512-BF16 or AMX; the file records which this
one has.

- **sft**: `sft_train` steps of SmolLM2-135M with a LoRA adapter (r=16, all-linear, as
  `bench_trl_step.py`'s `sft_ours`) on tool-calculator episodes shaped like ReST's (a call, the
  tool's result, the answer; tool results masked out of the loss), fp32 against bf16 autocast
  over the same fp32 weights: the median seconds a step (the first, warm-up, step included in
  the count but not decisive), and the loss.
- **eval**: the quick-start eval's first `--items` test items (`bench_quickstart.py`'s task and
  max tokens; greedy, through the engine at its default concurrency) with the model loaded in
  float32 against bfloat16: useful decode tok/s, each item's reply and hard score.

Units (repeat, part, dtype) run interleaved, the dtype order flipped every repeat, so that
load on the machine falls on both alike. Ratios (bf16 / fp32) are paired by repeat, with a
95% t-interval over the repeats (of the log ratio); accuracy is paired per item on the first
repeat (`common.compare_paired`), and the replies identical between the dtypes are counted
per repeat. The file is written after every unit and running the same command again resumes
(more --repeats add repeats; other settings refuse). Run it on a quiet machine; estimated (not
yet timed) at 10-12 minutes on 2 cores with the defaults.

    HF_HUB_OFFLINE=1 python benchmarks/bench_dtype.py               # -> results/dtype_cpu.json
    HF_HUB_OFFLINE=1 python benchmarks/bench_dtype.py --repeats 5   # resumes, adds two
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import RESULTS, command_line, machine_info, pending_units, resumed_units

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DTYPES = ("fp32", "bf16")
TORCH_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}
PARTS = ("sft", "eval")
OUT = RESULTS / "dtype_cpu.json"
# two-sided 95% t quantiles by degrees of freedom (the normal's past the table)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}  # fmt: skip


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--sft-steps", type=int, default=3, help="optimizer steps per sft unit")
    p.add_argument("--batch", type=int, default=4, help="episodes per sft step")
    p.add_argument("--items", type=int, default=40, help="quick-start test items per eval unit")
    p.add_argument("--threads", type=int, default=None, help="fix torch threads (default: auto)")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    if min(a.repeats, a.sft_steps, a.batch, a.items) < 1:
        p.error("--repeats, --sft-steps, --batch and --items must be >= 1")
    return a


def settings_of(a: argparse.Namespace) -> dict[str, Any]:
    """What must match for a resumed run to add to an earlier one."""
    from bench_quickstart import MAX_TOKENS, TASK

    return {
        "parts": list(a.parts),
        "sft_steps": a.sft_steps,
        "batch": a.batch,
        "items": a.items,
        "task": TASK,
        "max_tokens": MAX_TOKENS,
        "threads": a.threads,
    }


def plan(repeats: int, parts: Sequence[str]) -> list[tuple[int, str, str]]:
    """(repeat, part, dtype) in the order they run: the dtype order flips every repeat."""
    order = []
    for repeat in range(repeats):
        dtypes = DTYPES if repeat % 2 == 0 else DTYPES[::-1]
        order += [(repeat, part, dtype) for part in parts for dtype in dtypes]
    return order


def pending(
    order: Sequence[tuple[int, str, str]], runs: Sequence[dict[str, Any]]
) -> list[tuple[int, str, str]]:
    """What is left of `order` after the units already recorded (a resumed benchmark)."""
    return pending_units(order, runs, ("repeat", "part", "dtype"))


# ---- the units ----------------------------------------------------------------------------


def episode_samples(n: int) -> list[Any]:
    """`n` tool-calculator episodes shaped as ReST samples them: the question, a calculator
    call, its result, the answer (the same every run: a seeded task)."""
    from selftaught.policy import Policy
    from selftaught.tasks.tools.calculator import CalculatorTask, calculate
    from selftaught.weights.sampling import Sample, episode_target

    task = CalculatorTask(train_size=n, val_size=0, test_size=0)
    policy, samples = Policy(), []
    for i, ex in enumerate(task.examples("train")):
        question = str(ex.input)
        if question.startswith("What is "):
            expression = question.removeprefix("What is ").rstrip("?")
        else:  # "... holds A crates of B items each ..."
            expression = " * ".join(w for w in question.split() if w.isdigit())
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "calculator",
                             "arguments": json.dumps({"expression": expression})}}  # fmt: skip
        result = calculate(expression)
        trajectory = [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": result},
            {"role": "assistant", "content": f"The calculator gives {result}.\nAnswer: {result}"},
        ]
        messages = policy.messages(task, ex)
        samples.append(
            Sample(
                ex.id,
                messages,
                messages,
                trajectory[-1]["content"],
                episode_target(trajectory),
                1.0,
                1.0,
                trajectory=trajectory,
                tools=task.environment(ex).schemas() or None,
            )  # fmt: skip
        )
    return samples


def sft_unit(dtype: str, steps: int, batch: int) -> dict[str, Any]:
    """`steps` LoRA steps on `batch` episodes each, fp32 or bf16 autocast: step seconds,
    loss, what the report says it trained in."""
    from selftaught.models.embedded import embedded_model_dir
    from selftaught.weights import sft as sft_mod
    from selftaught.weights.config import BackendConfig, SFTTrainConfig

    model, tok = sft_mod.load_causal_lm(embedded_model_dir(), device="cpu")
    trainable = sft_mod.prepare_trainable(model, BackendConfig())
    cfg = SFTTrainConfig(epochs=1, batch_size=batch, bf16=dtype == "bf16", max_steps=steps)
    stats = sft_mod.sft_train(
        trainable, tok, episode_samples(steps * batch), cfg, backend="lora", progress=False
    )
    return {
        "step_seconds_median": stats["step_seconds_median"],
        "step_seconds": stats["step_seconds"],
        "steps": stats["steps"],
        "loss_first": stats["loss_first"],
        "loss_last": stats["loss_last"],
        "autocast": stats.get("autocast"),
        "weights_dtype": stats.get("dtype"),
    }


def eval_unit(dtype: str, items: int) -> dict[str, Any]:
    """The quick-start items answered greedily by the model loaded in `dtype`: useful tok/s,
    each item's reply hash and hard score."""
    from bench_quickstart import MAX_TOKENS, TASK, TEST_SIZE

    from selftaught.models.base import GenerationParams
    from selftaught.models.local import LocalModel
    from selftaught.policy import Policy
    from selftaught.rollout import RolloutConfig, run_rollouts
    from selftaught.tasks.registry import load_task

    task = load_task(TASK, test_size=TEST_SIZE)
    examples = task.examples("test")[:items]
    local = LocalModel(None, dtype=TORCH_DTYPE[dtype])
    _ = local.model  # load outside the timing
    cfg = RolloutConfig(params=GenerationParams(max_tokens=MAX_TOKENS), progress=False)
    t0 = time.perf_counter()
    rollouts = run_rollouts(local, Policy(), task, examples, cfg)
    seconds = time.perf_counter() - t0
    loaded = str(local.model.dtype).removeprefix("torch.")
    local.close()
    tokens = sum(r.completion_tokens for r in rollouts)
    return {
        "model_dtype": loaded,
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "tok_per_s": round(tokens / seconds, 2),
        "replies": {
            r.example_id: hashlib.sha256(r.reply.encode()).hexdigest()[:12] for r in rollouts
        },  # fmt: skip
        "hard": {r.example_id: (r.score.hard if r.ok and r.score else None) for r in rollouts},
    }


def run_unit(part: str, dtype: str, a: argparse.Namespace) -> dict[str, Any]:
    load_before, t0 = os.getloadavg(), time.perf_counter()
    body = sft_unit(dtype, a.sft_steps, a.batch) if part == "sft" else eval_unit(dtype, a.items)
    return {
        "part": part,
        "dtype": dtype,
        **body,
        "unit_seconds": round(time.perf_counter() - t0, 1),
        "load_average": {
            "start": [round(x, 2) for x in load_before],
            "end": [round(x, 2) for x in os.getloadavg()],
        },  # fmt: skip
    }


# ---- the summary --------------------------------------------------------------------------


def ratio_ci(ratios: Sequence[float]) -> dict[str, Any]:
    """The geometric mean of paired ratios and its 95% t-interval (on the log scale)."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = sum(logs) / n
    out: dict[str, Any] = {
        "ratios": [round(r, 3) for r in ratios],
        "ratio": round(math.exp(mean), 3),
    }
    if n >= 2:
        sd = statistics.stdev(logs)
        df = n - 1
        t = T95.get(df) or next((T95[k] for k in sorted(T95) if k >= df), 1.96)
        half = t * sd / math.sqrt(n)
        out["ci95"] = [round(math.exp(mean - half), 3), round(math.exp(mean + half), 3)]
    return out


def _paired(
    runs: Sequence[dict[str, Any]], part: str
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(fp32 unit, bf16 unit) of each repeat that has both, by repeat."""
    by = {(r["repeat"], r["dtype"]): r for r in runs if r["part"] == part}
    repeats = sorted({r for r, _ in by})
    return [
        (by[(r, "fp32")], by[(r, "bf16")])
        for r in repeats
        if (r, "fp32") in by and (r, "bf16") in by
    ]


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """SFT: step time ratio bf16 / fp32 with its CI and the losses. Eval: decode tok/s
    ratio with its CI, replies identical per repeat, accuracy of each dtype (first repeat)
    and their paired comparison."""
    from common import accuracy, compare_paired

    out: dict[str, Any] = {}
    sft = _paired(runs, "sft")
    if sft:
        out["sft"] = {
            "step_seconds": {
                d: [u[i]["step_seconds_median"] for u in sft] for i, d in enumerate(DTYPES)
            },  # fmt: skip
            "step_time_bf16_vs_fp32": ratio_ci(
                [b["step_seconds_median"] / f["step_seconds_median"] for f, b in sft]
            ),
            "loss_last": {d: [u[i]["loss_last"] for u in sft] for i, d in enumerate(DTYPES)},
        }
    ev = _paired(runs, "eval")
    if ev:
        first_f, first_b = ev[0]
        n = len(first_f["replies"])
        out["eval"] = {
            "tok_per_s": {d: [u[i]["tok_per_s"] for u in ev] for i, d in enumerate(DTYPES)},
            "tok_per_s_bf16_vs_fp32": ratio_ci([b["tok_per_s"] / f["tok_per_s"] for f, b in ev]),
            "identical_replies": [
                sum(f["replies"][k] == b["replies"].get(k) for k in f["replies"]) for f, b in ev
            ],
            "items": n,
            "accuracy": {"fp32": accuracy(first_f["hard"]), "bf16": accuracy(first_b["hard"])},
            "paired_bf16_vs_fp32": compare_paired(first_f["hard"], first_b["hard"]),
        }
    return out


def readme_body(results: Path = RESULTS) -> str:
    """The benchmarks README's table for this benchmark (a note until it has run)."""
    from common import fmt_acc, markdown_table

    path = results / OUT.name
    if not path.exists():
        return (
            "Not measured yet: run `HF_HUB_OFFLINE=1 python benchmarks/bench_dtype.py` on a "
            "quiet machine whose CPU has AVX512-BF16 or AMX."
        )
    saved = json.loads(path.read_text(encoding="utf-8"))
    s, cpu = saved["summary"], saved["machine"].get("cpu_bf16", {})
    has = [k for k in ("avx512_bf16", "amx") if cpu.get(k)]
    lines = [f"CPU bf16 instructions: {', '.join(has) or 'none'}; settings {saved['settings']}."]
    rows = []
    if "sft" in s:
        r = s["sft"]["step_time_bf16_vs_fp32"]
        steps = s["sft"]["step_seconds"]
        rows.append(["SFT step (s, median per unit)", _list(steps["fp32"]), _list(steps["bf16"]),
                     _ratio(r), ""])  # fmt: skip
    if "eval" in s:
        e = s["eval"]
        same = f"identical replies {_list(e['identical_replies'])} of {e['items']}"
        rows.append(["eval decode (useful tok/s)", _list(e["tok_per_s"]["fp32"]),
                     _list(e["tok_per_s"]["bf16"]), _ratio(e["tok_per_s_bf16_vs_fp32"]),
                     same])  # fmt: skip
        p = e["paired_bf16_vs_fp32"]
        rows.append(["eval accuracy (first repeat)", fmt_acc(e["accuracy"]["fp32"]),
                     fmt_acc(e["accuracy"]["bf16"]), f"{p['delta']:+.3f}",
                     f"W/L {p['wins']}/{p['losses']}, p = {p['p_two_sided']:.3f}"])  # fmt: skip
    header = ["measure", "fp32", "bf16", "bf16 / fp32 [95% CI]", "also"]
    return "\n".join(lines) + "\n\n" + markdown_table(header, rows)


def _list(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.3g}" for v in values)


def _ratio(r: dict[str, Any]) -> str:
    ci = r.get("ci95")
    return f"{r['ratio']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


# ---- main ---------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    import torch

    from selftaught.models.device import cpu_bf16_support

    cpu = cpu_bf16_support()
    return {
        **machine_info(),
        "cpu_bf16": {"avx512_bf16": cpu.avx512_bf16, "amx": cpu.amx},
        "torch_threads": torch.get_num_threads(),
    }


def main(argv: Sequence[str] | None = None) -> None:
    a = parse_args(argv)
    from selftaught.runs import atomic_write_json

    if a.threads:
        from selftaught.models.threads import fix_threads

        fix_threads(a.threads)
    settings = settings_of(a)
    runs = resumed_units(a.out, settings)
    for repeat, part, dtype in pending(plan(a.repeats, a.parts), runs):
        run = {"repeat": repeat, **run_unit(part, dtype, a)}
        runs.append(run)
        result = {
            "command": command_line(),
            "machine": machine(),
            "settings": settings,
            "summary": summarize(runs),
            "runs": runs,
        }
        atomic_write_json(a.out, result)  # after every unit: an interruption loses one
        what = (f"{run['step_seconds_median']} s/step" if part == "sft"
                else f"{run['tok_per_s']} tok/s")  # fmt: skip
        print(f"repeat {repeat} {part} {dtype}: {what} ({run['unit_seconds']} s)", flush=True)
    print(json.dumps(summarize(runs), indent=1))
    if a.out.resolve().parent == RESULTS.resolve():
        from common import write_tables

        write_tables()  # the benchmarks README's bf16 table comes from this file


if __name__ == "__main__":
    main()
