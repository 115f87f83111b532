"""Preference training on (prompt, chosen, rejected) pairs through TRL's DPOTrainer, on a peft
LoRA model (TRL then uses the model with its adapter disabled as the reference policy, so no
second copy of the weights is held). A night builds its pairs from the log: the reply the user
rejected, and the correction the user typed instead; `train --method dpo` reads them from a
preference JSONL file (`read_preferences`).

Data is conversational (the prompt as chat messages, each answer as one assistant turn), so
the chat template applies exactly as in SFT and in generation.

`DPOTrainer` (`DPOConfig`) is the trainer `train --method dpo` runs: the base model is round 0,
the DPO adapter round 1, both scored on the task's val and test through the one engine; the
gate `optimize` uses decides which ships (the ReST trainer's rounds, evaluation and gate:
`DPOTrainer` is a one-round `RestTrainer` whose round trains on the pairs). Run directory as
ReST's, with `rounds/1/pairs.jsonl` (the pairs trained on) beside `rounds/1/adapter/`."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console

from selftaught.callbacks import TrainerCallback
from selftaught.demos import Demo, LeakCheck
from selftaught.errors import TaskError
from selftaught.models.base import Message
from selftaught.models.resolve import ModelLike
from selftaught.models.usage import UsageLedger
from selftaught.runs import write_jsonl
from selftaught.stops import Deadline, StopReason
from selftaught.tasks.base import Task
from selftaught.weights.config import ConfigError, DPOConfig, SFTTrainConfig
from selftaught.weights.rest import RestResult, RestTrainer
from selftaught.weights.sft import (
    apply_adapter,
    autocast_bf16,
    check_batch,
    fine_tune_report,
    merged,
    on_cpu,
    prepare_trainable,
    save_atomic,
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
    report_to: str = "none",
    run_name: str | None = None,
    deadline: Deadline | None = None,
) -> dict[str, Any]:
    """Train the peft `model` in place on `pairs` (DPO, sigmoid loss); loss, steps, timings.
    `cfg` gives the epochs, batch size, length and the step cap; `deadline` the wall-clock
    limit (training stops after the optimizer step that crosses it); `report_to` the tracker
    TRL logs to (`selftaught.tracking`)."""
    from trl import DPOConfig as TRLDPOConfig
    from trl import DPOTrainer as TRLDPOTrainer

    from selftaught.tracking import trl_report_to

    check_batch(len(pairs), cfg.batch_size, "preference pairs")
    report = trl_report_to(report_to)  # a missing tracker fails before the temp folder
    out = Path(tempfile.mkdtemp(prefix="selftaught-dpo-"))
    args = TRLDPOConfig(
        output_dir=str(out),
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=learning_rate,
        lr_scheduler_type="cosine",
        beta=beta,
        max_length=cfg.max_length,
        bf16=autocast_bf16(cfg, model),
        gradient_checkpointing=False,  # as in SFT: a small model needs no memory savings
        use_cpu=on_cpu(model),
        logging_steps=1,
        save_strategy="no",
        **report,
        run_name=run_name,
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
            trainer = TRLDPOTrainer(
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


def dpo_fit(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    config: DPOConfig,
    *,
    progress: bool = False,
    run_name: str | None = None,
    deadline: Deadline | None = None,
) -> dict[str, Any]:
    """The DPO trainer's one fine-tune, on the settings of a validated `DPOConfig`: the peft
    `model` trained in place on `pairs` (`DPOTrainer` and a night's adapter phase both call
    it); `deadline`: the wall-clock limit (`selftaught.stops`)."""
    return dpo_train(
        model,
        tokenizer,
        pairs,
        config.train,
        beta=config.beta,
        learning_rate=config.lr(),
        seed=config.seed,
        progress=progress,
        report_to=config.report_to,
        run_name=run_name,
        deadline=deadline,
    )


# ---- the preference JSONL file --------------------------------------------------------------


@dataclass(frozen=True)
class Preferences:
    """Preference pairs and where each came from (`file:line`), for errors that name it."""

    pairs: tuple[PreferencePair, ...]
    source: str
    lines: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, pairs: Sequence[PreferencePair], source: str = "preferences") -> Preferences:
        """Pairs built in memory (a night's, a script's): each named by its id."""
        return cls(tuple(pairs), source)

    def where(self, pair_id: str) -> str:
        line = self.lines.get(pair_id)
        return f"{self.source}:{line}" if line is not None else f"{self.source} (pair {pair_id})"

    def sha256(self) -> str:
        """A digest of the pairs (a resumed run must train on the same ones)."""
        rows = [p.to_dict() for p in self.pairs]
        return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def _text(row: dict[str, Any], key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"{where}: `{key}` must be a non-empty string, got {value!r:.80}")
    return value


def _prompt(row: dict[str, Any], where: str) -> list[Message]:
    from selftaught.tasks.jsonl import JsonlTask

    given = row.get("prompt")
    if isinstance(given, str):
        if not given.strip():
            raise TaskError(f"{where}: `prompt` must be a non-empty string or a chat list")
        return [{"role": "user", "content": given}]
    if not isinstance(given, list):
        raise TaskError(f"{where}: missing `prompt` (a string or a list of chat messages)")
    JsonlTask._check_messages(given, where, "prompt")  # the task files' own rule
    if given[-1]["role"] == "assistant":
        raise TaskError(
            f"{where}: `prompt` ends with an assistant turn; the answers are `chosen` and "
            "`rejected`"
        )
    return [{"role": m["role"], "content": m["content"]} for m in given]


def read_preferences(path: str | Path) -> Preferences:
    """The pairs of a preference JSONL file, one object a line: `{"prompt": str | messages,
    "chosen": str, "rejected": str, "id"?: str}`. A malformed line, a duplicate id, or a file
    that is missing or holds no pairs is a `TaskError` naming the file (and the line)."""
    from selftaught.runs import iter_jsonl

    path = Path(path)
    if not path.is_file():
        raise TaskError(f"{path}: no such preference file (JSONL: prompt, chosen, rejected)")
    pairs: list[PreferencePair] = []
    lines: dict[str, int] = {}
    for lineno, row in iter_jsonl(path, TaskError):
        where = f"{path}:{lineno}"
        raw_id = row.get("id", lineno)
        if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or str(raw_id) == "":
            raise TaskError(f"{where}: `id` must be a non-empty string or an integer")
        pair_id = str(raw_id)
        if pair_id in lines:
            raise TaskError(
                f"{where}: duplicate id {pair_id!r} (first used on line {lines[pair_id]})"
            )
        prompt = _prompt(row, where)
        chosen, rejected = _text(row, "chosen", where), _text(row, "rejected", where)
        if chosen.strip() == rejected.strip():
            raise TaskError(f"{where}: `chosen` and `rejected` are the same reply")
        lines[pair_id] = lineno
        pairs.append(PreferencePair(pair_id, prompt, chosen, rejected))
    if not pairs:
        raise TaskError(f"{path}: the file holds no preference pairs (empty JSONL file)")
    return Preferences(tuple(pairs), str(path), lines)


def assert_no_held_out(prefs: Preferences, task: Task) -> None:
    """Fail closed, naming them, when preference prompts are the same items as the task's
    val or test inputs (`selftaught.duplicates`): the gate's items never feed what is
    learned, and a file the user gave that holds one is refused, not trimmed."""
    check = LeakCheck.of_task(task)
    leaks = []
    for p in prefs.pairs:
        leak = check.find(Demo.of(p.example_id, p.prompt, "", "correction"))
        if leak is not None:
            leaks.append(
                f"{prefs.where(p.example_id)} duplicates {leak.split} item {leak.held_out_id!r}"
            )
    if leaks:
        more = f" (and {len(leaks) - 5} more)" if len(leaks) > 5 else ""
        raise TaskError(
            f"preference prompts overlap task {task.name!r}'s held-out items (val and test never "
            f"feed what is learned): {'; '.join(leaks[:5])}{more}"
        )


# ---- the trainer ----------------------------------------------------------------------------


@dataclass
class DPOResult(RestResult):
    """What a DPO run shipped: the base model (round 0) or the DPO adapter (round 1)."""

    kind: ClassVar[str] = "dpo"

    @property
    def shipped(self) -> str:
        return "base model" if self.best_round == 0 else "DPO adapter"

    @property
    def train_pairs(self) -> int:
        """The preference pairs the adapter trained on (0 before it trained)."""
        row = next((r for r in self.rounds if r.round == 1), None)
        return int(row.train_pairs or 0) if row is not None else 0


class DPOTrainer(RestTrainer):
    """DPO (`DPOConfig`) on `preferences` (a preference JSONL file, or pairs in memory) with a
    LoRA adapter on the local `model`: the base model is round 0, the adapter round 1, both
    scored on the task's val and test through the one engine, and the gate decides which
    ships (ReST's rounds, evaluation and gate: see `RestTrainer`). A prompt that duplicates a
    val or test item is refused before anything runs. `train()` resumes from the run
    directory (a resume on other pairs or settings is refused)."""

    config_type: ClassVar[type] = DPOConfig
    result_type: ClassVar[type[DPOResult]] = DPOResult
    settings_key: ClassVar[str] = "dpo"
    config: DPOConfig  # type: ignore[assignment]

    def __init__(
        self,
        config: DPOConfig,
        task: Task,
        model: ModelLike | Path | None = None,
        *,
        preferences: str | Path | Sequence[PreferencePair] | Preferences | None = None,
        output_dir: str | Path | None = None,
        callbacks: Sequence[TrainerCallback] = (),
        progress: bool = True,
        console: Console | None = None,
        ledger: UsageLedger | None = None,
    ):
        self.preferences = _preferences(preferences)
        assert_no_held_out(self.preferences, task)  # before the run directory is made
        super().__init__(
            config,  # type: ignore[arg-type]  # RestTrainer's preamble, typed for RestConfig
            task,
            model,
            output_dir=output_dir,
            callbacks=callbacks,
            progress=progress,
            console=console,
            ledger=ledger,
        )

    @property
    def pairs(self) -> tuple[PreferencePair, ...]:
        return self.preferences.pairs

    def train(self) -> DPOResult:
        result = super().train()  # built as `result_type`
        assert isinstance(result, DPOResult)
        return result

    def _check_batch(self) -> None:
        batch = self.config.train.batch_size
        if len(self.pairs) < batch:
            raise ConfigError(
                f"--batch-size {batch} can never be filled: {self.preferences.source} holds "
                f"{len(self.pairs)} preference pairs; lower --batch-size or add pairs"
            )

    @property
    def last_round(self) -> int:
        return 1

    def run_config(self) -> dict[str, Any]:
        prefs = self.preferences
        digest = {"source": prefs.source, "pairs": len(prefs.pairs), "sha256": prefs.sha256()}
        return {**super().run_config(), "preferences": digest}

    def _round_model(self, r: int, *, own: bool = False) -> Any:
        """Round 0 is the base model; round 1 the base with the DPO adapter."""
        if r == 0:
            return super()._round_model(0, own=own)
        adapter = self.run.path("rounds", str(r), "adapter")
        return apply_adapter(self._fresh_base(), adapter).eval()

    def _round(self, r: int, current: Any, state: dict[str, Any]) -> Any:
        """Train the adapter on the pairs from the base model; the gate decides."""
        t0 = time.perf_counter()
        rdir = self.run.path("rounds", str(r))
        write_jsonl(rdir / "pairs.jsonl", [p.to_dict() for p in self.pairs])
        row: dict[str, Any] = {"round": r, "train_pairs": len(self.pairs)}
        model = prepare_trainable(self._fresh_base(), self.config.backend)
        row["train"] = dpo_fit(
            model,
            self._tok,
            self.pairs,
            self.config,
            progress=self.show_progress,
            run_name=f"{self.run.root.name}-dpo",
            deadline=self.deadline,
        )
        save_atomic(model, rdir / "adapter")
        model = merged(model).eval()
        what = f"DPO on {len(self.pairs)} preference pairs"
        return self._gate_round(r, model, current, state, row, t0, what=what, test=False)


def _preferences(
    given: str | Path | Sequence[PreferencePair] | Preferences | None,
) -> Preferences:
    if given is None:
        raise ConfigError(
            "DPO trains on preference pairs: give preferences=FILE.jsonl (--preferences), "
            "one {prompt, chosen, rejected} object a line"
        )
    if isinstance(given, Preferences):
        return given
    if isinstance(given, str | Path):
        return read_preferences(given)
    prefs = Preferences.of(list(given))
    if not prefs.pairs:
        raise ConfigError("DPO trains on preference pairs: none were given")
    return prefs
