"""What the weight trainers (`RestTrainer`, `DPOTrainer`, `RLTrainer`) share beyond every
trainer's base (`selftaught.trainer_base`): a local model (`local`, `local:PATH`, a path or a
`LocalModel` loaded from files), the three splits read and checked before anything is written,
the default run directory `runs/train-<method>-<task>-<backend>-s<seed>`, the gate on the
task's natural metric, and `config.json` as `{method, task, model, sizes, <method's settings>}`.
TRL logs to the tracker `report_to` names (`tracking.trl_report_to`), so no tracker callback
is added."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from selftaught.callbacks import TrainerCallback
from selftaught.errors import ConfigError
from selftaught.gate import GatePower, gate_power
from selftaught.models.device import dtype_name, inference_dtype, resolve_device
from selftaught.models.resolve import local_model_path
from selftaught.results import RunResult
from selftaught.tasks.base import Task
from selftaught.trainer_base import BaseTrainer
from selftaught.weights.config import (
    DPOConfig,
    RestConfig,
    RLConfig,
    default_train_dir,
    resume_settings,
    task_gate,
)

WeightConfigT = TypeVar("WeightConfigT", bound=RestConfig | RLConfig | DPOConfig)
ResultT = TypeVar("ResultT", bound=RunResult)


class WeightTrainer(BaseTrainer[WeightConfigT, ResultT, Task]):
    """The base of the trainers that change a local model's weights."""

    # config.json's key for the settings a resumed run must share (`resume_settings`)
    settings_key: ClassVar[str]

    model_path: Path | None

    @property
    def method(self) -> str:
        return self.config.method

    def _trackers(self) -> list[TrainerCallback]:
        return []  # TRL logs to `report_to` itself

    def _setup(self, model: Any) -> None:
        """The splits, the trainer's data checks (`_check_data`), then the local model: all
        refused before the run directory is made."""
        self._read_splits()
        self._check_data()
        self.model_path = local_model_path(model)
        self.gate = task_gate(self.config.gate, self.task.kind)
        if self.gate.cost is not None:
            raise ConfigError(
                f"the gate's objective {','.join(self.gate.objective)} weighs what a skill "
                "costs per val item; a weight run's candidates are models: leave it at score"
            )

    def _check_data(self) -> None:
        """Refuse up front a run with nothing to train on."""

    def _power(self) -> GatePower:
        return gate_power(len(self.val_examples), self.gate)

    def default_output_dir(self) -> Path:
        return default_train_dir(self.config, self.task.name)

    def run_config(self) -> dict[str, Any]:
        out = {
            "method": self.method,
            "task": self.task.name,
            "model": str(self.model_path or "embedded"),
            "sizes": self.split_sizes(),
            self.settings_key: resume_settings(self.config),
        }
        serving = self.serving_dtype()
        if serving is not None:  # rounds scored in another dtype are not resumed as these
            out["serving_dtype"] = dtype_name(serving)
        return out

    def _default_run_config(self) -> dict[str, Any]:
        # the serving dtype is the machine's, not a setting: a saved run without it was
        # served in the weights' dtype, never read as served in today's
        out = super()._default_run_config()
        out.pop("serving_dtype", None)
        return out

    def serving_dtype(self) -> Any:
        """The dtype rounds are sampled and scored in when it is not the one the weights
        train in (`SELFTAUGHT_DTYPE`, else the per-device choice of
        `selftaught.models.device.inference_dtype`); None when they are the same."""
        device, weights = resolve_device(self.config.backend.device)
        serving = inference_dtype(device)
        return None if serving == weights else serving


def served_copy(model: Any, dtype: Any) -> Any:
    """`model` as the engine serves it: itself, or a copy in `dtype` (`serving_dtype`; the
    trained weights stay in theirs; a bf16 copy of a 135M model is 270 MB, and its KV cache
    half the fp32 one)."""
    if dtype is None:
        return model
    return copy.deepcopy(model).to(dtype).eval()
