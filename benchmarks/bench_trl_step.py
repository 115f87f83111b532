"""SFT step time: selftaught's `sft_train` (LoRA through TRL's SFTTrainer) next to a plain
TRL script doing the same step (same model, data, LoRA r=16 all-linear, batch, fp32, no
gradient checkpointing), on the embedded SmolLM2-135M.

    HF_HUB_OFFLINE=1 python benchmarks/bench_trl_step.py [--steps 8] [--threads 1]

Writes benchmarks/results/trl_step.json."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def data(n: int) -> list[dict]:
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


class StepTimer:
    def __init__(self):
        from transformers import TrainerCallback

        times: list[float] = []

        class CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                self.t = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                times.append(time.perf_counter() - self.t)

        self.times = times
        self.callback = CB()


def plain_trl(path: str, rows: list[dict], steps: int, batch: int) -> list[float]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    timer = StepTimer()
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(
            output_dir="/tmp/plain-trl-step",
            max_steps=steps,
            per_device_train_batch_size=batch,
            learning_rate=2e-4,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            gradient_checkpointing=False,
            disable_tqdm=True,
        ),
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        peft_config=LoraConfig(
            r=16,
            lora_alpha=32,
            lora_dropout=0.05,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        ),
        callbacks=[timer.callback],
    )
    trainer.train()
    return timer.times


def ours(path: str, rows: list[dict], steps: int, batch: int) -> tuple[list[float], dict]:
    from selftaught.weights import sft as sft_mod
    from selftaught.weights.config import BackendConfig, SFTTrainConfig
    from selftaught.weights.sampling import Sample

    model, tok = sft_mod.load_model(path)
    samples = [
        Sample(
            str(i),
            r["prompt"],
            r["prompt"],
            r["completion"][0]["content"],
            r["completion"][0]["content"],
            1.0,
            1.0,
        )
        for i, r in enumerate(rows[: steps * batch])
    ]
    peft_model = sft_mod.prepare_trainable(model, BackendConfig())
    t0 = time.perf_counter()
    stats = sft_mod.sft_train(
        peft_model,
        tok,
        samples,
        SFTTrainConfig(epochs=1, batch_size=batch),
        backend="lora",
        progress=False,
    )
    stats["wall_incl_setup"] = round(time.perf_counter() - t0, 2)
    return [stats["step_seconds"]] * stats["steps"], stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    from selftaught.models.embedded import embedded_model_dir

    torch.set_num_threads(args.threads)
    path = str(embedded_model_dir())
    rows = data(args.steps * args.batch)
    # ours first, then plain TRL: if the machine's load drifts, it does not favour us
    mine, stats = ours(path, rows, args.steps, args.batch)
    plain = plain_trl(path, rows, args.steps, args.batch)
    # our stats give the mean over all steps (first step included), so compare means
    plain_med = statistics.median(plain[1:] or plain)
    plain_mean = statistics.fmean(plain)
    report = {
        "model": "SmolLM2-135M-Instruct (fp32, CPU)",
        "threads": args.threads,
        "batch": args.batch,
        "steps": args.steps,
        "plain_trl_step_s_median": round(plain_med, 3),
        "plain_trl_step_s_mean": round(plain_mean, 3),
        "plain_trl_step_s_all": [round(t, 3) for t in plain],
        "selftaught_step_s_mean": stats["step_seconds"],
        "selftaught_step_s_median": stats["step_seconds_median"],
        "selftaught_stats": stats,
        "overhead_vs_mean": round(stats["step_seconds"] / plain_mean - 1, 3),
        "overhead_vs_median": round(stats["step_seconds_median"] / plain_med - 1, 3),
    }
    out = Path(__file__).parent / "results" / "trl_step.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
