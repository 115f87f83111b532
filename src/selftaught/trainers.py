"""One trainer contract: the config's type (and its method) picks the trainer.

| config                          | trainer        | result           |
|---------------------------------|----------------|------------------|
| `SkillOptConfig`                | `SkillTrainer` | `SkillRunResult` |
| `RestConfig(method="rest"/"sft")` | `RestTrainer`  | `RestResult`     |
| `RLConfig(method="grpo"/"gspo")`  | `RLTrainer`    | `RLResult`       |
| `DPOConfig(method="dpo"/"kto")` | `DPOTrainer`   | `DPOResult`      |
| `NightConfig(project=...)`      | `NightTrainer` | `NightResult`    |

Every trainer takes `(config, task, model, *, output_dir, callbacks, progress, console,
ledger)` (some add keywords of their own, below), and `train()` returns a `RunResult`
subclass (`selftaught.results`): each subclasses `selftaught.trainer_base.BaseTrainer` (the
run directory, callbacks and tracker, the usage ledger; for a task's trainers the resume and
split checks too) and keeps only its own loop. The
model is a spec string or a `ChatModel` for every trainer (`selftaught.models.resolve`); a weight
trainer's must be local (`local`, `local:PATH`, or a `LocalModel` loaded from files):

    from selftaught.trainers import build_trainer
    result = build_trainer(RestConfig(method="sft"), task, "local", output_dir="runs/x").train()
    run = build_trainer(SkillOptConfig(), task, "local", output_dir="runs/y").train()

A skill run's analyst and starting skill are keywords of its own (`optimizer_model=`,
`initial_skill=`); a DPO run's pairs are `preferences=` (a preference JSONL file or pairs).
A night's "task" is the task log it mines (a `TaskLog`, its path or URL) and its model the
target (or the `NightModels` of every role): `build_trainer(NightConfig(project="demo"), log,
model).train()` is one project's night (`selftaught.sleep.night.cycle.NightTrainer`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from selftaught.weights.build import build_weight_trainer, weight_trainer_for
from selftaught.weights.config import METHODS, ConfigError, DPOConfig, RestConfig, RLConfig

if TYPE_CHECKING:
    from pathlib import Path

    from selftaught.callbacks import CallbackList, RunInfo
    from selftaught.models.resolve import ModelLike
    from selftaught.models.usage import UsageLedger
    from selftaught.results import RunResult
    from selftaught.runs import RunDir
    from selftaught.skill.config import SkillOptConfig
    from selftaught.skill.trainer import SkillTrainer
    from selftaught.sleep.intake.log import TaskLog
    from selftaught.sleep.night.cycle import NightConfig, NightModels, NightSource, NightTrainer
    from selftaught.tasks.base import Task
    from selftaught.trainer_base import BaseTrainer
    from selftaught.weights.dpo import DPOTrainer
    from selftaught.weights.rest import RestTrainer
    from selftaught.weights.rl import RLTrainer

ResultT_co = TypeVar("ResultT_co", bound="RunResult", covariant=True)


class Trainer(Protocol[ResultT_co]):
    """What every trainer offers (`BaseTrainer` holds it): its validated `config`, the `task`
    (a night's: the `NightSource` it mines), the run directory `run` (`run.root`; a resume
    with other settings is refused), the `RunInfo` its callbacks are told, the `callbacks`,
    the `ledger` charged with its calls, the `result_type` `train()` returns, and `train()`,
    which runs (or resumes) the run."""

    @property
    def result_type(self) -> type[ResultT_co]: ...
    @property
    def config(self) -> Any: ...
    @property
    def task(self) -> Task | NightSource: ...
    @property
    def run(self) -> RunDir: ...
    @property
    def info(self) -> RunInfo: ...
    @property
    def callbacks(self) -> CallbackList: ...
    @property
    def ledger(self) -> UsageLedger: ...
    @property
    def method(self) -> str: ...
    def train(self) -> ResultT_co: ...


def config_method(config: Any) -> str:
    """The method a config runs: `skill` for a `SkillOptConfig`, else its `method`."""
    from selftaught.skill.config import SkillOptConfig

    if isinstance(config, SkillOptConfig):
        return "skill"
    if isinstance(config, RestConfig | RLConfig | DPOConfig):
        return config.method
    raise ConfigError(
        "a run config must be a SkillOptConfig, RestConfig, RLConfig or DPOConfig, got "
        f"{type(config).__name__}"
    )


@overload
def trainer_for(config: SkillOptConfig) -> type[SkillTrainer]: ...
@overload
def trainer_for(config: RestConfig) -> type[RestTrainer]: ...
@overload
def trainer_for(config: RLConfig) -> type[RLTrainer]: ...
@overload
def trainer_for(config: DPOConfig) -> type[DPOTrainer]: ...
def trainer_for(config: SkillOptConfig | RestConfig | RLConfig | DPOConfig) -> type:
    """The trainer class that runs `config`."""
    method = config_method(config)
    if method == "skill":
        from selftaught.skill.trainer import SkillTrainer

        return SkillTrainer
    assert isinstance(config, RestConfig | RLConfig | DPOConfig)  # config_method said so
    return weight_trainer_for(config)


def check_method(
    config: SkillOptConfig | RestConfig | RLConfig | DPOConfig, method: str | None
) -> None:
    """Refuse a method that the config does not run (the config decides; naming the method as
    well is optional)."""
    if method is None:
        return
    if method not in (*METHODS, "skill"):
        raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    have = config_method(config)
    if have != method:
        want = {
            "grpo": "an RLConfig",
            "gspo": "an RLConfig",
            "dpo": "a DPOConfig",
            "kto": "a DPOConfig",
        }.get(  # fmt: skip
            method, "a RestConfig"
        )
        raise ConfigError(
            f"method {method!r} needs {want}(method={method!r}); the config given is a "
            f"{type(config).__name__} that runs {have!r} (leave the method out: the config "
            "picks the trainer)"
        )


@overload
def build_trainer(
    config: SkillOptConfig, task: Task, model: ModelLike, **kwargs: Any
) -> SkillTrainer: ...
@overload
def build_trainer(
    config: RestConfig, task: Task, model: ModelLike | Path | None, **kwargs: Any
) -> RestTrainer: ...
@overload
def build_trainer(
    config: RLConfig, task: Task, model: ModelLike | Path | None, **kwargs: Any
) -> RLTrainer: ...
@overload
def build_trainer(
    config: DPOConfig, task: Task, model: ModelLike | Path | None, **kwargs: Any
) -> DPOTrainer: ...
@overload
def build_trainer(
    config: NightConfig,
    task: TaskLog | Path | str | None,
    model: NightModels | ModelLike | None,
    **kwargs: Any,
) -> NightTrainer: ...
def build_trainer(
    config: SkillOptConfig | RestConfig | RLConfig | DPOConfig | NightConfig,
    task: Task | TaskLog | Path | str | None,
    model: ModelLike | NightModels | Path | None,
    **kwargs: Any,
) -> Trainer[RunResult]:
    """The trainer for `config`, built the one way: (config, task, model, **keywords); a
    night's task is its log."""
    from pathlib import Path

    from selftaught.skill.config import SkillOptConfig
    from selftaught.sleep.night.cycle import NightConfig, NightModels, build_night_trainer
    from selftaught.tasks.base import Task

    if isinstance(config, NightConfig):
        if isinstance(task, Task) or isinstance(model, Path):
            raise ConfigError("a night mines its task log: pass the log (or None), not a Task")
        return build_night_trainer(config, task, model, **kwargs)
    if not isinstance(task, Task) or isinstance(model, NightModels):
        raise ConfigError(f"a {type(config).__name__} trains on a Task with a model spec")
    if not isinstance(config, SkillOptConfig):
        return build_weight_trainer(config, task, model, **kwargs)
    cls: type[BaseTrainer[Any, Any, Any]] = trainer_for(config)
    trainer: Trainer[RunResult] = cls(config, task, model, **kwargs)
    return trainer
