"""Supervised fine-tuning on scored samples through TRL's SFTTrainer, with a peft LoRA / DoRA
adapter (default), every weight (`full`) or a from-scratch model. Data is conversational
prompt-completion, so the chat template applies and the loss covers the completion only.

Episodes (samples with a trajectory) are given to TRL pre-tokenized, with `assistant_masks`:
the loss covers the tokens the model wrote (each assistant turn: its tool calls, its final
answer, its end-of-turn token) and none of the prompt, the turn headers or the tool results
(TRL builds the labels from the mask, as its own `assistant_only_loss` does). They are
rendered as the local backend renders them (`local_render`: the model's own template when it
has a tools section, else the documented fallback), so the text trained on is the text each
turn was generated from."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from selftaught.models.base import Message
from selftaught.models.device import dtype_name, training_autocast
from selftaught.runs import make_private, private_dirs
from selftaught.stops import Deadline, StopReason
from selftaught.weights.config import (
    MICRO_BATCH_TOKENS,
    BackendConfig,
    ConfigError,
    SFTTrainConfig,
)
from selftaught.weights.sampling import Sample


def load_causal_lm(path: str | Path, *, device: str | None = None) -> tuple[Any, Any]:
    """A causal LM and its tokenizer from a transformers folder, on the device and in the
    dtype `resolve_device` picks (the same choice the local generation backend makes: fp32
    on a CPU, half precision on an accelerator)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from selftaught.models.device import resolve_device

    where, dtype = resolve_device(device)
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    # Any, as this module treats models: mypy reads transformers' wrapped `to` unbound
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.to(where)
    return model, tok


def on_cpu(model: Any) -> bool:
    """Whether `model` lives on the CPU (trainers are then told `use_cpu`)."""
    device: str = next(model.parameters()).device.type
    return device == "cpu"


def autocast_bf16(cfg: SFTTrainConfig, model: Any) -> bool:
    """Whether a fine-tune of `model` runs in bf16 autocast (`cfg.bf16`, None deciding per
    device: `selftaught.models.device.training_autocast`)."""
    return training_autocast(cfg.bf16, "cpu" if on_cpu(model) else "accelerator")


def _layers(model: Any) -> Any:
    """The list of transformer blocks (Llama-like `model.model.layers`, GPT-2's `h`)."""
    base = getattr(model, "model", None) or getattr(model, "transformer", None)
    for name in ("layers", "h", "blocks"):
        layers = getattr(base, name, None)
        if layers is not None:
            return layers
    raise ConfigError("cannot find the transformer layers of this model for --num-layers")


def prepare_trainable(model: Any, backend: BackendConfig) -> Any:
    """Wrap or freeze `model` so that only what `backend` names is trained."""
    n_layers = len(_layers(model))
    if backend.num_layers is not None and backend.num_layers > n_layers:
        raise ConfigError(
            f"--num-layers {backend.num_layers} exceeds the model's {n_layers} layers"
        )
    last = (
        None if backend.num_layers is None else list(range(n_layers - backend.num_layers, n_layers))
    )
    if backend.backend == "lora":
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=backend.lora_r,
            lora_alpha=backend.lora_alpha,
            lora_dropout=backend.lora_dropout,
            target_modules=backend.target_modules,
            use_dora=backend.use_dora,
            layers_to_transform=last,
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, config)
    # full / scratch: every weight, or only the last N blocks
    if last is not None:
        for p in model.parameters():
            p.requires_grad_(False)
        layers = _layers(model)
        for i in last:
            for p in layers[i].parameters():
                p.requires_grad_(True)
    return model


