"""`train`: weight-space self-improvement of a local model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import typer

from selftaught.cli.common import (
    BUDGET_FLAGS,
    GATE_FLAGS,
    SIZED_TASK_FLAGS,
    STOP_FLAGS,
    DeviceOpt,
    ModelOpt,
    TaskOpt,
    ValSizeOpt,
    app,
    budget,
    console,
    friendly_errors,
    gate_config,
    out,
    read_text_file,
    resolve_val_size,
    warn_unsafe_exec,
)
from selftaught.cli.options import EffectiveConfig, config_file, config_flags, field_help
from selftaught.errors import ConfigError

# Light config modules (no torch): CLI defaults are read from them, so they live in one place.
from selftaught.gate import GateConfig
from selftaught.models.usage import Budget
from selftaught.stops import Stops
from selftaught.tasks.options import TaskOptions
from selftaught.tasks.registry import takes_judge
from selftaught.weights.config import (
    DPO_METHODS,
    METHODS,
    RL_METHODS,
    BackendConfig,
    DPOConfig,
    RestConfig,
    RLConfig,
    SFTTrainConfig,
    parse_rewards,
)

if TYPE_CHECKING:
    from selftaught.weights.dpo import DPOResult
    from selftaught.weights.rest import RestResult
    from selftaught.weights.rl import RLResult

# ---- train (weight space) -------------------------------------------------------------


# Options that only make sense for one family of methods (CLI flag names, as users type them).
SFT_ONLY_OPTIONS = (
    "--rounds",
    "--samples-per-prompt",
    "--elite-fraction",
    "--min-score",
    "--max-per-prompt",
    "--continue-training",
    "--dataset",
    "--epochs",
    "--batch-size",
    "--bf16",
    "--teacher-skill",
    "--teacher-model",
    "--sampler-url",
    "--sampler-base-model",
)
RL_ONLY_OPTIONS = (
    "--beta",
    "--num-generations",
    "--max-completion-length",
    "--steps",
    "--vllm-server",
    "--vllm-mode",
    "--vllm-gpu-memory",
    "--loss-type",
    "--reward",
)
SAMPLING_OPTIONS = (
    "--samples-per-prompt",
    "--dataset",
    "--elite-fraction",
    "--min-score",
    "--max-per-prompt",
    "--temperature",
    "--teacher-skill",
    "--sampler-url",
    "--sampler-base-model",
)


# DPO trains on a preference file: no sampling, no rounds, no rewards
DPO_ONLY_OPTIONS = ("--dpo-beta", "--preferences", "--desirable-weight", "--undesirable-weight")
NOT_DPO_OPTIONS = (
    *RL_ONLY_OPTIONS,
    *SAMPLING_OPTIONS,
    "--rounds",
    "--continue-training",
    "--teacher-model",
)


def check_method_options(method: str, given: set[str]) -> None:
    """Refuse options the chosen method would silently ignore, naming them and the methods
    that use them. `given` holds the flags the user actually set."""
    if method not in METHODS:
        raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if method in DPO_METHODS:
        bad = sorted(given & set(NOT_DPO_OPTIONS))
        if bad:
            raise ConfigError(
                f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not for --method {method}, "
                "which trains one adapter on --preferences (use --dpo-beta, --epochs, "
                "--batch-size, --lr)"
            )
        return
    bad = sorted(given & set(DPO_ONLY_OPTIONS))
    if bad:
        raise ConfigError(
            f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} for --method dpo or kto "
            f"(preference pairs); --method {method} does not read them"
        )
    if method in ("grpo", "gspo"):
        bad = sorted(given & set(SFT_ONLY_OPTIONS))
        if bad:
            raise ConfigError(
                f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} for methods that train on "
                f"SFT samples (rest, sft); --method {method} learns online from rewards "
                "(use --steps, --beta, --num-generations, --max-completion-length)"
            )
        return
    bad = sorted(given & set(RL_ONLY_OPTIONS))
    if bad:
        raise ConfigError(
            f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} for online RL (grpo, gspo); "
            f"--method {method} fine-tunes on samples (use --rounds, --epochs, --batch-size)"
        )
    if method == "sft" and "--teacher-model" not in given:  # with one, sft samples it
        bad = sorted(given & set(SAMPLING_OPTIONS))
        if bad:
            raise ConfigError(
                f"{', '.join(bad)} {'is' if len(bad) == 1 else 'are'} for sampling (--method "
                "rest, or sft with --teacher-model); --method sft trains on the task's "
                "reference answers"
            )


# Config fields offered as flags (help and default: the field): field name -> option name
# the gate left unset is the task's own (soft for games); a train budget counts calls, tokens
TASK_GATE = {"metric": None, "confidence": None}
TRAIN_BUDGET_FLAGS = {k: BUDGET_FLAGS[k] for k in ("calls", "tokens")}
BACKEND_FLAGS = {
    "backend": "backend",
    "lora_r": "lora_r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "target_modules": "target_modules",
    "use_dora": "dora",
    "num_layers": "num_layers",
    "scratch_layers": "scratch_layers",
    "scratch_width": "scratch_width",
}
REST_FLAGS: dict[str, str | tuple[str, ...]] = {
    "samples_per_prompt": ("samples_per_prompt", "-k"),
    "rounds": "rounds",
    "elite_fraction": "elite_fraction",
    "min_score": "min_score",
    "max_per_prompt": "max_per_prompt",
    "continue_training": "continue_training",
    "dataset": "dataset",
    "teacher_model": "teacher_model",  # model distillation: the teacher's passing replies
    "sampler_url": "sampler_url",
    "sampler_base_model": "sampler_base_model",
    "max_tokens": "max_tokens",
    "report_to": "report_to",
}
SFT_FLAGS = {
    "epochs": "epochs",
    "batch_size": "batch_size",
    "bf16": "bf16",
    "packing": "packing",
}
RL_FLAGS = {
    "beta": "beta",
    "num_generations": "num_generations",
    "max_completion_length": "max_completion_length",
    "steps": "steps",
    "vllm_mode": "vllm_mode",
    "vllm_server_url": "vllm_server",
    "vllm_gpu_memory_utilization": "vllm_gpu_memory",
    "loss_type": "loss_type",
}
DPO_FLAGS = {
    "beta": "dpo_beta",
    "desirable_weight": "desirable_weight",  # KTO's weights on the thumbs up and down
    "undesirable_weight": "undesirable_weight",
}
PREFERENCES_HELP = (
    "Preference JSONL file for --method dpo: one {prompt, chosen, rejected[, id]} object a line "
    "(prompt: a string or chat messages); for --method kto also {prompt, completion, label} "
    "lines, a reply judged on its own (label true: a thumb up, false: down)."
)
REWARD_HELP = (
    "A GRPO / GSPO reward as NAME=WEIGHT, repeatable (e.g. --reward correctness=1 --reward "
    "format=0.2); the list replaces the default, so name correctness to keep it. "
    + field_help(RLConfig, "rewards")
)


MethodOpt = Annotated[
    str,
    typer.Option(
        help="rest (ReST-EM) | sft (on references) | grpo | gspo | dpo (on --preferences) | "
        "kto (on thumbs in --preferences)"
    ),
]
OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output", "-o", help="Run directory (default: runs/train-...; the same command resumes)."
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        help="torch CPU threads (default: the free cores, or $SELFTAUGHT_THREADS; "
        "fewer is faster on a busy machine)."
    ),
]


def _params(flags: Mapping[str, str | tuple[str, ...]]) -> tuple[str, ...]:
    """A flags table's parameter names."""
    return tuple(v if isinstance(v, str) else v[0] for v in flags.values())


