"""Weight-space overhead: selftaught's training step against a plain TRL script doing the same
step on the same model and data, interleaved A/B/A/B... so that machine load falls on both.

- sft: selftaught's `sft_train` (LoRA r=16 all-linear through TRL's SFTTrainer, conversational
  prompt-completion rows) vs a plain `SFTTrainer(peft_config=LoraConfig(...))` script;
- grpo: selftaught's GRPO path (`RLTrainer`: the task scorer as reward with the error rule,
  the metrics and budget callbacks, LoRA) vs a plain `GRPOTrainer` with a plain reward
  function, the same GRPOConfig numbers.

Each run trains `--steps` optimizer steps on the embedded SmolLM2-135M (fp32, CPU) in this
process; the time per step is the training wall time over the steps (setup excluded, the same
way for both). The ratio is selftaught / plain per pair; the report gives the median ratio and
its spread (min-max) over the pairs. Target: <= 1.10.

    HF_HUB_OFFLINE=1 python benchmarks/bench_trl_step.py              # sft and grpo, 5 pairs
    HF_HUB_OFFLINE=1 python benchmarks/bench_trl_step.py --quick      # 2 pairs, 2 steps

Writes benchmarks/results/trl_step.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
import warnings
from typing import Any

from common import RESULTS

from selftaught.runs import atomic_write_json

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TASK = "gym:basic_arithmetic?max_terms=2&max_digits=1"
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear"}


def sft_rows(n: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        q = f"Calculate {i % 9} + {(i * 7) % 9}.\n\nGive the final answer only."
        a = f"{i % 9} + {(i * 7) % 9} = {i % 9 + (i * 7) % 9}"
        rows.append(
            {
                "prompt": [{"role": "user", "content": q}],
                "completion": [{"role": "assistant", "content": a}],
            }
        )
    return rows


def timed_train(trainer: Any, steps: int) -> float:
    t0 = time.perf_counter()
    trainer.train()
    return (time.perf_counter() - t0) / steps


# ---- SFT ------------------------------------------------------------------------------------


def sft_plain(path: str, steps: int, batch: int, bf16: bool = False) -> float:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(
                output_dir=out,
                max_steps=steps,
                per_device_train_batch_size=batch,
                learning_rate=2e-4,
                lr_scheduler_type="cosine",
                logging_steps=1,
                save_strategy="no",
                report_to="none",
                use_cpu=True,
                # SFTConfig defaults to bf16 autocast (also on a CPU); selftaught trains in
                # fp32 unless asked (`SFTTrainConfig.bf16`): the same precision on both sides
                bf16=bf16,
                gradient_checkpointing=False,
                disable_tqdm=True,
            ),
            train_dataset=Dataset.from_list(sft_rows(steps * batch)),
            processing_class=tok,
            peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA),
        )
        return timed_train(trainer, steps)


def sft_ours(path: str, steps: int, batch: int, bf16: bool = False) -> float:
    from selftaught.weights import sft as sft_mod
    from selftaught.weights.config import BackendConfig, SFTTrainConfig
    from selftaught.weights.sampling import Sample

    model, tok = sft_mod.load_causal_lm(path, device="cpu")
    samples = []
    for i, row in enumerate(sft_rows(steps * batch)):
        answer = row["completion"][0]["content"]
        samples.append(Sample(str(i), row["prompt"], row["prompt"], answer, answer, 1.0, 1.0))
    trainable = sft_mod.prepare_trainable(model, BackendConfig())
    stats = sft_mod.sft_train(
        trainable,
        tok,
        samples,
        SFTTrainConfig(epochs=1, batch_size=batch, bf16=bf16),
        backend="lora",
        progress=False,
    )
    return stats["train_seconds"] / stats["steps"]


# ---- GRPO -----------------------------------------------------------------------------------


def grpo_config(steps: int) -> Any:
    from selftaught.weights.config import RLConfig

    return RLConfig(steps=steps, num_generations=4, prompts_per_step=2, max_completion_length=32)


def grpo_plain(path: str, steps: int, task: Any) -> float:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from selftaught.policy import Policy

    cfg = grpo_config(steps)
    examples = {ex.id: ex for ex in task.examples("train")}

    def reward(prompts: Any, completions: Any, example_id: list[str], **_: Any) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [task.score(t, examples[e]).soft for t, e in zip(texts, example_id, strict=True)]

    rows = [
        {"prompt": Policy().messages(task, ex), "example_id": ex.id} for ex in examples.values()
    ]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=GRPOConfig(
                output_dir=out,
                max_steps=steps,
                per_device_train_batch_size=cfg.prompts_per_step * cfg.num_generations,
                num_generations=cfg.num_generations,
                max_completion_length=cfg.max_completion_length,
                temperature=cfg.temperature,
                beta=cfg.beta,
                learning_rate=cfg.lr(),
                logging_steps=1,
                save_strategy="no",
                report_to="none",
                use_cpu=True,
                bf16=False,
                gradient_checkpointing=False,
                seed=cfg.seed,
                disable_tqdm=True,
            ),
            train_dataset=Dataset.from_list(rows),
            processing_class=tok,
            peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA),
        )
        return timed_train(trainer, steps)


def grpo_ours(path: str, steps: int, task: Any) -> float:
    from rich.console import Console

    from selftaught.weights.rl import RLTrainer
    from selftaught.weights.sft import load_causal_lm

    with tempfile.TemporaryDirectory() as run:
        trainer = RLTrainer(grpo_config(steps), task, output_dir=run, progress=False)
        trainer.console = Console(quiet=True)
        model, tok = load_causal_lm(path, device="cpu")
        state: dict[str, Any] = {}
        trainer._train(model, tok, state, main=True)
        return float(state["step_seconds"])


# ---- the run --------------------------------------------------------------------------------


def pairs(name: str, ours: Any, plain: Any, n: int) -> dict[str, Any]:
    """n A/B pairs (the order alternates per pair); per-pair ratio ours / plain."""
    rows = []
    for i in range(n):
        first, second = (ours, plain) if i % 2 == 0 else (plain, ours)
        load = os.getloadavg()[0]
        a = first()
        b = second()
        mine, theirs = (a, b) if first is ours else (b, a)
        rows.append({"ours_s": round(mine, 3), "plain_s": round(theirs, 3), "load": load})
        print(
            f"{name} pair {i}: selftaught {mine:.3f} s/step, plain {theirs:.3f} (load {load:.1f})"
        )
    ratios = [r["ours_s"] / r["plain_s"] for r in rows]
    return {
        "pairs": rows,
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "target": 1.10,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", choices=("sft", "grpo"), default=["sft", "grpo"])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--sft-steps", type=int, default=8)
    ap.add_argument("--grpo-steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--bf16", action="store_true", help="SFT in bf16 autocast on both sides")
    ap.add_argument("--quick", action="store_true", help="2 pairs, 2 steps each")
    args = ap.parse_args()
    if args.quick:
        args.pairs, args.sft_steps, args.grpo_steps = 2, 2, 1
    import torch

    import selftaught
    from selftaught.models.embedded import embedded_model_dir
    from selftaught.tasks import load_task

    if args.threads:
        from selftaught.models.threads import fix_threads

        fix_threads(args.threads)  # the local model keeps to it
    path = str(embedded_model_dir())
    task = load_task(TASK, train_size=16, val_size=4, test_size=4)
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "trl_step",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch threads "
        f"{torch.get_num_threads()}",
        "versions": {
            "selftaught": selftaught.__version__,
            "torch": torch.__version__,
            "trl": __import__("trl").__version__,
            "transformers": __import__("transformers").__version__,
            "peft": __import__("peft").__version__,
        },
        "model": "SmolLM2-135M-Instruct (fp32, CPU), LoRA r=16 all-linear",
        "args": vars(args),
    }
    if "sft" in args.modes:
        report["sft"] = pairs(
            "sft",
            lambda: sft_ours(path, args.sft_steps, args.batch, args.bf16),
            lambda: sft_plain(path, args.sft_steps, args.batch, args.bf16),
            args.pairs,
        )
    if "grpo" in args.modes:
        report["grpo"] = pairs(
            "grpo",
            lambda: grpo_ours(path, args.grpo_steps, task),
            lambda: grpo_plain(path, args.grpo_steps, task),
            args.pairs,
        )
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    name = "trl_step_quick.json" if args.quick else "trl_step.json"
    out = RESULTS / name
    atomic_write_json(out, report)
    for mode in ("sft", "grpo"):
        if mode in report:
            r = report[mode]
            print(
                f"{mode}: selftaught / plain TRL = {r['ratio_median']} (median of "
                f"{len(r['pairs'])} pairs, {r['ratio_min']}-{r['ratio_max']})"
            )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
