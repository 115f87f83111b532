"""The library's entry points, GEPA style: `evaluate`, `optimize`, `optimize_skills`, `train`,
`sleep_night`.

Each owns the wiring a user would otherwise repeat (and the CLI and the benchmarks used to):
resolving task and model specs, charging every call to a usage ledger, method dispatch with
per-method defaults, and persisting results. Defaults live once, in the config dataclasses
(`RolloutConfig`, `SkillOptConfig`, `SkillSetConfig`, `RestConfig`, `RLConfig`, `DPOConfig`,
`NightConfig`); the CLI only builds those and calls these functions.

    import selftaught
    result = selftaught.evaluate("gym:basic_arithmetic", "local", limit=20)
    run = selftaught.optimize("gym:basic_arithmetic", "openai:gpt-4o-mini",
                              optimizer_model="openai:gpt-4o")       # a SkillRunResult
    skills = selftaught.optimize_skills("data.jsonl", "openai:gpt-4o-mini",
                                        skills_dir=".claude/skills")  # a SkillSetResult
    shipped = selftaught.train("gym:basic_arithmetic?max_terms=2&max_digits=1",
                               config=RestConfig(method="sft"))      # a RestResult
    nights = selftaught.sleep_night(NightConfig(project="demo"), model="openai:gpt-4o-mini")

Every entry point but `evaluate` (an `EvalResult`) returns `RunResult` subclasses
(`selftaught.results`; `sleep_night` one per project); the config's type picks the trainer
(`selftaught.trainers`); `callbacks=[...]` see the run's events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from selftaught.errors import ConfigError, writing_to
from selftaught.models.base import ChatModel
from selftaught.models.resolve import ModelLike, local_model_path, resolve_model
from selftaught.models.usage import TrackedModel, UsageLedger
from selftaught.tasks.base import Split, Task

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from selftaught.callbacks import TrainerCallback
    from selftaught.evaluation import EvalResult
    from selftaught.results import RunResult
    from selftaught.rollout import RolloutConfig
    from selftaught.skill.config import SkillOptConfig
    from selftaught.skill.result import SkillRunResult
    from selftaught.skill.skillset import SkillSetConfig, SkillSetResult
    from selftaught.sleep.night.cycle import NightConfig, NightModels
    from selftaught.sleep.result import NightResult
    from selftaught.tasks.options import TaskOptions
    from selftaught.weights.config import DPOConfig, RestConfig, RLConfig
    from selftaught.weights.dpo import DPOResult, Judged, PreferencePair, Preferences
    from selftaught.weights.rest import RestResult
    from selftaught.weights.rl import RLResult

TaskLike = str | Task
TaskOptionsLike = Union["TaskOptions", Mapping[str, Any], None]


def _model(model: ModelLike, options: Mapping[str, Any] | None) -> ChatModel:
    return resolve_model(model, **dict(options or {}))


def resolve_task(
    task: TaskLike,
    options: TaskOptionsLike = None,
    *,
    ledger: UsageLedger | None = None,
    model_options: Mapping[str, Any] | None = None,
) -> Task:
    """A Task from a spec string and its `TaskOptions` (a dict of their fields works too), or
    a Task object as given. With a `ledger`, the judge's calls are charged to it as `judge`."""
    from selftaught.tasks import load_task
    from selftaught.tasks.options import TaskOptions

    opts = TaskOptions.of(options)
    if not isinstance(task, str):
        if opts.given():
            raise ConfigError(
                f"task options ({', '.join(opts.given())}) apply to a task spec; the task "
                f"object {getattr(task, 'name', task)!r} was built with its own"
            )
        return task
    judge = None
    if opts.judge_model is not None:
        judge = _model(opts.judge_model, model_options)
        if ledger is not None:
            judge = TrackedModel(judge, ledger, "judge")
    return load_task(task, opts, judge=judge)


