"""The weight trainer for a weight config, built the one way: `selftaught.trainers.build_trainer`
builds weight runs through it, and so does a night's adapter phase (`sleep/night/weight_night`),
which sits below `trainers` (trainers builds nights too)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from selftaught.weights.config import DPOConfig, RestConfig, RLConfig

if TYPE_CHECKING:
    from selftaught.models.resolve import ModelLike
    from selftaught.tasks.base import Task
    from selftaught.weights.dpo import DPOTrainer
    from selftaught.weights.rest import RestTrainer
    from selftaught.weights.rl import RLTrainer
    from selftaught.weights.trainer import WeightTrainer


@overload
def weight_trainer_for(config: RestConfig) -> type[RestTrainer]: ...
@overload
def weight_trainer_for(config: RLConfig) -> type[RLTrainer]: ...
@overload
def weight_trainer_for(config: DPOConfig) -> type[DPOTrainer]: ...
def weight_trainer_for(config: RestConfig | RLConfig | DPOConfig) -> type:
    """The trainer class that runs a weight config (the config's type picks it)."""
    if isinstance(config, RestConfig):
        from selftaught.weights.rest import RestTrainer

        return RestTrainer
    if isinstance(config, DPOConfig):
        from selftaught.weights.dpo import DPOTrainer

        return DPOTrainer
    from selftaught.weights.rl import RLTrainer

    return RLTrainer


@overload
def build_weight_trainer(
    config: RestConfig, task: Task, model: ModelLike | Path | None, **kwargs: Any
) -> RestTrainer: ...
@overload
def build_weight_trainer(
    config: RLConfig, task: Task, model: ModelLike | Path | None, **kwargs: Any
) -> RLTrainer: ...
@overload
def build_weight_trainer(
    config: DPOConfig, task: Task, model: ModelLike | Path | None, **kwargs: Any
) -> DPOTrainer: ...
def build_weight_trainer(
    config: RestConfig | RLConfig | DPOConfig,
    task: Task,
    model: ModelLike | Path | None,
    **kwargs: Any,
) -> WeightTrainer[Any, Any]:
    """`weight_trainer_for(config)(config, task, model, **kwargs)`."""
    cls: type[WeightTrainer[Any, Any]] = weight_trainer_for(config)
    return cls(config, task, model, **kwargs)
