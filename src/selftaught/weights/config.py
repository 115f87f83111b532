"""Configs for weight-space training, one dataclass per concern, validated on construction.

Defaults follow the papers where they say something (ReST-EM: fine-tune from the base model
each round, binary reward filter, a cap of samples per problem; GRPO: KL beta 0.04 because
without KL train reward rose while held-out accuracy fell) and what measured well on the
embedded SmolLM2-135M on 2 CPU cores otherwise."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from selftaught.choices import one_of
from selftaught.errors import ConfigError as ConfigError
from selftaught.gate import GateConfig
from selftaught.models.usage import Budget
from selftaught.stops import Stops

Backend = Literal["lora", "full", "scratch"]
BACKENDS = ("lora", "full", "scratch")
REST_METHODS: tuple[Literal["rest", "sft"], ...] = ("rest", "sft")
RL_METHODS: tuple[Literal["grpo", "gspo"], ...] = ("grpo", "gspo")
# preference training: pairs (DPO) or thumbs (KTO)
DPO_METHODS: tuple[Literal["dpo", "kto"], ...] = ("dpo", "kto")
METHODS: tuple[str, ...] = REST_METHODS + RL_METHODS + DPO_METHODS
DATASETS = ("round", "grow")  # ReST: each round's elite alone, or every round's so far
GAME_MIN_SCORE = 0.01  # default elite threshold on games: any playable strategy
# TRL 1.16's GRPOConfig.loss_type values (its default: dapo); tests check them against TRL
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
DEFAULT_LOSS_TYPE = "dapo"
REWARD_NAMES = ("correctness", "format", "judge")


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _check_report_to(value: str) -> None:
    from selftaught.tracking import REPORT_TO

    _check(value in REPORT_TO, f"report_to must be one of {', '.join(REPORT_TO)}, got {value!r}")


@dataclass
class BackendConfig:
    """Which weights change and how.

    Args:
        backend: `lora` (a peft adapter), `full` (every weight) or `scratch` (a small
            transformer from random init, for game strategies).
        lora_r / lora_alpha / lora_dropout: LoRA rank, scaling and dropout.
        target_modules: modules LoRA wraps; `"all-linear"` or a list of names.
        use_dora: DoRA (weight-decomposed LoRA) instead of plain LoRA.
        num_layers: train only the last N transformer layers (None: all of them).
        device: where training (and the in-process generation of the model being trained)
            runs: None for the best available (CUDA, else MPS, else CPU), or "cpu", "cuda",
            "cuda:1", "mps"; the dtype follows (`selftaught.models.device.resolve_device`).
        scratch_layers / scratch_width / scratch_heads: size of the from-scratch model;
            it uses the embedded model's tokenizer (vocabulary and chat template).
    """

    backend: Backend = "lora"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: str | list[str] = "all-linear"
    use_dora: bool = False
    num_layers: int | None = None
    device: str | None = None
    scratch_layers: int = 2
    scratch_width: int = 128
    scratch_heads: int = 4

    def __post_init__(self) -> None:
        _check(
            self.backend in BACKENDS,
            f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}",
        )
        _check(self.lora_r >= 1, f"lora_r must be >= 1, got {self.lora_r}")
        _check(self.lora_alpha >= 1, f"lora_alpha must be >= 1, got {self.lora_alpha}")
        _check(
            0.0 <= self.lora_dropout < 1.0,
            f"lora_dropout must be in [0, 1), got {self.lora_dropout}",
        )
        _check(
            self.num_layers is None or self.num_layers >= 1,
            f"num_layers must be >= 1 (or unset for all layers), got {self.num_layers}",
        )
        if isinstance(self.target_modules, str) and self.target_modules != "all-linear":
            self.target_modules = [m.strip() for m in self.target_modules.split(",") if m.strip()]
        _check(bool(self.target_modules), "target_modules must name at least one module")
        _check(self.scratch_layers >= 1, f"scratch_layers must be >= 1, got {self.scratch_layers}")
        _check(
            self.scratch_width >= 8 and self.scratch_width % self.scratch_heads == 0,
            f"scratch_width ({self.scratch_width}) must be >= 8 and divisible by scratch_heads "
            f"({self.scratch_heads})",
        )
        if self.backend != "lora":
            _check(
                not self.use_dora,
                f"use_dora (--dora) is a LoRA option; it does nothing with backend "
                f"{self.backend!r}",
            )


MICRO_BATCH_TOKENS = 512
"""On a CPU, most tokens (rows x the longest row) one forward/backward of a fine-tune holds: a
larger batch runs as micro-batches whose gradients accumulate into the same optimizer step
(the loss is weighted by tokens over the whole batch, so the step is the batch's). Measured on
SmolLM2-135M, a batch of 8 tool episodes of up to 483 tokens, LoRA r=16, 1 thread: whole,
13.2 GB peak RSS and 49.6 s a step; in micro-batches of 2,048 / 1,024 / 512 tokens, 7.9 / 4.5
/ 2.7 GB and 39.9 / 38.7 / 40.3 s, the same loss. On an accelerator the batch runs whole."""


@dataclass
class SFTTrainConfig:
    """One supervised fine-tune on (prompt, completion) pairs through TRL's SFTTrainer.

    Args:
        epochs: passes over the elite samples per round.
        learning_rate: None picks 2e-4 for LoRA, 2e-5 for full fine-tuning, 1e-3 from scratch.
        batch_size: per-step batch; the training set must hold at least one batch (on a
            CPU, long rows run it as micro-batches: `MICRO_BATCH_TOKENS`).
        grad_accum: gradient accumulation steps.
        max_length: prompt + completion tokens kept per sample.
        bf16: bfloat16 autocast over the float32 weights, forced on (`--bf16`) or off
            (`--no-bf16`); unset, decided per device (`training_autocast` in
            `selftaught.models.device`: on a CPU with AVX512-BF16 or AMX once measured
            as fast and as accurate there, else off).
        warmup_ratio / weight_decay: optimizer schedule details.
        max_steps: stop after this many optimizer steps (None: the epochs decide).
        packing: padding-free packing: each micro-batch's rows run as one row, position ids
            restarting per row (no padding; the same loss and steps); on a CPU a micro-batch
            then holds rows up to `MICRO_BATCH_TOKENS` in total. Refused for a model whose
            attention does not keep packed rows apart.

    Its wall-clock limit is the run's (`stops.max_minutes` of `RestConfig`, a night's weight
    cap): `sft_train(deadline=...)` stops after the optimizer step that crosses it.
    """

    epochs: float = 2.0
    learning_rate: float | None = None
    batch_size: int = 8
    grad_accum: int = 1
    max_length: int = 1024
    bf16: bool | None = None  # None: auto, per device (`training_autocast`)
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    max_steps: int | None = None
    # padding-free packing: a micro-batch's rows run as one row with position ids restarting
    # per row; the attention mask built from them keeps each row to itself (checked at start)
    packing: bool = False

    def __post_init__(self) -> None:
        _check(self.epochs > 0, f"epochs must be > 0, got {self.epochs}")
        _check(
            self.learning_rate is None or self.learning_rate > 0,
            f"learning rate (--lr) must be > 0, got {self.learning_rate}",
        )
        _check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        _check(self.grad_accum >= 1, f"grad_accum must be >= 1, got {self.grad_accum}")
        _check(self.max_length >= 16, f"max_length must be >= 16, got {self.max_length}")
        _check(
            self.max_steps is None or self.max_steps >= 1,
            f"max_steps must be >= 1 (or unset), got {self.max_steps}",
        )

    def lr_for(self, backend: str) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        return {"lora": 2e-4, "full": 2e-5, "scratch": 1e-3}[backend]


@dataclass
class RestConfig:
    """Expert iteration / ReST-EM: sample k per train prompt → score → keep the elite →
    fine-tune → evaluate on val; ship the best round on val (the base model is round 0).

    Args:
        method: `rest` (ReST-EM: sample, keep the elite, fine-tune) or `sft` (one fine-tune
            on the task's reference answers); the config's type and method pick the trainer.
        rounds: improvement rounds; None: 3 for `rest`, 1 for `sft` (which must be 1).
        samples_per_prompt: k completions sampled per train prompt.
        temperature / top_p: sampling settings (temperature must be > 0: k greedy samples
            would be k copies).
        max_tokens: completion cap for sampling and evaluation; truncated replies are
            counted and reported, never silently scored.
        min_score: keep samples scoring at least this (soft score). None: 1.0 for agent tasks
            (solved only, as in ReST-EM), 0.01 for games (any strategy that scored at all).
        elite_fraction: keep the top fraction of each prompt's samples (after the threshold).
            None: 1.0 for agent tasks, 0.25 for games.
        max_per_prompt: cap of kept samples per prompt (ReST-EM caps to avoid easy prompts
            dominating); duplicates are always dropped first.
        keep_truncated: also train on replies cut by max_tokens (off: a cut reply that
            happens to score teaches rambling).
        continue_training: fine-tune the previous round's model instead of the base model.
        dataset: what each round fine-tunes on: `round` (that round's elite, ReST-EM) or
            `grow` (ReST's growing dataset: the elite of every round so far, the same
            reply to the same prompt once, so a round that solves little still trains on
            what earlier rounds found); either way the gate picks the round that ships.
        teacher_skill: a skill document put in the system prompt while sampling only, so the
            trained weights absorb what the skill taught (skill distillation).
        teacher_model: a model spec (an API model, `local:PATH`, any `ChatModel` spec) whose
            replies to the train prompts become the student's fine-tuning data (model
            distillation): each round samples the teacher instead of the student, and its
            samples the task passes (the elite filter) train the student on the student's
            prompt; with `sft`, its passing replies instead of the references. Train prompts
            only; each round is gated on val as any round. The teacher's calls count as role
            `teacher`.
        eval_test_each_round: also score each round on test (for benchmarks; the gate still
            uses val only).
        gate: how a round becomes the best (shipped) one, from per-example val scores: the
            one gate `optimize` uses (margin / paired test; see `selftaught.gate`). None: the
            default gate on the task's metric (hard for agent tasks, soft for games).
        gen_batch_size: sequences decoded together by the in-process model.
        budget: most calls / tokens the run's sampling and val evaluations may spend;
            hitting it ends the run cleanly with the best round so far (test evaluations
            are outside it).
        sampler_url: sample and evaluate every round on this vLLM server instead of in process
            (started by `selftaught vllm-up`: `--enable-lora`,
            VLLM_ALLOW_RUNTIME_LORA_UPDATING=True): each round's LoRA adapter is loaded into
            it by name (`/v1/load_lora_adapter`), checked to be the one it serves under that
            name, and unloaded once no later round needs it. Needs the lora backend,
            fine-tuning from the base each round.
        sampler_base_model: the name the server gives the base model (round 0).
        seed: sampling and training seed.
        report_to: send TRL's training logs to `trackio`, `mlflow` or `wandb` (`none`: off;
            see `selftaught.tracking`).
        stops: `max_minutes` (this invocation's wall-clock limit: a round's fine-tune stops
            after the optimizer step that crosses it, the round is gated, the run ends) and
            `patience` (rounds in a row the gate accepted nothing); re-running resumes.
    """

    method: Literal["rest", "sft"] = "rest"
    rounds: int | None = None
    samples_per_prompt: int = 4
    temperature: float = 0.8
    top_p: float = 1.0
    max_tokens: int = 64
    min_score: float | None = None
    elite_fraction: float | None = None
    max_per_prompt: int = 2
    keep_truncated: bool = False
    continue_training: bool = False
    dataset: Literal["round", "grow"] = "round"
    teacher_skill: str | None = None
    teacher_model: str | None = None
    eval_test_each_round: bool = False
    gate: GateConfig | None = None
    gen_batch_size: int = 32
    budget: Budget = field(default_factory=Budget)
    sampler_url: str | None = None
    sampler_base_model: str = "base"
    seed: int = 0
    sft: SFTTrainConfig = field(default_factory=SFTTrainConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    report_to: str = "none"
    # --- stops: wall clock and patience (issue 51, `selftaught.stops`) -------------------
    stops: Stops = field(default_factory=Stops)

    def __post_init__(self) -> None:
        _check(
            self.method in REST_METHODS,
            f"RestConfig runs method rest or sft, got {self.method!r} (grpo and gspo take an "
            "RLConfig)",
        )
        _check_report_to(self.report_to)
        if self.rounds is None:
            self.rounds = 1 if self.method == "sft" else 3
        _check(self.rounds >= 1, f"rounds must be >= 1, got {self.rounds}")
        _check(
            self.method != "sft" or self.rounds == 1,
            "method 'sft' is a single fine-tune; --rounds must be 1",
        )
        _check(
            self.samples_per_prompt >= 1,
            f"samples_per_prompt must be >= 1, got {self.samples_per_prompt}",
        )
        _check(
            self.temperature > 0,
            f"temperature must be > 0 for sampling (k greedy samples are k copies), "
            f"got {self.temperature}",
        )
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}")
        _check(
            self.min_score is None or 0.0 <= self.min_score <= 1.0,
            f"min_score must be in [0, 1], got {self.min_score}",
        )
        _check(
            self.elite_fraction is None or 0.0 < self.elite_fraction <= 1.0,
            f"elite_fraction must be in (0, 1], got {self.elite_fraction}",
        )
        _check(self.max_per_prompt >= 1, f"max_per_prompt must be >= 1, got {self.max_per_prompt}")
        _check(
            self.dataset in DATASETS,
            f"dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}",
        )
        _check(
            self.dataset == "round" or self.method == "rest",
            "dataset 'grow' keeps the elite of every sampling round: it needs --method rest",
        )
        _check(self.gen_batch_size >= 1, f"gen_batch_size must be >= 1, got {self.gen_batch_size}")
        _check(
            self.teacher_model is None or self.sampler_url is None,
            "teacher_model samples the teacher, never the student: sampler_url (--sampler-url, "
            "the student's rounds on vLLM) is not offered with it",
        )
        if self.sampler_url is not None:
            _check(
                self.backend.backend == "lora" and not self.continue_training,
                "sampler_url (--sampler-url) serves each round as a LoRA adapter over the base "
                "model: it needs --backend lora without --continue-training",
            )

    def resolved_filter(self, task_kind: str) -> tuple[float | None, float]:
        """(min_score, elite_fraction) with the per-kind defaults filled in."""
        if task_kind == "game":
            # a zero is an invalid or unplayable strategy: never worth imitating
            min_score = GAME_MIN_SCORE if self.min_score is None else self.min_score
            return min_score, self.elite_fraction if self.elite_fraction is not None else 0.25
        min_score = 1.0 if self.min_score is None else self.min_score
        return min_score, self.elite_fraction if self.elite_fraction is not None else 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RLConfig:
    """Online RL with verifiable rewards through TRL's GRPOTrainer; the task's scorer is the
    reward. `gspo` is GRPO with sequence-level importance sampling (GSPO).

    Args:
        method: `grpo` or `gspo`.
        steps: optimizer steps.
        beta: KL coefficient against the starting model (0.04: without KL, held-out accuracy
            fell while train reward rose).
        num_generations: completions per prompt (the group); needs >= 2 for any signal.
        prompts_per_step: prompts per step; batch = prompts_per_step * num_generations.
        max_completion_length: completion token cap (truncation is logged and warned about).
        temperature: sampling temperature of the groups.
        learning_rate: None picks 5e-5 for LoRA, 1e-6 for full fine-tuning.
        reward: `soft` (partial credit) or `hard` (0/1) score as the correctness reward (and
            the judge reward: its score / 10, or 1 at 7/10 and above).
        rewards: the reward functions TRL sums, by name, with their weights (TRL's
            `reward_weights`): `correctness` (the task's scorer), `format` (1 when the reply
            ended on its own, holds text and, for a game, a JSON strategy valid against the
            task's schema; else 0), `judge` (an LLM judge's score of the reply; needs a judge
            model). Weights are finite and >= 0, at least one > 0; a weight-0 reward is
            computed and logged, not trained on. Default: correctness alone, weight 1.
        loss_type: TRL's loss formulation: grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo (GSPO
            only) or vespo (GRPO only); the default is TRL 1.16's own.
        truncation_warn: warn when more than this share of a step's completions is truncated.
        eval_max_tokens: token cap of the greedy val / test evaluations.
        gate: whether the trained model is shipped instead of the start model, from
            per-example val scores (see RestConfig.gate; None: the task's default gate).
        vllm_mode: generate the groups with vLLM through TRL's own integration (needs `vllm`
            and a GPU): `server` sends them to a vLLM server at `vllm_server_url`, which
            the trainer pushes its weights into after each step (start it with `selftaught
            vllm-up --for grpo`); `colocate` runs vLLM inside the training process, sharing
            its GPU. Unset: `server` when `vllm_server_url` is given, else no vLLM.
        vllm_server_url: the vLLM server of TRL's server mode (e.g. http://127.0.0.1:8000).
        vllm_gpu_memory_utilization: the share of the GPU's memory vLLM takes in `colocate`
            mode (TRL's default; the training takes the rest).
        budget: most completions (`calls`) / completion tokens the training may sample; when
            a step ends past it, training stops there and the gate decides on what was
            learned (val and test evaluations are outside it).
        seed: training seed.
        report_to: send TRL's training logs to `trackio`, `mlflow` or `wandb` (`none`: off;
            see `selftaught.tracking`).
        stops: `max_minutes` (training stops after the optimizer step that crosses it; the
            gate decides on what was learned). No `patience`: GRPO gates once, at the end.
    """

    method: Literal["grpo", "gspo"] = "grpo"
    steps: int = 20
    beta: float = 0.04
    num_generations: int = 4
    prompts_per_step: int = 2
    max_completion_length: int = 64
    temperature: float = 1.0
    learning_rate: float | None = None
    reward: Literal["soft", "hard"] = "soft"
    rewards: dict[str, float] = field(default_factory=lambda: {"correctness": 1.0})
    loss_type: str = DEFAULT_LOSS_TYPE
    truncation_warn: float = 0.5
    eval_max_tokens: int = 64
    gate: GateConfig | None = None
    vllm_mode: Literal["server", "colocate"] | None = None
    vllm_server_url: str | None = None
    vllm_gpu_memory_utilization: float = 0.3
    budget: Budget = field(default_factory=Budget)
    seed: int = 0
    backend: BackendConfig = field(default_factory=BackendConfig)
    report_to: str = "none"
    # --- stops: wall clock (issue 51, `selftaught.stops`) --------------------------------
    stops: Stops = field(default_factory=Stops)

    def __post_init__(self) -> None:
        _check(
            self.method in RL_METHODS,
            f"RLConfig runs method grpo or gspo, got {self.method!r} (rest and sft take a "
            "RestConfig)",
        )
        _check_report_to(self.report_to)
        _check(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        _check(self.beta >= 0, f"beta must be >= 0, got {self.beta}")
        _check(
            self.num_generations >= 2,
            f"num_generations must be >= 2 (a group of one has no reward variance), "
            f"got {self.num_generations}",
        )
        _check(
            self.prompts_per_step >= 1,
            f"prompts_per_step must be >= 1, got {self.prompts_per_step}",
        )
        _check(
            self.max_completion_length >= 1,
            f"max_completion_length must be >= 1, got {self.max_completion_length}",
        )
        _check(self.temperature > 0, f"temperature must be > 0, got {self.temperature}")
        _check(self.reward in ("soft", "hard"), f"reward must be soft or hard, got {self.reward!r}")
        self.rewards = check_rewards(self.rewards)
        self._check_loss_type()
        self._check_vllm()
        _check(
            self.learning_rate is None or self.learning_rate > 0,
            f"learning rate (--lr) must be > 0, got {self.learning_rate}",
        )
        _check(
            self.stops.patience is None,
            f"--patience counts rounds the gate accepted nothing in; --method {self.method} "
            "gates once, after training (use --max-minutes, or --method rest)",
        )
        _check(
            self.backend.backend != "scratch",
            "backend 'scratch' is for ReST on games: a random-init model has no reward signal "
            "for GRPO/GSPO; use --backend lora or full",
        )

    def _check_loss_type(self) -> None:
        _check(
            self.loss_type in LOSS_TYPES,
            f"loss_type must be one of {', '.join(LOSS_TYPES)} (TRL's), got {self.loss_type!r}",
        )
        # TRL only warns about these; the loss is then not the one its paper defines
        _check(
            self.loss_type != "luspo" or self.method == "gspo",
            "loss_type luspo is a sequence-level loss: it needs --method gspo",
        )
        _check(
            self.loss_type != "vespo" or self.method == "grpo",
            "loss_type vespo weighs sequences itself: it needs --method grpo (token-level "
            "importance sampling)",
        )

    def _check_vllm(self) -> None:
        _check(
            self.vllm_mode in (None, "server", "colocate"),
            f"vllm_mode must be server or colocate (or unset), got {self.vllm_mode!r}",
        )
        _check(
            self.vllm_mode != "server" or bool(self.vllm_server_url),
            "--vllm-mode server needs the server's URL: --vllm-server http://HOST:PORT",
        )
        _check(
            self.vllm_mode != "colocate" or not self.vllm_server_url,
            "--vllm-mode colocate runs vLLM inside the training process: drop --vllm-server",
        )
        _check(
            0 < self.vllm_gpu_memory_utilization <= 1,
            "vllm_gpu_memory_utilization must be in (0, 1], got "
            f"{self.vllm_gpu_memory_utilization}",
        )

    @property
    def vllm(self) -> str | None:
        """How TRL generates with vLLM: `server`, `colocate`, or None (no vLLM)."""
        return self.vllm_mode or ("server" if self.vllm_server_url else None)

    @property
    def importance_sampling_level(self) -> str:
        return "sequence" if self.method == "gspo" else "token"

    def lr(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        return 5e-5 if self.backend.backend == "lora" else 1e-6

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_rewards(rewards: Mapping[str, Any]) -> dict[str, float]:
    """The rewards by name with float weights, or ConfigError naming the problem."""
    _check(
        isinstance(rewards, Mapping) and bool(rewards),
        f"rewards must name at least one of {', '.join(REWARD_NAMES)} with a weight, "
        f"got {rewards!r}",
    )
    out: dict[str, float] = {}
    for name, weight in rewards.items():
        _check(
            name in REWARD_NAMES,
            f"unknown reward {name!r}; valid rewards: {', '.join(REWARD_NAMES)}",
        )
        number = isinstance(weight, int | float) and not isinstance(weight, bool)
        _check(
            number and math.isfinite(weight) and weight >= 0,
            f"reward {name!r}: the weight must be a finite number >= 0, got {weight!r}",
        )
        out[name] = float(weight)
    _check(
        any(w > 0 for w in out.values()),
        "at least one reward needs a weight > 0 (a weight-0 reward is only logged)",
    )
    return out


def parse_rewards(items: Iterable[str]) -> dict[str, float]:
    """`["correctness=1", "format=0.2"]` (the repeatable `--reward NAME=WEIGHT`) as the
    `rewards` mapping; ConfigError on a malformed or repeated item."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        _check(
            bool(sep and name and text.strip()),
            f"--reward takes NAME=WEIGHT (e.g. --reward format=0.2), got {item!r}",
        )
        try:
            weight = float(text)
        except ValueError:
            raise ConfigError(
                f"--reward {item!r}: the weight {text.strip()!r} is not a number"
            ) from None
        _check(name not in out, f"--reward {name} is given twice")
        out[name] = weight
    return check_rewards(out)