def evaluate(
    task: TaskLike,
    model: ModelLike = "local",
    *,
    skill: str = "",
    memory: str = "",
    split: Split = "test",
    limit: int | None = None,
    rollout: RolloutConfig | None = None,
    task_options: TaskOptionsLike = None,
    model_options: Mapping[str, Any] | None = None,
    output: str | Path | None = None,
) -> EvalResult:
    """Score `model` (reading `skill` and `memory`) on one split of `task`.

    Every call is charged to a ledger (target, and the judge of `task_options.judge_model`)
    and reported in `result.usage`.
    With `output`, the per-example rollouts go to that JSONL file and the summary beside it
    (`<output>.summary.json`)."""
    from selftaught.evaluation import evaluate_split
    from selftaught.policy import Policy

    ledger = UsageLedger()
    the_task = resolve_task(task, task_options, ledger=ledger, model_options=model_options)
    target = TrackedModel(_model(model, model_options), ledger, "target")
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
    task_options: TaskOptionsLike = None,
    model_options: Mapping[str, Any] | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    progress: bool = True,
    console: Console | None = None,
) -> SkillRunResult:
    """Skill optimization (SkillOpt) of a frozen `model`; `optimizer_model` (default: the same
    model) is the analyst. Resumes the run in `output_dir` (default
    `runs/optimize/<task>`) when it holds one with the same settings. Returns the result
    (its `to_dict()` is also in summary.json)."""
    from selftaught.skill import SkillOptConfig, default_output_dir
    from selftaught.trainers import build_trainer

    ledger = UsageLedger()  # target, analyst and judge: one budget
    the_task = resolve_task(task, task_options, ledger=ledger, model_options=model_options)
    target = _model(model, model_options)
    analyst = target
    if optimizer_model is not None and optimizer_model != model:
        analyst = _model(optimizer_model, model_options)
    trainer = build_trainer(
        config or SkillOptConfig(),
        the_task,
        target,
        optimizer_model=analyst,
        initial_skill=initial_skill,
        output_dir=output_dir or default_output_dir(the_task.name),
        ledger=ledger,
        callbacks=callbacks,
        progress=progress,
        console=console,
    )
    return trainer.train()


def optimize_skills(
    task: TaskLike,
    model: ModelLike = "local",
    *,
    skills_dir: str | Path,
    optimizer_model: ModelLike | None = None,
    config: SkillOptConfig | None = None,
    set_config: SkillSetConfig | None = None,
    output_dir: str | Path | None = None,
    task_options: TaskOptionsLike = None,
    model_options: Mapping[str, Any] | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    progress: bool = True,
    console: Console | None = None,
) -> SkillSetResult:
    """Many skills (`optimize --skills DIR`): the skills in `skills_dir/*/SKILL.md` are the
    starting ones; the task's examples are clustered by intent and one skill is trained per
    cluster, each gated on its own val and on the whole val served with routing
    (`selftaught.skill.skillset`). Each accepted skill is written to `skills_dir/<name>/SKILL.md`
    (an existing one back to its own file, never over a file changed since it was read:
    `result.refused` says which). Resumes the run in `output_dir` (default
    `runs/optimize-skills/<task>`); `config` is each cluster's `SkillOptConfig`."""
    from selftaught.runs import atomic_write_json, slug
    from selftaught.skill.skill_dir import starting_skills, write_skill_files
    from selftaught.skill.skillset import train_skill_set

    the_task = resolve_task(task, task_options, model_options=model_options)
    target = _model(model, model_options)
    analyst = target
    if optimizer_model is not None and optimizer_model != model:
        analyst = _model(optimizer_model, model_options)
    out = Path(output_dir or Path("runs") / "optimize-skills" / slug(the_task.name))
    starts = starting_skills(skills_dir, out)
    result = train_skill_set(
        the_task,
        target,
        analyst,
        output_dir=out,
        config=config,
        set_config=set_config,
        start=[s.file for s in starts],
        callbacks=callbacks,
        progress=progress,
        console=console,
    )
    written, refused = write_skill_files(result.outcomes, skills_dir, starts)
    result = replace(result, written=written, refused=refused)
    atomic_write_json(out / "result.json", result.to_dict())
    return result


