"""One trainer contract: the config's type (and its method) picks the trainer.

| config                          | trainer        | result           |
|---------------------------------|----------------|------------------|
| `SkillOptConfig`                | `SkillTrainer` | `SkillRunResult` |
| `RestConfig(method="rest"/"sft")` | `RestTrainer`  | `RestResult`     |
| `RLConfig(method="grpo"/"gspo")`  | `RLTrainer`    | `RLResult`       |
| `DPOConfig(method="dpo")`       | `DPOTrainer`   | `DPOResult`      |

Every trainer is built the same way, `Trainer(config, task, model, *, output_dir, callbacks,
progress, console)`, and `train()` returns a `RunResult` subclass (`selftaught.results`). The
model is a spec string or a `ChatModel` for every trainer (`selftaught.models.resolve`); a weight
trainer's must be local (`local`, `local:PATH`, or a `LocalModel` loaded from files):

    from selftaught.trainers import build_trainer
    result = build_trainer(RestConfig(method="sft"), task, "local", output_dir="runs/x").train()
    run = build_trainer(SkillOptConfig(), task, "local", output_dir="runs/y").train()

A skill run's analyst and starting skill are keywords of its own (`optimizer_model=`,
`initial_skill=`); a DPO run's pairs are `preferences=` (a preference JSONL file or pairs)."""

from __future__ import annotations

from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Protocol, overload

from selftaught.weights.config import METHODS, ConfigError, DPOConfig, RestConfig, RLConfig

if TYPE_CHECKING:
    from pathlib import Path

    from selftaught.models.resolve import ModelLike
    from selftaught.results import RunResult
    from selftaught.skill.config import SkillOptConfig
    from selftaught.skill.trainer import SkillTrainer
    from selftaught.tasks.base import Task
    from selftaught.weights.dpo import DPOTrainer
    from selftaught.weights.rest import RestTrainer
    from selftaught.weights.rl import RLTrainer


class Trainer(Protocol):
    """What every trainer offers: `train()` runs (or resumes) the run in its directory and
    returns its typed result."""

    def train(self) -> RunResult: ...


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
    if isinstance(config, RestConfig):
        from selftaught.weights.rest import RestTrainer

        return RestTrainer
    if isinstance(config, DPOConfig):
        from selftaught.weights.dpo import DPOTrainer

        return DPOTrainer
    from selftaught.weights.rl import RLTrainer

    return RLTrainer


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
        want = {"grpo": "an RLConfig", "gspo": "an RLConfig", "dpo": "a DPOConfig"}.get(
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
def build_trainer(
    config: SkillOptConfig | RestConfig | RLConfig | DPOConfig,
    task: Task,
    model: ModelLike | Path | None,
    **kwargs: Any,
) -> Trainer:
    """The trainer for `config`, built the one way: (config, task, model, **keywords)."""
    from selftaught.skill.config import SkillOptConfig

    config_method(config)  # refuses a config of another type
    # one branch per overload above, so that the type checker holds each config to its trainer
    if isinstance(config, SkillOptConfig):
        from selftaught.skill.trainer import SkillTrainer

        if model is None or isinstance(model, PurePath):  # what SkillTrainer would refuse
            raise ConfigError(
                f"a model is a spec string or a ChatModel, got {type(model).__name__}"
            )
        return SkillTrainer(config, task, model, **kwargs)
    if isinstance(config, RestConfig):
        from selftaught.weights.rest import RestTrainer

        return RestTrainer(config, task, model, **kwargs)
    if isinstance(config, DPOConfig):
        from selftaught.weights.dpo import DPOTrainer

        return DPOTrainer(config, task, model, **kwargs)
    from selftaught.weights.rl import RLTrainer

    return RLTrainer(config, task, model, **kwargs)
