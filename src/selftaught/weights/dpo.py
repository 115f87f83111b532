"""Preference training on (prompt, chosen, rejected) pairs through TRL's DPOTrainer, on a peft
LoRA model (TRL then uses the model with its adapter disabled as the reference policy, so no
second copy of the weights is held). A night builds its pairs from the log: the reply the user
rejected, and the correction the user typed instead; `train --method dpo` reads them from a
preference JSONL file (`read_preferences`).

Data is conversational (the prompt as chat messages, each answer as one assistant turn), so
the chat template applies exactly as in SFT and in generation.

`DPOTrainer` (`DPOConfig`) is the trainer `train --method dpo` runs: the base model is round 0,
the DPO adapter round 1, both scored on the task's val and test through the one engine; the
gate `optimize` uses decides which ships (the gated rounds it shares with `RestTrainer`,
`weights.rest.RoundTrainer`: one round, trained on the pairs by `DPOTrainer.fit`). Run
directory as ReST's, with `rounds/1/pairs.jsonl` (the pairs trained on) beside
`rounds/1/adapter/`.

`DPOConfig(method="kto")` runs KTO (TRL's `KTOTrainer`) the same way on replies judged one by
one: a thumb up (`label` true) or down, no pair needed (`Judged`; a pair is its chosen reply
up and its rejected one down). Its round trains on `rounds/1/judged.jsonl`."""

from __future__ import annotations

import dataclasses
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
from selftaught.weights.rest import RestResult, RoundTrainer
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
class PreferenceItem:
    """What every item of preference data holds: the example it came from and its prompt
    (`PreferencePair`, `Judged`)."""

    example_id: str
    prompt: list[Message]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class PreferencePair(PreferenceItem):
    """One preference: what the user wanted (`chosen`) over what the model said (`rejected`)."""

    chosen: str
    rejected: str


@dataclass
class Judged(PreferenceItem):
    """One reply judged on its own (KTO's data): a thumb up (`desirable`) or down."""

    completion: str
    desirable: bool


def judged_to_dataset(judged: Sequence[Judged]) -> Any:
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "prompt": j.prompt,
                "completion": [{"role": "assistant", "content": j.completion}],
                "label": j.desirable,
            }
            for j in judged
        ]
    )


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

    check_batch(len(pairs), cfg.batch_size, "preference pairs")
    run = _Fit(cfg, learning_rate, seed, progress, report_to, run_name, deadline)
    data = pairs_to_dataset(pairs)
    return run.fit(TRLDPOConfig, TRLDPOTrainer, model, tokenizer, data, ("train_pairs", len(pairs)),
                   {"beta": beta})  # fmt: skip


def kto_train(
    model: Any,
    tokenizer: Any,
    judged: Sequence[Judged],
    cfg: SFTTrainConfig,
    *,
    beta: float = 0.1,
    weights: tuple[float, float] = (1.0, 1.0),
    learning_rate: float = 5e-5,
    seed: int = 0,
    progress: bool = False,
    report_to: str = "none",
    run_name: str | None = None,
    deadline: Deadline | None = None,
) -> dict[str, Any]:
    """Train the peft `model` in place on `judged` replies (KTO: each reply up or down on its
    own, its KL term estimated within each batch, so in TRL's order); `weights` are the
    (desirable, undesirable) losses' weights. As `dpo_train` otherwise."""
    from trl import KTOConfig as TRLKTOConfig
    from trl import KTOTrainer as TRLKTOTrainer

    check_batch(len(judged), cfg.batch_size, "judged replies")
    run = _Fit(cfg, learning_rate, seed, progress, report_to, run_name, deadline)
    extra = {"beta": beta, "desirable_weight": weights[0], "undesirable_weight": weights[1]}
    counted = ("train_judged", len(judged))
    return run.fit(TRLKTOConfig, TRLKTOTrainer, model, tokenizer, judged_to_dataset(judged),
                   counted, extra)  # fmt: skip