REST_SHARED = ("max_tokens", "report_to")  # GRPO and DPO read them too
# --help by method; what every method reads stays in the first panel (Options)
TRAIN_PANELS = {
    "ReST / SFT": (*(p for p in _params(REST_FLAGS) if p not in REST_SHARED), "teacher_skill"),
    "GRPO / GSPO": (*RL_FLAGS.values(), "reward"),
    "DPO / KTO": (*DPO_FLAGS.values(), "preferences"),
    "Fine-tune (ReST, SFT, DPO, KTO)": (*SFT_FLAGS.values(), "lr"),
    "Model and adapter": (*BACKEND_FLAGS.values(), "device", "threads"),
    "Gate, budget and stops": (*GATE_FLAGS.values(), *TRAIN_BUDGET_FLAGS.values(), *STOP_FLAGS),
    "Task": (*SIZED_TASK_FLAGS, "val_size"),
}


@app.command()
@friendly_errors
@config_file(keys={"val_size": "task_options.val_size"}, panels=TRAIN_PANELS, into="run_config")
@config_flags(BackendConfig, BACKEND_FLAGS, into="backend_fields", section="backend")
@config_flags(RestConfig, REST_FLAGS, into="rest_fields", section="rest")
@config_flags(SFTTrainConfig, SFT_FLAGS, into="sft_fields", section="sft")
@config_flags(RLConfig, RL_FLAGS, into="rl_fields", section="rl")
@config_flags(DPOConfig, DPO_FLAGS, into="dpo_fields", section="dpo")
@config_flags(GateConfig, GATE_FLAGS, into="gate_fields", defaults=TASK_GATE, section="gate")
@config_flags(Budget, TRAIN_BUDGET_FLAGS, into="budget_fields", section="budget")
@config_flags(Stops, STOP_FLAGS, into="stop_fields", section="stops")
@config_flags(TaskOptions, SIZED_TASK_FLAGS, into="task_fields", section="task_options")
def train(
    ctx: typer.Context,
    task: TaskOpt,
    backend_fields: dict[str, Any],
    rest_fields: dict[str, Any],
    sft_fields: dict[str, Any],
    rl_fields: dict[str, Any],
    dpo_fields: dict[str, Any],
    gate_fields: dict[str, Any],
    budget_fields: dict[str, Any],
    stop_fields: dict[str, Any],
    task_fields: dict[str, Any],
    run_config: EffectiveConfig,
    method: MethodOpt = RestConfig.method,
    model: ModelOpt = "local",
    temperature: Annotated[
        float | None,
        typer.Option(
            help=f"Sampling temperature (rest {RestConfig.temperature}, grpo/gspo "
            f"{RLConfig.temperature})."
        ),
    ] = None,
    lr: Annotated[
        float | None, typer.Option("--lr", help="Learning rate (default per backend and method).")
    ] = None,
    reward: Annotated[
        list[str] | None, typer.Option("--reward", help=REWARD_HELP, metavar="<str>")
    ] = None,
    teacher_skill: Annotated[
        Path | None,
        typer.Option(help="Skill file in the system prompt while sampling only (distillation)."),
    ] = None,
    preferences: Annotated[Path | None, typer.Option(help=PREFERENCES_HELP)] = None,
    val_size: ValSizeOpt = None,
    device: DeviceOpt = None,
    threads: ThreadsOpt = None,
    output: OutputOpt = None,
    quiet: Annotated[bool, typer.Option(help="No progress bars.")] = False,
) -> None:
    """Train the weights of a local model on a task: ReST-EM / SFT / GRPO / GSPO / DPO."""
    from selftaught.api import train as run_training

    check_method_options(method, given_options(ctx))
    set_threads(threads)
    gate, spend = train_gate(**gate_fields), budget(**budget_fields)
    sized = resolve_val_size(val_size, gate or GateConfig(), spend)
    options = checked_task_options({**task_fields, "val_size": sized})
    shared = {
        "seed": options.seed,
        "gate": gate,
        "budget": spend,
        "stops": Stops(**stop_fields),
        "backend": BackendConfig(**backend_fields, device=device),
    }
    config: RestConfig | RLConfig | DPOConfig
    judge: str | None = None
    if method in DPO_METHODS:
        config = dpo_config(method, dpo_fields, rest_fields, sft_fields, lr, shared)
    elif method in RL_METHODS:
        rl_fields = {**rl_fields, "rewards": parse_rewards(reward) if reward else None}
        config = rl_config(method, rl_fields, rest_fields, temperature, lr, shared)
        judge, options = reward_judge(task, options, config)
    else:
        teacher = read_text_file(teacher_skill, "teacher skill") or None
        config = rest_config(method, rest_fields, sft_fields, temperature, lr, teacher, shared)
    result = run_training(
        task,
        model,
        method=method,
        config=config,
        output_dir=output,
        task_options=options,
        judge_model=judge,
        preferences=preferences if method in DPO_METHODS else None,
        progress=not quiet,
        console=console,
    )
    if result.run_dir is not None:
        run_config.keep(result.run_dir)
    print_train(result)


