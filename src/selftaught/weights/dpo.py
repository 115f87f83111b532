"""Preference training on (prompt, chosen, rejected) pairs through TRL's DPOTrainer, on a peft
LoRA model (TRL then uses the model with its adapter disabled as the reference policy, so no
second copy of the weights is held). A night builds its pairs from the log: the reply the user
rejected, and the correction the user typed instead.

Data is conversational (the prompt as chat messages, each answer as one assistant turn), so
the chat template applies exactly as in SFT and in generation."""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftaught.models.base import Message
from selftaught.stops import Deadline, StopReason
from selftaught.weights.config import SFTTrainConfig
from selftaught.weights.sft import (
    check_batch,
    fine_tune_report,
    on_cpu,
    step_cap_args,
    time_cap,
)


@dataclass
class PreferencePair:
    """One preference: what the user wanted (`chosen`) over what the model said (`rejected`)."""

    example_id: str
    prompt: list[Message]
    chosen: str
    rejected: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def pairs_to_dataset(pairs: Sequence[PreferencePair]) -> Any:
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "prompt": p.prompt,
                "chosen": [{"role": "assistant", "content": p.chosen}],
                "rejected": [{"role": "assistant", "content": p.rejected}],
            }
            for p in pairs
        ]
    )


def dpo_train(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    cfg: SFTTrainConfig,
    *,
    beta: float = 0.1,
    learning_rate: float = 5e-5,
    seed: int = 0,
    progress: bool = False,
    deadline: Deadline | None = None,
) -> dict[str, Any]:
    """Train the peft `model` in place on `pairs` (DPO, sigmoid loss); loss, steps, timings.
    `cfg` gives the epochs, batch size, length and the step cap; `deadline` the wall-clock
    limit (training stops after the optimizer step that crosses it)."""
    from trl import DPOConfig, DPOTrainer

    check_batch(len(pairs), cfg.batch_size, "preference pairs")
    out = Path(tempfile.mkdtemp(prefix="selftaught-dpo-"))
    args = DPOConfig(
        output_dir=str(out),
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=learning_rate,
        lr_scheduler_type="cosine",
        beta=beta,
        max_length=cfg.max_length,
        bf16=cfg.bf16,
        gradient_checkpointing=False,  # as in SFT: a small model needs no memory savings
        use_cpu=on_cpu(model),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=seed,
        data_seed=seed,
        disable_tqdm=not progress,
        **step_cap_args(cfg),
    )
    stopped: list[StopReason] = []
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = DPOTrainer(
                model=model,
                args=args,
                train_dataset=pairs_to_dataset(pairs),
                processing_class=tokenizer,
                callbacks=[time_cap(deadline, stopped)],
            )
        t_setup = time.perf_counter() - t0
        t1 = time.perf_counter()
        result = trainer.train()
        seconds = time.perf_counter() - t1
    finally:
        shutil.rmtree(out, ignore_errors=True)
    model.eval()
    counted = ("train_pairs", len(pairs))
    return fine_tune_report(model, counted, result, trainer, [], seconds, t_setup, stopped)