@dataclass(frozen=True)
class _Fit:
    """One TRL preference fine-tune (DPO, KTO) on a peft model, in a temporary folder."""

    cfg: SFTTrainConfig
    learning_rate: float
    seed: int
    progress: bool
    report_to: str
    run_name: str | None
    deadline: Deadline | None

    def fit(
        self,
        config_type: Any,
        trainer_type: Any,
        model: Any,
        tokenizer: Any,
        dataset: Any,
        counted: tuple[str, int],
        extra: dict[str, Any],
    ) -> dict[str, Any]:
        from selftaught.tracking import trl_report_to

        cfg = self.cfg
        report = trl_report_to(self.report_to)  # a missing tracker fails before the folder
        out = Path(tempfile.mkdtemp(prefix="selftaught-preference-"))
        args = config_type(
            output_dir=str(out),
            num_train_epochs=cfg.epochs,
            per_device_train_batch_size=cfg.batch_size,
            gradient_accumulation_steps=cfg.grad_accum,
            learning_rate=self.learning_rate,
            lr_scheduler_type="cosine",
            max_length=cfg.max_length,
            bf16=autocast_bf16(cfg, model),
            gradient_checkpointing=False,  # as in SFT: a small model needs no memory savings
            use_cpu=on_cpu(model),
            logging_steps=1,
            save_strategy="no",
            **report,
            run_name=self.run_name,
            seed=self.seed,
            data_seed=self.seed,
            disable_tqdm=not self.progress,
            **step_cap_args(cfg),
            **extra,
        )
        stopped: list[StopReason] = []
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer = trainer_type(
                    model=model,
                    args=args,
                    train_dataset=dataset,
                    processing_class=tokenizer,
                    callbacks=[time_cap(self.deadline, stopped)],
                )
            t_setup = time.perf_counter() - t0
            t1 = time.perf_counter()
            result = trainer.train()
            seconds = time.perf_counter() - t1
        finally:
            shutil.rmtree(out, ignore_errors=True)
        model.eval()
        return fine_tune_report(model, counted, result, trainer, [], seconds, t_setup, stopped)


# ---- the preference JSONL file --------------------------------------------------------------


@dataclass(frozen=True)
class Preferences:
    """Preference pairs, replies judged one by one (KTO), and where each came from
    (`file:line`), for errors that name it."""

    pairs: tuple[PreferencePair, ...]
    source: str
    lines: dict[str, int] = field(default_factory=dict)
    judged: tuple[Judged, ...] = ()

    @classmethod
    def of(
        cls, items: Sequence[PreferencePair | Judged], source: str = "preferences"
    ) -> Preferences:
        """Pairs or judged replies built in memory (a night's, a script's): each named by its
        id."""
        pairs = tuple(p for p in items if isinstance(p, PreferencePair))
        return cls(pairs, source, judged=tuple(j for j in items if isinstance(j, Judged)))

    def unpaired(self) -> tuple[Judged, ...]:
        """What KTO trains on: the judged replies, then each pair's chosen reply up and its
        rejected one down."""
        split = [
            Judged(f"{p.example_id}:{side}", p.prompt, text, side == "chosen")
            for p in self.pairs
            for side, text in (("chosen", p.chosen), ("rejected", p.rejected))
        ]
        return (*self.judged, *split)

    def where(self, pair_id: str) -> str:
        line = self.lines.get(pair_id)
        return f"{self.source}:{line}" if line is not None else f"{self.source} (pair {pair_id})"

    def items(self) -> list[PreferencePair | Judged]:
        """The pairs, then the judged replies."""
        return [*self.pairs, *self.judged]

    def sha256(self) -> str:
        """A digest of the pairs and judged replies (a resumed run trains on the same)."""
        rows = [p.to_dict() for p in self.items()]
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
    """The pairs and judged replies of a preference JSONL file, one object a line: a pair
    `{"prompt": str | messages, "chosen": str, "rejected": str, "id"?: str}` or a reply judged
    on its own `{"prompt", "completion": str, "label": true | false, "id"?}` (a thumb up or
    down: KTO's). A malformed line, a duplicate id, or a file that is missing or holds nothing
    is a `TaskError` naming the file (and the line)."""
    from selftaught.runs import iter_jsonl

    path = Path(path)
    if not path.is_file():
        raise TaskError(f"{path}: no such preference file (JSONL: prompt, chosen, rejected)")
    items: list[PreferencePair | Judged] = []
    lines: dict[str, int] = {}
    for lineno, row in iter_jsonl(path, TaskError):
        where = f"{path}:{lineno}"
        raw_id = row.get("id", lineno)
        if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or str(raw_id) == "":
            raise TaskError(f"{where}: `id` must be a non-empty string or an integer")
        item_id = str(raw_id)
        if item_id in lines:
            raise TaskError(
                f"{where}: duplicate id {item_id!r} (first used on line {lines[item_id]})"
            )
        lines[item_id] = lineno
        items.append(
            _judged(row, item_id, where) if "completion" in row else _pair(row, item_id, where)
        )
    if not items:
        raise TaskError(f"{path}: the file holds no preference pairs (empty JSONL file)")
    return dataclasses.replace(Preferences.of(items, str(path)), lines=lines)