def train(
    task: TaskLike,
    model: ModelLike = "local",
    *,
    method: str | None = None,
    config: RestConfig | RLConfig | DPOConfig | None = None,
    output_dir: str | Path | None = None,
    task_options: TaskOptionsLike = None,
    judge_model: ModelLike | None = None,
    preferences: str | Path | Sequence[PreferencePair | Judged] | Preferences | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    progress: bool = True,
    console: Console | None = None,
) -> RestResult | RLResult | DPOResult:
    """Weight-space self-improvement of a local model (`local` or `local:PATH`). The config
    picks the trainer: `RestConfig(method="rest")` (ReST-EM, the default),
    `RestConfig(method="sft")` (one round on the references), `RLConfig(method="grpo")` or
    `"gspo"`. `method` alone gives that method's default config; given with a config, it must
    match it. `judge_model` scores GRPO's `judge` reward (`RLConfig.rewards`); its calls count
    against the run's budget. `DPOConfig()` (`method="dpo"`) trains a LoRA adapter by DPO on
    `preferences`: a preference JSONL file (`{"prompt", "chosen", "rejected"}` a line) or
    `PreferencePair`s; the task's val and test score it. `DPOConfig(method="kto")` trains by
    KTO on replies judged one by one (`{"prompt", "completion", "label"}` lines, `Judged`),
    a pair counting as its chosen reply up and its rejected one down.

    The run directory (default `runs/train-<method>-<task>-<backend>-s<seed>`) resumes when
    run again."""
    from selftaught.trainers import build_trainer, check_method
    from selftaught.weights.config import DPOConfig, RestConfig, RLConfig, default_train_config

    path = local_model_path(model)  # refuses a model that is not local, before any work
    cfg = config if config is not None else default_train_config(method or "rest")
    if not isinstance(cfg, RestConfig | RLConfig | DPOConfig):
        raise ConfigError(
            f"train changes weights: it takes a RestConfig, an RLConfig or a DPOConfig, got "
            f"{type(cfg).__name__} (a SkillOptConfig runs with optimize)"
        )
    check_method(cfg, method)
    if judge_model is not None and not isinstance(cfg, RLConfig):
        raise ConfigError("judge_model scores GRPO's judge reward: it needs an RLConfig")
    ledger = UsageLedger()  # the policy's calls and the judges': one budget
    the_task = resolve_task(task, task_options, ledger=ledger)
    if preferences is not None and not isinstance(cfg, DPOConfig):
        raise ConfigError("preferences are DPO's training data: they need a DPOConfig")
    judged: dict[str, Any] = {"judge_model": judge_model} if isinstance(cfg, RLConfig) else {}
    if isinstance(cfg, DPOConfig):
        judged = {"preferences": preferences}
    trainer = build_trainer(
        cfg,
        the_task,
        path,
        output_dir=output_dir,
        ledger=ledger,
        **judged,
        callbacks=callbacks,
        progress=progress,
        console=console,
    )
    return trainer.train()


def sleep_night(
    config: NightConfig | None = None,
    *,
    model: ModelLike | NightModels | None = None,
    dry_run: bool = False,
    callbacks: Sequence[TrainerCallback] = (),
    progress: bool | None = None,
    console: Console | None = None,
) -> list[NightResult]:
    """One night (`sleep run`): each project with traffic in the task log since its last
    night (`config.project`: that one) is mined into tasks, its skill and memory (and, with
    `weights`, an adapter) trained on them and gated, and what the gate accepted staged for
    `sleep adopt`. Each project's night is a `NightTrainer` (`build_trainer(NightConfig(...),
    log, model)`); one typed `NightResult` per project comes back, in project order.

    `model`: the target (a spec or a `ChatModel`; None: `config.model`, else the upstream
    the proxy logged), or the `NightModels` of every role. `callbacks` (and the tracker
    `config.report_to` names) see each project's phases, val before / after and the staging
    decision. A dry run stages nothing and reads the same interactions again next night. A
    budget that cannot gate one candidate is refused before any call (`sleep plan`)."""
    import dataclasses

    from selftaught.sleep.night.cycle import NightConfig, night_models, run_night
    from selftaught.sleep.night.plan import refuse_short_budget

    cfg = config if config is not None else NightConfig()
    if progress is not None:
        cfg = dataclasses.replace(cfg, progress=progress)
    if isinstance(model, str):  # loaded by the night, with its options and its mark
        cfg = dataclasses.replace(cfg, model=model)
        model = None
    models = night_models(model, cfg)
    refuse_short_budget(cfg, models=models)  # a budget that cannot gate one candidate
    return run_night(cfg, models=models, dry_run=dry_run, console=console, callbacks=callbacks)


def load_result(d: dict[str, Any]) -> RunResult:
    """`RunResult.from_dict` with every result kind imported (skill, ReST, RL, night), so a
    stored `result.json` of any kind comes back as its own subclass."""
    import selftaught.skill.result  # noqa: F401
    import selftaught.skill.skillset  # noqa: F401
    import selftaught.sleep.night.cycle  # noqa: F401
    import selftaught.weights.dpo  # noqa: F401
    import selftaught.weights.rest  # noqa: F401
    import selftaught.weights.rl  # noqa: F401
    from selftaught.results import RunResult

    return RunResult.from_dict(d)
