"""What every trainer shares, once (TRL's `Trainer` shape). Built as `Trainer(config, task,
model, *, output_dir, callbacks, progress, console, ledger)`, in this order: the config's type;
the console; the callbacks and the tracker `report_to` names (a missing package fails here);
the ledger charged with the run's calls (its budget the config's) and the test ledger (test
stands outside the budget); `_setup(model)`, the trainer's own checks and models, before
anything is written; then the run directory and the `RunInfo` every event is told.

A run is `_begin()` (the resume check against `config.json`, the gate's power on this val
size, `on_start`, this invocation's clock), the trainer's own loop, then `_end(result)` (the
result file, `on_end`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from rich.console import Console

from selftaught.callbacks import CallbackList, RunInfo, TrainerCallback
from selftaught.errors import ConfigError
from selftaught.models.usage import RoleUsage, UsageLedger
from selftaught.results import RunResult
from selftaught.runs import RunDir, atomic_write_json
from selftaught.stops import UNLIMITED, Deadline, StopReason, Stops, patience_reached
from selftaught.tasks.base import Example, check_disjoint

if TYPE_CHECKING:
    from selftaught.evaluation import EvalResult
    from selftaught.gate import GatePower
    from selftaught.models.usage import Budget
    from selftaught.tasks.base import Task


class RunConfig(Protocol):
    """What the base reads of every run config (`SkillOptConfig`, `RestConfig`, `RLConfig`,
    `DPOConfig`): the budget, the tracker, the stops, and the settings as a dict."""

    @property
    def budget(self) -> Budget: ...
    @property
    def report_to(self) -> str: ...
    @property
    def stops(self) -> Stops: ...
    def to_dict(self) -> dict[str, Any]: ...


class Named(Protocol):
    """What the base reads of a run's task: its name (`RunInfo.task`)."""

    @property
    def name(self) -> str: ...


ConfigT = TypeVar("ConfigT", bound=RunConfig)
ResultT = TypeVar("ResultT", bound=RunResult)
# a `Task` for every trainer but the night, whose task is the log it mines (`NightSource`)
TaskT = TypeVar("TaskT", bound=Named)


def _a(name: str) -> str:
    """The article before a class name as it is read (`an RLConfig`, `a RestConfig`)."""
    return "an" if name[:1] in "AEIOU" or name.startswith("RL") else "a"