def _pair(row: dict[str, Any], pair_id: str, where: str) -> PreferencePair:
    prompt = _prompt(row, where)
    chosen, rejected = _text(row, "chosen", where), _text(row, "rejected", where)
    if chosen.strip() == rejected.strip():
        raise TaskError(f"{where}: `chosen` and `rejected` are the same reply")
    return PreferencePair(pair_id, prompt, chosen, rejected)


def _judged(row: dict[str, Any], item_id: str, where: str) -> Judged:
    if "chosen" in row or "rejected" in row:
        raise TaskError(f"{where}: a line is a pair (chosen, rejected) or one judged reply "
                        "(completion, label), not both")  # fmt: skip
    label = row.get("label")
    if not isinstance(label, bool):
        raise TaskError(
            f"{where}: `label` must be true (a thumb up) or false (down), got {label!r:.40}"
        )
    return Judged(item_id, _prompt(row, where), _text(row, "completion", where), label)


def assert_no_held_out(prefs: Preferences, task: Task) -> None:
    """Fail closed, naming them, when preference prompts are the same items as the task's
    val or test inputs (`selftaught.duplicates`): the gate's items never feed what is
    learned, and a file the user gave that holds one is refused, not trimmed."""
    check = LeakCheck.of_task(task)
    leaks = []
    for p in prefs.items():
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


@dataclass(frozen=True)
class DPOResult(RestResult):
    """What a DPO run shipped: the base model (round 0) or the DPO adapter (round 1)."""

    kind: ClassVar[str] = "dpo"

    @property
    def shipped(self) -> str:
        return "base model" if self.best_round == 0 else f"{self.method.upper()} adapter"

    @property
    def train_pairs(self) -> int:
        """The preference pairs the adapter trained on (0 before it trained)."""
        row = next((r for r in self.rounds if r.round == 1), None)
        return int(row.train_pairs or 0) if row is not None else 0


