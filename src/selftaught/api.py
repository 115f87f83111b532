"""The library's entry points, GEPA style: `evaluate`, `optimize`, `train`.

Each owns the wiring a user would otherwise repeat (and the CLI and the benchmarks used to):
resolving task and model specs, charging every call to a usage ledger, method dispatch with
per-method defaults, and persisting results. Defaults live once, in the config dataclasses
(`RolloutConfig`, `SkillOptConfig`, `RestConfig`, `RLConfig`); the CLI only builds those and
calls these functions.

    import selftaught
    result = selftaught.evaluate("gym:basic_arithmetic", "local", limit=20)
    summary = selftaught.optimize("gym:basic_arithmetic", "openai:gpt-4o-mini",
                                  optimizer_model="openai:gpt-4o")
    shipped = selftaught.train("gym:basic_arithmetic?max_terms=2&max_digits=1", method="rest")
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selftaught.errors import writing_to
from selftaught.models.base import ChatModel
from selftaught.models.usage import TrackedModel, UsageLedger
from selftaught.tasks.base import Split, Task

if TYPE_CHECKING:
    from rich.console import Console

    from selftaught.evaluation import EvalResult
    from selftaught.rollout import RolloutConfig
    from selftaught.skill.config import SkillOptConfig
    from selftaught.weights.config import RestConfig, RLConfig
    from selftaught.weights.rest import RestResult
    from selftaught.weights.rl import RLResult

TaskLike = str | Task
ModelLike = str | ChatModel


def resolve_model(model: ModelLike, options: Mapping[str, Any] | None = None) -> ChatModel:
    """A ChatModel from a spec string (with `load_model` options) or as given."""
    if isinstance(model, str):
        from selftaught.models import load_model

        return load_model(model, **dict(options or {}))
    return model


def resolve_task(
    task: TaskLike,
    options: Mapping[str, Any] | None = None,
    *,
    judge: ChatModel | None = None,
) -> Task:
    """A Task from a spec string (with `load_task` options) or as given."""
    if not isinstance(task, str):
        return task
    from selftaught.tasks import load_task

    kwargs = dict(options or {})
    if judge is not None:
        kwargs["judge_model"] = judge
    return load_task(task, **kwargs)


def evaluate(
    task: TaskLike,
    model: ModelLike = "local",
    *,
    skill: str = "",
    memory: str = "",
    split: Split = "test",
    limit: int | None = None,
    rollout: RolloutConfig | None = None,
    judge_model: ModelLike | None = None,
    task_options: Mapping[str, Any] | None = None,
    model_options: Mapping[str, Any] | None = None,
    output: str | Path | None = None,
) -> EvalResult:
    """Score `model` (reading `skill` and `memory`) on one split of `task`.

    Every call is charged to a ledger (target and judge) and reported in `result.usage`.
    With `output`, the per-example rollouts go to that JSONL file and the summary beside it
    (`<output>.summary.json`)."""
    from selftaught.evaluation import evaluate_split
    from selftaught.policy import Policy

    ledger = UsageLedger()
    judge = None
    if judge_model is not None:
        judge = TrackedModel(resolve_model(judge_model, model_options), ledger, "judge")
    the_task = resolve_task(task, task_options, judge=judge)
    target = TrackedModel(resolve_model(model, model_options), ledger, "target")
    result = evaluate_split(
        the_task,
        target,
        Policy(skill, memory),
        split=split,
        limit=limit,
        rollout=rollout,
    )
    result.usage = ledger.to_dict()
    if output is not None:
        from selftaught.runs import atomic_write_json, write_jsonl

        path = Path(output)
        with writing_to(path, "the results"):
            write_jsonl(path, [r.to_dict() for r in result.rollouts])
            atomic_write_json(path.with_suffix(".summary.json"), result.summary())
    return result


def optimize(
    task: TaskLike,
    model: ModelLike = "local",
    *,
    optimizer_model: ModelLike | None = None,
    initial_skill: str = "",
    config: SkillOptConfig | None = None,
    output_dir: str | Path | None = None,
    task_options: Mapping[str, Any] | None = None,
    model_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    console: Console | None = None,
) -> dict[str, Any]:
    """Skill optimization (SkillOpt) of a frozen `model`; `optimizer_model` (default: the same
    model) is the analyst. Resumes the run in `output_dir` (default
    `runs/optimize/<task>`) when it holds one with the same settings. Returns the summary."""
    from selftaught.skill import SkillOptConfig, SkillTrainer, default_output_dir

    the_task = resolve_task(task, task_options)
    target = resolve_model(model, model_options)
    analyst = target
    if optimizer_model is not None and optimizer_model != model:
        analyst = resolve_model(optimizer_model, model_options)
    trainer = SkillTrainer(
        config or SkillOptConfig(),
        the_task,
        target,
        analyst,
        initial_skill,
        output_dir=output_dir or default_output_dir(the_task.name),
        progress=progress,
        console=console,
    )
    return trainer.train()


def train(
    task: TaskLike,
    model: str = "local",
    *,
    method: str = "rest",
    config: RestConfig | RLConfig | None = None,
    output_dir: str | Path | None = None,
    task_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    console: Console | None = None,
) -> RestResult | RLResult:
    """Weight-space self-improvement of a local model (`local` or `local:PATH`):
    `rest` (ReST-EM), `sft` (one round on the references), `grpo` or `gspo`.

    `config` defaults to the method's own (`RestConfig()`, `RestConfig(rounds=1)` for sft,
    `RLConfig(method=...)`). The run directory (default
    `runs/train-<method>-<task>-<backend>-s<seed>`) resumes when run again."""
    from selftaught.models.spec import parse_model_spec
    from selftaught.weights.config import ConfigError, default_train_config

    spec = parse_model_spec(model)
    if spec.backend != "local":
        raise ConfigError(
            f"train changes weights, so the model must be local or local:PATH, got {model!r}"
        )
    cfg = config if config is not None else default_train_config(method)
    the_task = resolve_task(task, task_options)
    run_dir = Path(output_dir) if output_dir else default_train_dir(method, the_task.name, cfg)
    if method in ("grpo", "gspo"):
        from selftaught.weights.config import RLConfig
        from selftaught.weights.rl import RLTrainer

        if not isinstance(cfg, RLConfig) or cfg.method != method:
            raise ConfigError(f"--method {method} needs an RLConfig(method={method!r})")
        return RLTrainer(
            the_task,
            cfg,
            run_dir,
            model_path=spec.model or None,
            progress=progress,
            console=console,
        ).train()
    from selftaught.weights.config import RestConfig
    from selftaught.weights.rest import RestTrainer

    if not isinstance(cfg, RestConfig):
        raise ConfigError(f"--method {method} needs a RestConfig, got {type(cfg).__name__}")
    return RestTrainer(
        the_task,
        cfg,
        run_dir,
        model_path=spec.model or None,
        method=method,
        progress=progress,
        console=console,
    ).train()


def default_train_dir(method: str, task_name: str, config: RestConfig | RLConfig) -> Path:
    """Deterministic, so running the same command again resumes the run."""
    from selftaught.runs import slug

    name = f"train-{method}-{task_name}-{config.backend.backend}-s{config.seed}"
    return Path("runs") / slug(name)