class BaseTrainer(Generic[ConfigT, ResultT, TaskT]):
    """The shared part of `SkillTrainer`, `RestTrainer`, `RLTrainer`, `DPOTrainer` and
    `NightTrainer`.

    A subclass names its `config_type` and `result_type`, the settings a resumed run may
    change (`resumable`), where its result goes (`result_file`), and implements `_setup`
    (its checks and models), `default_output_dir`, `run_config` (what a resume must match)
    and `train()`."""

    config_type: ClassVar[type]
    result_type: ClassVar[type[RunResult]]
    result_file: ClassVar[str] = "result.json"
    resumable: ClassVar[frozenset[str]] = frozenset()
    # a skill run is silent without `progress`; a weight run still prints its round lines
    quiet_without_progress: ClassVar[bool] = False

    config: ConfigT
    task: TaskT
    run: RunDir
    info: RunInfo
    deadline: Deadline

    def __init__(
        self,
        config: ConfigT,
        task: TaskT,
        model: Any = None,
        *,
        output_dir: str | Path | None = None,
        callbacks: Sequence[TrainerCallback] = (),
        progress: bool = True,
        console: Console | None = None,
        ledger: UsageLedger | None = None,
    ):
        self._check_config(config)
        self.config = config
        self.task = task
        self.show_progress = progress
        quiet = self.quiet_without_progress and not progress
        self.console = console or Console(stderr=True, quiet=quiet)
        self.callbacks = CallbackList([*(callbacks or ()), *self._trackers()])
        # the run's calls (and a judge charged to it) count against its budget; test
        # evaluations go to their own ledger, outside it
        self.ledger = ledger or UsageLedger()
        self.ledger.budget = config.budget
        self.test_ledger = UsageLedger()
        self._setup(model)
        self.run = self._open_run(Path(output_dir or self.default_output_dir()))
        self.info = self._run_info()
        self.deadline = UNLIMITED  # `_begin` starts this invocation's clock

    # ---- what a subclass provides ----------------------------------------------------------
    def _setup(self, model: Any) -> None:
        """The trainer's own checks and models, before the run directory is made."""

    def default_output_dir(self) -> Path:
        raise NotImplementedError

    def _open_run(self, root: Path) -> RunDir:
        """The run directory, made now (a night makes its own once it holds the lock)."""
        return RunDir(root)

    def _run_info(self) -> RunInfo:
        """What every event is told about the run."""
        return RunInfo(self.method, self.task.name, self.run.root, self.config.to_dict())

    def run_config(self) -> dict[str, Any]:
        """What `config.json` records: a resumed run must match it (but `resumable`)."""
        raise NotImplementedError

    def train(self) -> ResultT:
        """Run (or resume) the run in its directory; its typed result."""
        raise NotImplementedError

    @property
    def method(self) -> str:
        """What the run does (`RunInfo.method`, the result's `method`)."""
        raise NotImplementedError

    def _power(self) -> GatePower | None:
        """The run's gate on its val size (`gate.gate_power`), said before the first model
        call; None for a trainer without a gate."""
        return None

    def _trackers(self) -> list[TrainerCallback]:
        """The tracker `report_to` names, as a callback (none for `"none"`); a missing package
        fails here, before any call."""
        from selftaught.tracking import with_tracker

        return with_tracker(self.config.report_to)

    # ---- checks --------------------------------------------------------------------------
    def _check_config(self, config: Any) -> None:
        want = self.config_type.__name__
        if not isinstance(config, self.config_type):
            raise ConfigError(
                f"{type(self).__name__} needs {_a(want)} {want}, got {type(config).__name__}"
            )

    def _read_splits(
        self: BaseTrainer[Any, Any, Task],
    ) -> tuple[list[Example], list[Example], list[Example]]:
        """The task's train, val and test examples; an item in two splits (by id or by
        prompt) fails closed, naming it: val and test never feed what is learned."""
        check_disjoint(self.task)
        self.train_examples = self.task.examples("train")
        self.val_examples = self.task.examples("val")
        self.test_examples = self.task.examples("test")
        return self.train_examples, self.val_examples, self.test_examples

    def split_sizes(self) -> list[int]:
        return [len(self.train_examples), len(self.val_examples), len(self.test_examples)]

    # ---- the run -------------------------------------------------------------------------
    def _begin(self) -> bool:
        """A new run records its settings; a resumed one must match them (a changed setting
        is refused, naming it). Then `on_start`, and this invocation's clock for
        `--max-minutes`. True when resuming."""
        resuming = self.run.check_or_write_config(
            self.run_config(), ignore=set(self.resumable), defaults=self._default_run_config()
        )
        power = self._power()
        if power is not None:  # before the first model call: what this val size can show
            self.console.print(power.line(), markup=False, highlight=False, soft_wrap=True)
        self.callbacks.start(self.info)
        self.deadline = Deadline.start(self.config.stops.max_minutes)
        return resuming

    def _default_run_config(self) -> dict[str, Any]:
        """`run_config` with every setting at its default: what a saved run that predates a
        setting is read as having (`RunDir.check_or_write_config`)."""
        given = self.config
        self.config = self.config_type()
        try:
            return self.run_config()
        finally:
            self.config = given

    def _end(self, result: ResultT) -> ResultT:
        """The result written to the run directory (`result_file`), then `on_end`."""
        atomic_write_json(self.run.path(self.result_file), result.to_dict())
        self.callbacks.end(self.info, result)
        return result

    def _due_stop(self, without_accept: int, unit: str, at: str) -> StopReason | None:
        """The stop that fires at this safe point: patience (`without_accept` steps or rounds
        in a row without an accepted candidate, counted across resumes), then the clock."""
        stops = self.config.stops
        if patience_reached(stops, without_accept):
            assert stops.patience is not None
            return StopReason.patience(stops.patience, unit, at)
        if self.deadline.passed():
            assert stops.max_minutes is not None
            return StopReason.max_minutes(stops.max_minutes, at)
        return None

    def _restore_usage(self, usage: dict[str, Any]) -> None:
        """A resumed run has spent what it spent (the ledger as the state recorded it)."""
        self.ledger.roles = {role: RoleUsage(**u) for role, u in usage.items()}

    # ---- events --------------------------------------------------------------------------
    def _scored(self, step: int, result: EvalResult, label: str) -> None:
        scores = result.score()
        self.callbacks.evaluate(
            self.info, step=step, split=result.split, scores=scores, label=label
        )

    def _gated(self, step: int, details: dict[str, Any]) -> None:
        """The gate's decision (`GateResult.to_dict()`) as the `on_gate` event."""
        self.callbacks.gate(
            self.info,
            step=step,
            decision=details["decision"],
            reason=details["reason"],
            details=details,
        )

    def _log(self, msg: str) -> None:
        self.console.print(msg)