class DPOTrainer(RoundTrainer[DPOConfig]):
    """DPO (`DPOConfig`) on `preferences` (a preference JSONL file, or pairs in memory) with a
    LoRA adapter on the local `model`: the base model is round 0, the adapter round 1, both
    scored on the task's val and test through the one engine, and the gate decides which
    ships (the gated rounds `RestTrainer` runs too: `RoundTrainer`). A prompt that duplicates
    a val or test item is refused before anything runs. `train()` resumes from the run
    directory (a resume on other pairs or settings is refused); `fit` is its one fine-tune
    (a night's DPO adapter is trained by it too)."""

    config_type: ClassVar[type] = DPOConfig
    result_type: ClassVar[type[RestResult]] = DPOResult
    settings_key: ClassVar[str] = "dpo"

    def __init__(
        self,
        config: DPOConfig,
        task: Task,
        model: ModelLike | Path | None = None,
        *,
        preferences: str | Path | Sequence[PreferencePair | Judged] | Preferences | None = None,
        output_dir: str | Path | None = None,
        callbacks: Sequence[TrainerCallback] = (),
        progress: bool = True,
        console: Console | None = None,
        ledger: UsageLedger | None = None,
    ):
        self.preferences = _preferences(preferences)
        assert_no_held_out(self.preferences, task)  # before the run directory is made
        super().__init__(
            config,
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
        batch, prefs = self.config.train.batch_size, self.preferences
        if self.method == "kto":
            return self._check_judged(batch)
        if prefs.judged:
            raise ConfigError(
                f"{prefs.source} holds replies judged one by one (completion, label): DPO trains "
                "on pairs (chosen, rejected); --method kto trains on thumbs"
            )
        if len(self.pairs) < batch:
            raise ConfigError(
                f"--batch-size {batch} can never be filled: {prefs.source} holds "
                f"{len(self.pairs)} preference pairs; lower --batch-size or add pairs"
            )

    def _check_judged(self, batch: int) -> None:
        """KTO: a thumb up and a thumb down at least (the loss weighs one against the
        other), and one batch of judged replies."""
        judged, source = self.preferences.unpaired(), self.preferences.source
        ups = sum(j.desirable for j in judged)
        if not ups or ups == len(judged):
            side = "down" if ups else "up"
            raise ConfigError(
                f"{source} holds no reply judged {side}: KTO learns from thumbs up and down "
                "(all of one kind is fine-tuning: --method sft, or rest)"
            )
        if len(judged) < batch:
            raise ConfigError(
                f"--batch-size {batch} can never be filled: {source} holds {len(judged)} "
                "judged replies; lower --batch-size or add some"
            )

    @property
    def last_round(self) -> int:
        return 1

    def run_config(self) -> dict[str, Any]:
        prefs = self.preferences
        digest = {"source": prefs.source, "pairs": len(prefs.pairs), "sha256": prefs.sha256()}
        if prefs.judged:
            digest["judged"] = len(prefs.judged)
        return {**super().run_config(), "preferences": digest}

    def _trained_model(self, r: int) -> Any:
        """Round 1: the base with the DPO adapter."""
        adapter = self.run.path("rounds", str(r), "adapter")
        return apply_adapter(self._fresh_base(), adapter).eval()

    def _round(self, r: int, current: Any, state: dict[str, Any]) -> Any:
        """Train the adapter on the pairs (KTO: the judged replies) from the base model; the
        gate decides."""
        t0 = time.perf_counter()
        rdir = self.run.path("rounds", str(r))
        self._drop_served()  # training serves nothing: no copy kept meanwhile
        model = prepare_trainable(self._fresh_base(), self.config.backend)
        row, what = self._round_data(r, rdir)
        row["train"] = self.fit(model, self._tok, run_name=f"{self.run.root.name}-{self.method}")
        row["round"] = r
        save_atomic(model, rdir / "adapter")
        model = merged(model).eval()
        return self._gate_round(r, model, current, state, row, t0, what=what, test=False)

    def _round_data(self, r: int, rdir: Path) -> tuple[dict[str, Any], str]:
        """What round r trains on, written beside its adapter (`pairs.jsonl`; KTO:
        `judged.jsonl`, each pair's two sides too): the round's row and its words."""
        if self.method != "kto":
            write_jsonl(rdir / "pairs.jsonl", [p.to_dict() for p in self.pairs])
            row: dict[str, Any] = {"round": r, "train_pairs": len(self.pairs)}
            return row, f"DPO on {len(self.pairs)} preference pairs"
        judged = self.preferences.unpaired()
        write_jsonl(rdir / "judged.jsonl", [j.to_dict() for j in judged])
        ups = sum(j.desirable for j in judged)
        row = {"train_judged": {"up": ups, "down": len(judged) - ups}}
        return row, f"KTO on {ups} replies judged up and {len(judged) - ups} down"

    def fit(
        self,
        model: Any,
        tokenizer: Any,
        *,
        run_name: str | None = None,
        deadline: Deadline | None = None,
    ) -> dict[str, Any]:
        """The trainer's one fine-tune, on this config's settings (beta, the rate, the seed,
        the schedule, `report_to`): the peft `model` trained in place on the pairs (KTO: the
        judged replies); loss, steps and timings. A round trains through it, and so does a
        night's DPO adapter. `deadline`: the wall-clock limit (default: this run's
        `--max-minutes`)."""
        cfg = self.config
        until = self.deadline if deadline is None else deadline
        if self.method == "kto":
            return kto_train(
                model,
                tokenizer,
                self.preferences.unpaired(),
                cfg.train,
                beta=cfg.beta,
                weights=(cfg.desirable_weight, cfg.undesirable_weight),
                learning_rate=cfg.lr(),
                seed=cfg.seed,
                progress=self.show_progress,
                report_to=cfg.report_to,
                run_name=run_name,
                deadline=until,
            )
        return dpo_train(
            model,
            tokenizer,
            self.pairs,
            cfg.train,
            beta=cfg.beta,
            learning_rate=cfg.lr(),
            seed=cfg.seed,
            progress=self.show_progress,
            report_to=cfg.report_to,
            run_name=run_name,
            deadline=until,
        )


def _preferences(
    given: str | Path | Sequence[PreferencePair | Judged] | Preferences | None,
) -> Preferences:
    if given is None:
        raise ConfigError(
            "DPO trains on preference pairs: give preferences=FILE.jsonl (--preferences), "
            "one {prompt, chosen, rejected} object a line (KTO: {prompt, completion, label})"
        )
    if isinstance(given, Preferences):
        return given
    if isinstance(given, str | Path):
        return read_preferences(given)
    prefs = Preferences.of(list(given))
    if not prefs.pairs and not prefs.judged:
        raise ConfigError("DPO trains on preference pairs: none were given")
    return prefs