def task_gate(gate: GateConfig | None, task_kind: str) -> GateConfig:
    """The gate a weight-space run uses: the configured one, else the default gate on the
    task's natural metric (a game's hard score is a rare outright win; soft is its score)."""
    if gate is not None:
        return gate
    return GateConfig(metric="soft") if task_kind == "game" else GateConfig()


def default_train_config(method: str) -> RestConfig | RLConfig | DPOConfig:
    """Each method's own defaults: ReST-EM 3 rounds, SFT one round, GRPO / GSPO, DPO."""
    if (dpo := one_of(method, DPO_METHODS)) is not None:
        return DPOConfig(method=dpo)
    if (rl := one_of(method, RL_METHODS)) is not None:
        return RLConfig(method=rl)
    if (rest := one_of(method, REST_METHODS)) is not None:
        return RestConfig(method=rest)
    raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {method!r}")


def default_train_dir(config: RestConfig | RLConfig | DPOConfig, task_name: str) -> Path:
    """Deterministic, so running the same command again resumes the run:
    runs/train-<method>-<task>-<backend>-s<seed>."""
    from selftaught.runs import slug

    name = f"train-{config.method}-{task_name}-{config.backend.backend}-s{config.seed}"
    return Path("runs") / slug(name)


def resume_settings(config: RestConfig | RLConfig | DPOConfig) -> dict[str, Any]:
    """The settings a resumed run must share with the run it continues: all but the method
    (recorded apart), where logs are reported and the stops (each invocation has its own time
    limit; patience's count is in the run's state)."""
    skip = ("method", "report_to", "stops")
    return {k: v for k, v in config.to_dict().items() if k not in skip}