def merged(model: Any) -> Any:
    """A plain transformers model with any LoRA adapter folded into the weights, and its
    class's own forward: a trainer patches `forward` on the instance (TRL's fused LM head,
    accelerate's autocast), closing over the original bound method, so a copy of the model
    (the engine's served copy in another dtype) would still run the original's weights."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        model = model.merge_and_unload()
    for attr in ("forward", "_original_forward"):
        model.__dict__.pop(attr, None)
    return model


def trainable_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


Render = Callable[[list[Message], list[dict[str, Any]] | None, bool], str]
"""(messages, tools, add_generation_prompt) → the prompt text the model sees: what the
generation backend renders (for an episode, with its tools and tool turns)."""


def template_render(tokenizer: Any) -> Render:
    """The tokenizer's own chat template, with the tools schema when there is one (a template
    without a tools section drops the calls: `episode_tokens` refuses that)."""

    def render(messages: list[Message], tools: list[dict[str, Any]] | None, gen: bool) -> str:
        text: str = tokenizer.apply_chat_template(  # tokenize=False: the text
            messages, tools=tools or None, tokenize=False, add_generation_prompt=gen
        )
        return text

    return render


def local_render(tokenizer: Any) -> Render:
    """What the local backend renders (`models.tools.render_prompt`): the model's template
    when it has a tools section, else the documented fallback (SmolLM2's case), so an
    episode is trained on the very text its turns were generated from. The default."""
    from selftaught.models.tools import render_prompt

    def render(messages: list[Message], tools: list[dict[str, Any]] | None, gen: bool) -> str:
        return render_prompt(tokenizer, messages, tools, add_generation_prompt=gen)

    return render


def _assistant_spans(sample: Sample, render: Render) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns (from after
    each turn's header to the end of the turn)."""
    turns = sample.trajectory or [{"role": "assistant", "content": sample.target}]
    convo = list(sample.train_messages) + list(turns)
    full = render(convo, sample.tools, False)
    spans = []
    for i in range(len(sample.train_messages), len(convo)):
        if convo[i].get("role") != "assistant":
            continue
        start = render(convo[:i], sample.tools, True)
        end = render(convo[: i + 1], sample.tools, False)
        if not (full.startswith(start) and full.startswith(end) and len(end) > len(start)):
            raise ConfigError(
                f"{sample.example_id}: the chat template does not render a conversation as a "
                "prefix of its continuation, so the assistant turns cannot be masked"
            )
        for call in convo[i].get("tool_calls") or []:
            name = str((call.get("function") or {}).get("name"))
            if name not in end[len(start) :]:
                raise ConfigError(
                    f"{sample.example_id}: the chat template dropped the tool call {name!r}; "
                    "training on it needs the renderer the generation backend uses for tools"
                )
        spans.append((len(start), len(end)))
    return full, spans


def episode_tokens(tokenizer: Any, sample: Sample, render: Render) -> dict[str, list[int]]:
    """`input_ids` of the prompt and trajectory, and `assistant_masks` (1 on each token that
    starts inside an assistant turn, 0 on the prompt, the headers and the tool results)."""
    full, spans = _assistant_spans(sample, render)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in enc["offset_mapping"]]
    return {"input_ids": list(enc["input_ids"]), "assistant_masks": mask}


def samples_to_dataset(
    samples: Sequence[Sample], tokenizer: Any = None, render: Render | None = None
) -> Any:
    """Conversational prompt-completion rows: the prompt each sample was scored on (minus a
    teacher skill), and its training target as the assistant turn. When any sample is an
    episode, every row is pre-tokenized with its assistant mask (`episode_tokens`)."""
    from datasets import Dataset

    if any(s.trajectory for s in samples):
        if tokenizer is None:
            raise ConfigError("episodes are tokenized here: pass the tokenizer")
        render = render or local_render(tokenizer)
        return Dataset.from_list([episode_tokens(tokenizer, s, render) for s in samples])
    return Dataset.from_list(
        [
            {
                "prompt": s.train_messages,
                "completion": [{"role": "assistant", "content": s.target}],
            }
            for s in samples
        ]
    )


def check_batch(n_rows: int, batch_size: int, what: str = "training samples") -> None:
    if n_rows < batch_size:
        raise ConfigError(
            f"--batch-size {batch_size} is larger than the {n_rows} {what}; "
            f"lower --batch-size to at most {max(1, n_rows)} or give more data"
        )


