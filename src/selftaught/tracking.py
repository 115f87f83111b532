"""Send runs to the experiment trackers people already use: trackio, MLflow, W&B.

`report_to` (a field of every run config; `"none"` by default) picks one. The weight trainers
hand it to TRL (`report_to` of its SFT / GRPO config), which logs its own training metrics.
Skill runs and nights log through a callback made here (`tracker`): val scores, gate
decisions, usage, and the shipped skill as a text artifact.

Every backend is optional and imported only when asked for, with a clear error naming the
extra to install (`pip install "selftaught[tracking]"` for trackio + MLflow, or per backend).
Where runs go follows each tool's own settings, as under TRL:
    trackio  TRACKIO_PROJECT (default `selftaught`), stored under TRACKIO_DIR (local SQLite)
    mlflow   MLFLOW_TRACKING_URI (e.g. `file:///path/mlruns` or `sqlite:///mlflow.db`) and
             MLFLOW_EXPERIMENT_NAME (default `selftaught`); MLflow 3 refuses the file store
             unless MLFLOW_ALLOW_FILE_STORE=true
    wandb    WANDB_PROJECT (default `selftaught`), WANDB_MODE=offline to stay local
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selftaught.callbacks import RunInfo, TrainerCallback
from selftaught.errors import ConfigError

if TYPE_CHECKING:
    from selftaught.results import RunResult, SplitScore

REPORT_TO = ("none", "trackio", "mlflow", "wandb")
# backend → (module to import, pip extra that installs it)
_BACKENDS = {
    "trackio": ("trackio", "trackio"),
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
}
DEFAULT_PROJECT = "selftaught"


class TrackingError(ConfigError):
    """A tracker that cannot be used: unknown, or its package is not installed."""


def check_report_to(value: str) -> str:
    """The value when it names a known tracker; a one-sentence error otherwise."""
    if value not in REPORT_TO:
        raise TrackingError(f"report_to must be one of {', '.join(REPORT_TO)}, got {value!r}")
    return value


def require(backend: str) -> Any:
    """Import a tracker's package, or say which extra installs it."""
    check_report_to(backend)
    module, extra = _BACKENDS[backend]
    try:
        return __import__(module)
    except ImportError as err:
        raise TrackingError(
            f'report_to={backend!r} needs the {module} package: pip install "selftaught[{extra}]"'
        ) from err


def trl_report_to(report_to: str) -> dict[str, Any]:
    """The TRL / transformers training arguments that send a weight run to the tracker (the
    package is checked here, so a missing one fails before any model is loaded)."""
    if check_report_to(report_to) == "none":
        return {"report_to": "none"}
    require(report_to)
    args: dict[str, Any] = {"report_to": [report_to]}
    if report_to == "trackio":
        args["project"] = os.environ.get("TRACKIO_PROJECT", DEFAULT_PROJECT)
    return args


def with_tracker(report_to: str, callbacks: Any = ()) -> list[TrainerCallback]:
    """`callbacks` plus the tracker `report_to` names (none for `"none"`)."""
    out = list(callbacks or ())
    if check_report_to(report_to) != "none":
        out.append(tracker(report_to))
    return out


def tracker(report_to: str) -> Tracker:
    """The callback that logs a skill run or night to `report_to`."""
    require(report_to)
    return {"trackio": TrackioTracker, "mlflow": MlflowTracker, "wandb": WandbTracker}[report_to]()