def checked_task_options(task_fields: dict[str, Any]) -> TaskOptions:
    """The task options, with a loud warning when they turn the sandbox off."""
    options = TaskOptions(**task_fields)
    warn_unsafe_exec(options.unsafe_exec)
    return options


def set_threads(threads: int | None) -> None:
    """`--threads N` means what SELFTAUGHT_THREADS=N means (`selftaught.models.threads`)."""
    from selftaught.models.threads import fix_threads

    if threads:
        fix_threads(threads)


def train_gate(
    metric: str | None, margin: float, confidence: float | None, **tag_veto: float | None
) -> GateConfig | None:
    """The gate the user set, or None for the task's own default (soft for games). Any gate
    option, `--min-gain` too, without `--gate-metric` means the hard metric."""
    gate = gate_config(metric, margin, confidence, **tag_veto)
    return None if metric is None and gate == GateConfig() else gate


def rest_config(
    method: str,
    rest_fields: dict[str, Any],
    sft_fields: dict[str, Any],
    temperature: float | None,
    lr: float | None,
    teacher_skill: str | None,
    shared: dict[str, Any],
) -> RestConfig:
    """ReST-EM / SFT settings: the generated flags plus the ones shared with GRPO."""
    return RestConfig(
        method=cast(Literal["rest", "sft"], method),  # the CLI checked it
        **rest_fields,
        temperature=RestConfig.temperature if temperature is None else temperature,
        teacher_skill=teacher_skill,
        sft=SFTTrainConfig(**sft_fields, learning_rate=lr),
        **shared,
    )