def _check_lengths(tokenizer: Any, samples: Sequence[Sample], max_length: int) -> None:
    """A prompt longer than max_length leaves no completion token to learn from: TRL would
    drop the row silently (and crash when none is left), so say so up front."""
    if any(s.trajectory for s in samples):
        return  # episodes: checked on their tokens (`_check_episode_rows`)
    too_long = 0
    for s in samples:
        text = tokenizer.apply_chat_template(
            s.train_messages, tokenize=False, add_generation_prompt=True
        )
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= max_length:
            too_long += 1
    if too_long:
        raise ConfigError(
            f"{too_long} of {len(samples)} training prompts are at least max_length "
            f"({max_length}) tokens long, leaving nothing of the completion to train on; "
            "raise max_length"
        )


def _check_episode_rows(masks: Sequence[Sequence[int]], max_length: int) -> None:
    """Every episode row must keep an assistant token within max_length (TRL truncates)."""
    empty = sum(1 not in mask[:max_length] for mask in masks)
    if empty:
        raise ConfigError(
            f"{empty} of {len(masks)} training episodes have no assistant token within "
            f"max_length ({max_length}), leaving nothing to train on; raise max_length"
        )


def micro_batches(batch_size: int, longest: int, budget: int | None = None) -> int:
    """Into how many micro-batches a batch of `batch_size` rows of up to `longest` tokens is
    split so that one holds at most `budget` tokens (default `MICRO_BATCH_TOKENS`; a divisor
    of `batch_size`: the optimizer step still sees the whole batch, as accumulated
    gradients)."""
    budget = MICRO_BATCH_TOKENS if budget is None else budget
    for parts in range(1, batch_size + 1):
        if batch_size % parts == 0 and (batch_size // parts) * longest <= budget:
            return parts
    return batch_size


def packed_micro_batches(batch_size: int, lengths: Sequence[int], budget: int | None = None) -> int:
    """`micro_batches` for packed rows: a micro-batch is one row of its rows' tokens, so it
    holds the sum of their lengths, not rows x the longest; the bound is the sum of the
    longest rows a micro-batch could draw (the sampler shuffles)."""
    budget = MICRO_BATCH_TOKENS if budget is None else budget
    longest_first = sorted(lengths, reverse=True)
    for parts in range(1, batch_size + 1):
        if batch_size % parts == 0 and sum(longest_first[: batch_size // parts]) <= budget:
            return parts
    return batch_size


def _row_lengths(dataset: Any, tokenizer: Any, max_length: int) -> list[int]:
    """Tokens of each training row (prompt and completion, as the chat template renders
    them; episodes are tokenized already), as trained: at most `max_length`."""
    if "input_ids" in dataset.column_names:
        return [min(len(ids), max_length) for ids in dataset["input_ids"]]
    texts = [
        tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
        for row in dataset
    ]
    return [
        min(len(tokenizer(t, add_special_tokens=False)["input_ids"]), max_length) for t in texts
    ]


def _parts(model: Any, cfg: SFTTrainConfig, lengths: list[int]) -> int:
    """Micro-batches per batch: on a CPU, as the token budget allows; elsewhere one."""
    if not on_cpu(model):
        return 1
    if cfg.packing:
        return packed_micro_batches(cfg.batch_size, lengths)
    return micro_batches(cfg.batch_size, max(lengths))


def check_packing_isolates(model: Any) -> None:
    """Packing is right only where the model's attention keeps packed rows apart (from the
    restarting position ids: transformers' masks for sdpa / eager when no attention mask is
    given, the varlen kernels for flash attention). Checked on the model itself: a short
    row packed after another must give the logits it gives alone."""
    import torch

    device = next(model.parameters()).device
    first, second = [11, 12, 13, 14], [21, 22, 23]
    ids = torch.tensor([first + second], device=device)
    positions = torch.tensor([list(range(len(first))) + list(range(len(second)))], device=device)
    was_training = model.training
    model.eval()  # no dropout: the two forwards must be comparable
    try:
        with torch.no_grad():
            packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits
            alone = model(input_ids=ids[:, len(first) :], use_cache=False).logits
    finally:
        model.train(was_training)
    tol = 1e-4 if packed.dtype == torch.float32 else 5e-2
    if not torch.allclose(packed[0, len(first) :].float(), alone[0].float(), atol=tol, rtol=tol):
        raise ConfigError(
            "--packing: this model's attention does not keep packed rows apart (a row packed "
            "after another attends to it); train without --packing"
        )


class CountingCollator:
    """The trainer's collator, counting what it hands to the model: `tokens` (positions
    computed on, pad included) and `pad_tokens` (positions that are padding); `packed` turns
    TRL's collator padding-free (its rows concatenated into one, position ids restarting)."""

    def __init__(self, inner: Any, packed: bool = False) -> None:
        if packed:
            from dataclasses import replace

            inner = replace(inner, padding_free=True)
        self.inner = inner
        self.tokens = 0
        self.pad_tokens = 0

    def __call__(self, examples: list[dict[str, Any]]) -> Any:
        batch = self.inner(examples)
        computed = int(batch["input_ids"].numel())
        self.tokens += computed
        self.pad_tokens += computed - sum(len(e["input_ids"]) for e in examples)
        return batch

    def report(self) -> dict[str, Any]:
        share = self.pad_tokens / self.tokens if self.tokens else None
        return {
            "tokens": self.tokens,
            "pad_tokens": self.pad_tokens,
            "pad_share": None if share is None else round(share, 4),
        }


def _step_timer(times: list[float]) -> Any:
    """A callback appending each optimizer step's wall time to `times`."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            times.append(time.perf_counter() - self.t)

    return StepTimer()


def time_cap(deadline: Deadline | None, stopped: list[StopReason], *, save: bool = False) -> Any:
    """A callback that ends training after the optimizer step that crosses `deadline` (the
    run's `--max-minutes`; None: never), noting the stop in `stopped`; `save`: a checkpoint is
    written at that step (a run that resumes from checkpoints goes on from there)."""
    from transformers import TrainerCallback

    class TimeCap(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if deadline is None or control.should_training_stop or not deadline.passed():
                return
            control.should_training_stop = True
            control.should_save = control.should_save or save
            assert deadline.minutes is not None
            stopped.append(
                StopReason.max_minutes(
                    deadline.minutes, f"after optimizer step {state.global_step}"
                )
            )

    return TimeCap()


def plain_progress(phase: str, progress: bool) -> Any:
    """A callback printing a plain line a minute (steps done, rate, ETA) when progress is on
    and stderr, where the trainer's bar goes, is not a terminal (`selftaught.progress_lines`)."""
    from rich.console import Console
    from transformers import TrainerCallback

    from selftaught.progress_lines import ProgressLines, plain_lines_wanted

    class PlainProgress(TrainerCallback):
        lines = ProgressLines(phase, None, enabled=False)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            wanted = plain_lines_wanted(progress, Console(stderr=True))
            total = state.max_steps or None
            start = state.global_step
            self.lines = ProgressLines(phase, total, enabled=wanted, unit="steps", start=start)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.lines.update(state.global_step)

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.lines.finish()

    return PlainProgress()


def step_cap_args(cfg: SFTTrainConfig) -> dict[str, Any]:
    """Trainer arguments for `cfg.max_steps` (-1: the epochs decide)."""
    return {"max_steps": cfg.max_steps if cfg.max_steps is not None else -1}


def sft_train(
    model: Any,
    tokenizer: Any,
    samples: Sequence[Sample],
    cfg: SFTTrainConfig,
    *,
    backend: str,
    seed: int = 0,
    progress: bool = True,
    work_dir: str | Path | None = None,
    render: Render | None = None,
    report_to: str = "none",
    run_name: str | None = None,
    deadline: Deadline | None = None,
) -> dict[str, Any]:
    """Fine-tune `model` in place on `samples`; returns loss, steps and timings. `render`:
    how episodes are rendered (default: as the local backend renders them, `local_render`).
    `report_to`: the tracker TRL logs this fine-tune to (`selftaught.tracking`). `deadline`:
    the run's wall-clock limit; training stops after the optimizer step that crosses it."""
    from trl import SFTTrainer

    check_batch(len(samples), cfg.batch_size)
    _check_lengths(tokenizer, samples, cfg.max_length)
    dataset = samples_to_dataset(samples, tokenizer, render)
    if "assistant_masks" in dataset.column_names:
        _check_episode_rows(dataset["assistant_masks"], cfg.max_length)
    if cfg.packing:
        check_packing_isolates(model)
    own_dir = work_dir is None
    out = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="selftaught-sft-"))
    parts = _parts(model, cfg, _row_lengths(dataset, tokenizer, cfg.max_length))
    args = _sft_args(
        model,
        cfg,
        out,
        backend=backend,
        seed=seed,
        progress=progress,
        report_to=report_to,
        run_name=run_name,
        parts=parts,
    )
    step_times: list[float] = []
    stopped: list[StopReason] = []
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[
                _step_timer(step_times),
                time_cap(deadline, stopped),
                plain_progress("fine-tune", progress),
            ],
        )
    # TRL's own collator, padding-free when packing: set here, as TRL 1.16 refuses
    # `padding_free` without its dataset packing while max_length is set, though it truncates
    # every row to max_length either way; its bfd packing would pack the whole dataset into
    # max_length rows (other batches, fewer steps)
    trainer.data_collator = collated = CountingCollator(trainer.data_collator, cfg.packing)
    t_setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - t1
    model.eval()
    if own_dir:
        shutil.rmtree(out, ignore_errors=True)
    counted = ("train_samples", len(samples))
    report = fine_tune_report(
        model, counted, result, trainer, step_times, seconds, t_setup, stopped
    )
    return {**report, **collated.report(), "micro_batches": parts, "packing": cfg.packing}


def _sft_args(
    model: Any,
    cfg: SFTTrainConfig,
    out: Path,
    *,
    backend: str,
    seed: int,
    progress: bool,
    report_to: str,
    run_name: str | None,
    parts: int = 1,
) -> Any:
    """TRL's SFTConfig for one fine-tune: no checkpoints, a log line per step; each batch in
    `parts` micro-batches (`micro_batches`)."""
    from trl import SFTConfig

    from selftaught.tracking import trl_report_to

    return SFTConfig(
        output_dir=str(out),
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size // parts,
        gradient_accumulation_steps=cfg.grad_accum * parts,
        learning_rate=cfg.lr_for(backend),
        lr_scheduler_type="cosine",
        warmup_steps=cfg.warmup_ratio,
        weight_decay=cfg.weight_decay,
        max_length=cfg.max_length,
        bf16=autocast_bf16(cfg, model),
        # TRL turns this on by default; a 135M-class model needs no memory savings and
        # recomputing activations costs about a third more time per step
        gradient_checkpointing=False,
        use_cpu=on_cpu(model),
        logging_steps=1,
        save_strategy="no",
        **trl_report_to(report_to),
        run_name=run_name,
        seed=seed,
        data_seed=seed,
        disable_tqdm=not progress,
        dataset_num_proc=None,
        **step_cap_args(cfg),
    )


def fine_tune_report(
    model: Any,
    counted: tuple[str, int],
    result: Any,
    trainer: Any,
    step_times: list[float],
    seconds: float,
    t_setup: float,
    stopped: list[StopReason],
) -> dict[str, Any]:
    """What a fine-tune (SFT, DPO) reports: what it trained on (`counted`: its name and
    number), loss, steps and timings."""
    steps = int(result.global_step)
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    return {
        counted[0]: counted[1],
        "steps": steps,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "train_loss": float(result.training_loss),
        "train_seconds": round(seconds, 2),
        "setup_seconds": round(t_setup, 2),
        "step_seconds": round(seconds / steps, 3) if steps else None,
        "step_seconds_median": round(statistics.median(step_times), 3) if step_times else None,
        "trainable_params": trainable_parameters(model),
        # the precision it trained in: bf16 autocast or none, over weights of this dtype
        "autocast": "bf16" if getattr(trainer.args, "bf16", False) else "off",
        "dtype": dtype_name(next(model.parameters()).dtype),
        **({"stopped_by": stopped[0].to_dict()} if stopped else {}),
    }


def save_atomic(obj: Any, path: str | Path, tokenizer: Any | None = None) -> Path:
    """`save_pretrained` into a temp folder beside `path`, then rename: a kill leaves either
    nothing or a complete folder."""
    path = Path(path)
    private_dirs(path.parent)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        obj.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        make_private(tmp)  # what save_pretrained made under the umask
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def apply_adapter(model: Any, adapter_dir: str | Path) -> Any:
    """Fold a saved LoRA adapter into `model` (used to rebuild a round's model on resume)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