def flat_numbers(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested dict as `a/b` keys (booleans as 0/1); text is left out."""
    out: dict[str, float] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_numbers(value, f"{name}/"))
        elif isinstance(value, int | float):  # bool included: 0 / 1
            out[name] = float(value)
    return out


def _usage_totals(usage: dict[str, Any]) -> dict[str, float]:
    keys = ("calls", "prompt_tokens", "completion_tokens", "errors")
    return {
        f"usage/{k}": float(sum(u.get(k, 0) for u in usage.values() if isinstance(u, dict)))
        for k in keys
    }


class Tracker(TrainerCallback):
    """What every backend logs; subclasses say how (`_begin`, `_log`, `_text`, `_finish`)."""

    def __init__(self) -> None:
        self.gates: list[dict[str, Any]] = []
        self.started = False

    def on_start(self, run: RunInfo) -> None:
        if not self.started:
            self._begin(run)
            self.started = True

    def on_evaluate(
        self, run: RunInfo, *, step: int, split: str, scores: SplitScore, label: str = ""
    ) -> None:
        self.on_start(run)
        prefix = f"{split}/{label}/" if label else f"{split}/"
        values = {"hard": scores.hard, "soft": scores.soft, "n": float(scores.n)}
        values["hard_ci_low"], values["hard_ci_high"] = scores.hard_ci
        self._log({prefix + k: float(v) for k, v in values.items()}, step)

    def on_step(self, run: RunInfo, *, step: int, metrics: dict[str, Any]) -> None:
        self.on_start(run)
        numbers = flat_numbers({k: v for k, v in metrics.items() if k != "usage"})
        if isinstance(metrics.get("usage"), dict):
            numbers.update(_usage_totals(metrics["usage"]))
        if numbers:
            self._log(numbers, step)

    def on_gate(
        self, run: RunInfo, *, step: int, decision: str, reason: str, details: dict[str, Any]
    ) -> None:
        self.on_start(run)
        self.gates.append({"step": step, "decision": decision, "reason": reason})
        passed = decision not in ("reject", "no_proposal", "failed", "backend_failed")
        new_best = decision in ("accept_new_best", "staged")
        self._log({"gate/accepted": float(passed), "gate/new_best": float(new_best)}, step)

    def on_end(self, run: RunInfo, result: RunResult) -> None:
        import json

        self.on_start(run)
        final: dict[str, float] = _usage_totals(result.usage)
        for name, score in (("base", result.base_score), ("shipped", result.shipped_score)):
            if score is not None:
                final[f"result/{name}_hard"] = score.hard
                final[f"result/{name}_soft"] = score.soft
        self._log(final, None)
        texts = {
            **result.texts(),
            "gate_decisions.json": json.dumps(self.gates, indent=1),
            "result.json": json.dumps(result.to_dict(), indent=1, default=str),
        }
        for name, text in texts.items():
            self._text(name, text)
        self._finish()

    # ---- backend ---------------------------------------------------------------------------
    def _begin(self, run: RunInfo) -> None:
        raise NotImplementedError

    def _log(self, metrics: dict[str, float], step: int | None) -> None:
        raise NotImplementedError

    def _text(self, name: str, text: str) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError


def _config_for_tracker(run: RunInfo) -> dict[str, Any]:
    return {"method": run.method, "task": run.task, "run_dir": str(run.run_dir), **run.config}


class TrackioTracker(Tracker):
    """trackio, local-first: one run per selftaught run in project TRACKIO_PROJECT."""

    def _begin(self, run: RunInfo) -> None:
        import trackio

        self.step = 0
        with contextlib.redirect_stdout(sys.stderr):  # stdout is for the command's result
            self.run = trackio.init(
                project=os.environ.get("TRACKIO_PROJECT", DEFAULT_PROJECT),
                name=run.name,
                config=_config_for_tracker(run),
                embed=False,
                auto_log_cpu=False,
                auto_log_gpu=False,
            )

    def _log(self, metrics: dict[str, float], step: int | None) -> None:
        self.step = self.step if step is None else step
        self.run.log(metrics, step=self.step)

    def _text(self, name: str, text: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(text, encoding="utf-8")
            self.run.log_artifact(path, name=f"{self.run.name}-{path.stem}", type="text")

    def _finish(self) -> None:
        with contextlib.redirect_stdout(sys.stderr):
            self.run.finish()


class MlflowTracker(Tracker):
    """MLflow through its client (no global active run): experiment MLFLOW_EXPERIMENT_NAME,
    store MLFLOW_TRACKING_URI; the settings as params, texts as artifacts."""

    def _begin(self, run: RunInfo) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_PROJECT)
        experiment = self.client.get_experiment_by_name(name)
        exp_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.run_id = self.client.create_run(
            exp_id, run_name=run.name, tags={"selftaught.method": run.method}
        ).info.run_id
        params = [
            Param(key[:250], str(value)[:500])
            for key, value in _flat_params(_config_for_tracker(run)).items()
        ]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.last_step = 0

    def _log(self, metrics: dict[str, float], step: int | None) -> None:
        import time

        from mlflow.entities import Metric

        self.last_step = self.last_step if step is None else step
        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, self.last_step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def _text(self, name: str, text: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def _finish(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


def _flat_params(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flat_params(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class WandbTracker(Tracker):
    """Weights & Biases: project WANDB_PROJECT (WANDB_MODE=offline keeps it local)."""

    def _begin(self, run: RunInfo) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT),
            name=run.name,
            config=_config_for_tracker(run),
        )
        self.step = 0

    def _log(self, metrics: dict[str, float], step: int | None) -> None:
        self.step = self.step if step is None else step
        self.run.log(metrics, step=self.step)

    def _text(self, name: str, text: str) -> None:
        artifact = self.wandb.Artifact(f"{self.run.name}-{Path(name).stem}", type="text")
        with artifact.new_file(name, encoding="utf-8") as f:
            f.write(text)
        self.run.log_artifact(artifact)

    def _finish(self) -> None:
        self.run.finish()