def rl_config(
    method: str,
    rl_fields: dict[str, Any],
    rest_fields: dict[str, Any],
    temperature: float | None,
    lr: float | None,
    shared: dict[str, Any],
) -> RLConfig:
    """GRPO / GSPO settings; `--max-tokens` and `--report-to` are shared with ReST; unset
    `rewards` are the config's default."""
    rewards = rl_fields.get("rewards")
    fields = {k: v for k, v in rl_fields.items() if k != "rewards"}
    return RLConfig(
        method=cast(Literal["grpo", "gspo"], method),  # the CLI checked it
        **fields,
        **({"rewards": rewards} if rewards is not None else {}),
        temperature=RLConfig.temperature if temperature is None else temperature,
        learning_rate=lr,
        eval_max_tokens=rest_fields["max_tokens"],
        report_to=rest_fields["report_to"],
        **shared,
    )


def dpo_config(
    method: str,
    dpo_fields: dict[str, Any],
    rest_fields: dict[str, Any],
    sft_fields: dict[str, Any],
    lr: float | None,
    shared: dict[str, Any],
) -> DPOConfig:
    """DPO settings: `--dpo-beta`, the fine-tune's `--epochs/--batch-size/--lr`, and
    `--max-tokens` / `--report-to` shared with ReST."""
    return DPOConfig(
        method=cast(Literal["dpo", "kto"], method),  # the CLI checked it
        **dpo_fields,
        max_tokens=rest_fields["max_tokens"],
        report_to=rest_fields["report_to"],
        train=SFTTrainConfig(**sft_fields, learning_rate=lr),
        **shared,
    )


def reward_judge(
    task: str, options: TaskOptions, config: RLConfig
) -> tuple[str | None, TaskOptions]:
    """With the judge reward named, `--judge-model` scores it; the task keeps the flag only
    where its source takes a judge (JSONL files, plugins), as without the judge reward."""
    if "judge" not in config.rewards or options.judge_model is None:
        return None, options  # the trainer says that the judge reward needs a judge model
    judge = str(options.judge_model)
    return judge, options if takes_judge(task) else replace(options, judge_model=None)


def given_options(ctx: typer.Context) -> set[str]:
    """The flags the user set, typed or in --config (a file's value equal to the default sets
    nothing: `--print-config` writes every option), so options a method would ignore are
    refused."""
    defaults = {p.name: p.default for p in ctx.command.params}
    given = set()
    for name, value in ctx.params.items():
        # typer may vendor click, so compare the source by name
        source = getattr(ctx.get_parameter_source(name), "name", "DEFAULT")
        if (
            source == "DEFAULT_MAP"
            and value != defaults.get(name)
            or source
            not in (
                "DEFAULT",
                "DEFAULT_MAP",
            )
        ):
            given.add("--" + name.replace("_", "-"))
    return given


def print_train(result: RestResult | RLResult | DPOResult) -> None:
    console.print(f"base    test {result.base_test.line()}")
    console.print(
        f"shipped test {result.shipped_test.line()}  ({result.shipped}, {result.gain:+.3f})"
    )
    if result.stopped_by is not None:
        console.print(
            f"[bold yellow]stopped early:[/] {result.stopped_by} (the same command resumes)"
        )
    if result.best_dir:
        console.print(f"shipped model: {result.best_dir}  (use --model local:{result.best_dir})")
    out.print_json(data=result.to_dict())