# ---- DPO: preference training as a trainer of its own (issue 50) ------------------------------

DPO_LEARNING_RATE = 5e-5
"""DPO's learning rate when `DPOConfig.train.learning_rate` is unset (what `dpo_train` used)."""


@dataclass
class DPOConfig:
    """Direct preference optimization on (prompt, chosen, rejected) pairs through TRL's
    DPOTrainer, on a LoRA adapter (the reference policy is the model with its adapter
    disabled, so no second copy of the weights is held). One round: the base model is round 0,
    the adapter round 1; the gate on val decides which ships. The pairs are the trainer's data
    (`DPOTrainer(preferences=...)`, `--preferences FILE.jsonl`), not a setting.

    `method="kto"` is KTO (TRL's KTOTrainer) on replies judged one by one, a thumb up or down
    and no pair needed (`{"prompt", "completion", "label"}` lines; a pair counts as its chosen
    reply up and its rejected one down); everything else is DPO's.

    Args:
        method: `dpo` (pairs) or `kto` (thumbs); the config's type picks the trainer.
        beta: DPO's (KTO's) temperature on the log-ratio of policy to reference (TRL's
            default): higher keeps the adapter closer to the base model.
        desirable_weight / undesirable_weight: KTO's weights on the thumbs-up and the
            thumbs-down losses (to balance unequal counts; TRL's defaults, 1).
        max_tokens: completion cap of the val / test evaluations; truncated replies are
            counted and reported, never silently scored.
        gate: how the trained adapter becomes the shipped model, from per-example val scores:
            the one gate `optimize` uses. None: the default gate on the task's metric.
        gen_batch_size: sequences decoded together by the in-process model when evaluating.
        budget: most calls / tokens the val evaluations may spend (test is outside it).
        seed: training seed.
        train: the fine-tune's schedule (`SFTTrainConfig`: epochs, batch size, length, caps);
            its learning_rate, when set, is DPO's, else 5e-5.
        backend: the LoRA adapter (`BackendConfig`; DPO takes the lora backend only).
        report_to: send TRL's training logs to `trackio`, `mlflow` or `wandb` (`none`: off;
            see `selftaught.tracking`).
        stops: `max_minutes` (the fine-tune stops after the optimizer step that crosses it;
            the gate decides on what was learned). One round, so no patience.
    """

    method: Literal["dpo", "kto"] = "dpo"
    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    max_tokens: int = 64
    gate: GateConfig | None = None
    gen_batch_size: int = 32
    budget: Budget = field(default_factory=Budget)
    seed: int = 0
    train: SFTTrainConfig = field(default_factory=SFTTrainConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    report_to: str = "none"
    stops: Stops = field(default_factory=Stops)

    def __post_init__(self) -> None:
        _check(
            self.stops.patience is None,
            "DPO trains one round: --patience has nothing to count (use --max-minutes)",
        )
        _check(
            self.method in DPO_METHODS,
            f"DPOConfig runs method dpo or kto, got {self.method!r} (rest and sft take a "
            "RestConfig, grpo and gspo an RLConfig)",
        )
        for name in ("desirable_weight", "undesirable_weight"):
            weight = getattr(self, name)
            _check(math.isfinite(weight) and weight > 0, f"{name} must be > 0, got {weight}")
            _check(
                self.method == "kto" or weight == 1.0,
                f"{name} weighs KTO's thumbs; --method dpo trains on pairs: use --method kto",
            )
        _check(
            self.method != "kto" or self.train.batch_size >= 2,
            "KTO's KL term compares replies within a batch: --batch-size must be >= 2",
        )
        _check_report_to(self.report_to)
        _check(
            math.isfinite(self.beta) and self.beta > 0,
            f"beta (--dpo-beta) must be a finite number > 0, got {self.beta}",
        )
        _check(self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}")
        _check(self.gen_batch_size >= 1, f"gen_batch_size must be >= 1, got {self.gen_batch_size}")
        _check(
            self.backend.backend == "lora",
            f"DPO trains a LoRA adapter (its reference is the model with the adapter disabled); "
            f"backend {self.backend.backend!r} is not offered: use --backend lora",
        )

    def lr(self) -> float:
        """The learning rate: `train.learning_rate`, else DPO's 5e-5."""
        rate = self.train.learning_rate
        return DPO_LEARNING_RATE if rate is None else rate

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
