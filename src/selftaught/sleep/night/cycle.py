"""One night: harvest → mine → split → consolidate (skill, then memory) → stage (→ adopt).

    from selftaught.sleep.night.cycle import NightConfig, run_night
    nights = run_night(NightConfig(model="http://127.0.0.1:8011/v1#SmolLM2-135M-Instruct"))

Per project with traffic since its last night (a first night looks back `lookback_days`), in
its own staging folder (`staging.NIGHT_LAYOUT`), `run_night` takes the night lock, reads each
project's window of the task log and runs `build_trainer(NightConfig(project=...), log,
models).train()`: a `NightTrainer`, which runs the night's phases over one `NightContext`,
one file each under `phases/` (`phases.default_phases`):

1. **window** (`phases/window.py`): the rows the night reads, oldest first, capped by
   `max_tasks` interactions and `max_sessions` transcript sessions (the rest waits for the
   next night), no client over its fair share (`max_client_share`). Private (harvested) rows
   never reach a remote model unless they are reviewed or `allow_remote` is set;
2. **mine** (`phases/mine.py`): tasks with checks, near-duplicates merged, past tasks
   recalled with their splits;
3. **split** (`phases/split.py`): train / val / test, disjoint (too few to gate: nothing is
   staged), weak labels (`--pseudo-k`) and synthetic variants (`--dream`) in train only,
   every task's kind of request;
4. **text** (`phases/text.py`): `SkillTrainer` consolidates the skill with the memory held
   fixed, then the memory with the new skill held fixed, both charged to ONE usage ledger;
   with many skills, **skills**: one skill per kind, each staged on its own;
5. **proofread** (`phases/proofread.py`): lines holding a block marker and lines whose
   removal costs nothing on val are dropped (leave-one-out), every line left names its
   sources;
6. **weights** (`phases/weights.py`, only with `weights` on and a local target): a LoRA
   adapter, and the same gate picks text, weights or both on the same val tasks;
7. **stage** (`phases/stage.py`): the best skill and memory (and the winning adapter) staged
   as a proposal when the gate accepted one; `auto_adopt` adopts it at once.

A night whose backend failed (a fatal error, the target failing on the baseline, every analyst
call failing, a candidate the gate could not evaluate for backend errors) ends
`backend_failed`, never "nothing to learn", and its interactions are read again next time.
The models behind a night are recorded; a change since the last night is warned about.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console

from selftaught.callbacks import CallbackList, RunInfo, TrainerCallback
from selftaught.errors import ConfigError
from selftaught.models.base import ChatModel
from selftaught.models.usage import UsageLedger
from selftaught.prompts import PromptSet, using
from selftaught.runs import (
    RunDir,
    private_dirs,
)
from selftaught.sleep import pause, replay_mark
from selftaught.sleep.adoption import staging
from selftaught.sleep.adoption.inject import BlockMarkerError
from selftaught.sleep.intake.log import Interaction, LogFilter, TaskLog
from selftaught.sleep.intake.sessions import collapse_sessions
from selftaught.sleep.lock import night_lock
from selftaught.sleep.night.config import (
    DOCUMENTS,
    MINER_OFF,
    NIGHT_TAG_ALPHA,
    NightConfig,
    NightModels,
    check_cmd_replay,
    is_cmd,
    is_remote,
    night_training_defaults,
    renamed,
)
from selftaught.sleep.night.forget import drop_forgotten
from selftaught.sleep.night.loading import (
    ModelLoader,
    cached_loader,
    default_loader,
    load_models,
    logged_upstream,
    night_marks,
    night_models,
)
from selftaught.sleep.night.phases import (
    WORKSPACE_LEFT,
    NightContext,
    NightWindow,
    Phase,
    default_phases,
    mine,
)
from selftaught.sleep.night.split import (
    SplitOverlap,
    TooFewTasks,
)
from selftaught.sleep.night.start_end import (
    auto_adopt,
    count_patience,
    empty_night,
    finish,
    night_context,
    remember,
)
from selftaught.sleep.paths import (
    private_home,
    private_project_dir,
    sleep_home,
)
from selftaught.sleep.result import NightResult
from selftaught.stops import Deadline
from selftaught.tracking import with_tracker
from selftaught.trainer_base import BaseTrainer

__all__ = [  # the night's names, also where they were before the phases had files of their own
    "DOCUMENTS",
    "MINER_OFF",
    "NIGHT_TAG_ALPHA",
    "WORKSPACE_LEFT",
    "NightConfig",
    "NightModels",
    "NightResult",
    "NightSource",
    "NightTrainer",
    "NightWindow",
    "check_cmd_replay",
    "is_cmd",
    "is_remote",
    "logged_upstream",
    "mine",
    "night_models",
    "night_training_defaults",
    "run_night",
    "window_rows",
]


def _night_events(callbacks: CallbackList, info: RunInfo, outcome: NightResult) -> None:
    """A finished project night as events: its phases as steps, val before / after, the
    staging decision, the end."""
    callbacks.start(info)
    phases = outcome.phases
    for step, (name, phase) in enumerate(phases.items(), start=1):
        metrics = {
            k: v
            for k, v in phase.to_dict().items()
            if k in ("steps", "decisions", "ran", "changed")
        }
        callbacks.step(info, step=step, metrics={"phase": name, **metrics})
    last = len(phases)
    if outcome.base_score is not None and outcome.shipped_score is not None:
        callbacks.evaluate(info, step=0, split="val", scores=outcome.base_score, label="before")
        callbacks.evaluate(
            info, step=last, split="val", scores=outcome.shipped_score, label="after"
        )
    reason = str(outcome.reason or "")
    callbacks.gate(
        info,
        step=last,
        decision=outcome.status,
        reason=reason,
        details={"status": outcome.status, "reason": reason},
    )
    callbacks.end(info, outcome)


# ---- harvest ------------------------------------------------------------------------------


def window_rows(
    log: TaskLog, config: NightConfig, home: Path, until: float
) -> dict[str, tuple[float, list[Interaction]]]:
    """(since, rows oldest first) per project with task rows in its window."""
    names = [config.project] if config.project else None
    first_night = until - config.lookback_days * 86400
    since_of: dict[str, float] = {}

    def since(project: str) -> float:
        if project not in since_of:
            start = config.since
            if start is None:
                last = staging.cursor(project, home)
                start = first_night if last is None else last
            since_of[project] = start
        return since_of[project]

    known = names or staging.projects(home)
    earliest = (
        min([since(p) for p in known] + [first_night]) if config.since is None else config.since
    )
    rows = log.query(
        LogFilter(
            project=config.project, since=earliest, until=until, errors=False, newest_first=False
        )
    )
    rows = collapse_sessions(rows)  # an agent session's turns: one episode, its last turn
    out: dict[str, tuple[float, list[Interaction]]] = {}
    for it in rows:
        if it.created_at >= since(it.project):
            out.setdefault(it.project, (since(it.project), []))[1].append(it)
    if config.project and config.project not in out:
        out[config.project] = (since(config.project), [])
    return out


def _run_phases(ctx: NightContext, phases: Sequence[Phase]) -> NightResult:
    """Each phase in order over `ctx` (its record kept by name, its time added up, the
    night's --max-minutes checked at its end); a night too small to gate or with bad adopted
    text ends there with its status, any other error is raised once the folder says what
    happened. Then what the night keeps for the next (only a night that used its rows), its
    patience count, and the night's end: its frozen `NightResult`, written, and --auto-adopt."""
    draft, config, night_dir = ctx.night, ctx.config, ctx.night_dir
    try:
        for phase in phases:
            with ctx.timed(phase.seconds):
                ctx.records[phase.name] = phase.run(ctx)
            if phase.after is not None:
                ctx.time_up(phase.after)
    except TooFewTasks as err:
        draft.status, draft.reason = "too_few_tasks", str(err)
    except (SplitOverlap, BlockMarkerError) as err:  # the latter: adopted text from before
        draft.status, draft.reason = "failed", str(err)
    except Exception as err:  # a bug or bad settings: the folder still says what happened
        draft.status, draft.reason = "failed", f"{type(err).__name__}: {err}"
        finish(night_dir, draft, ctx.evidence)
        raise
    draft.records = dict(ctx.records)
    if ctx.tasks is not None and not ctx.dry_run and draft.status in staging.ADVANCES_CURSOR:
        remember(draft, ctx.tasks, config, ctx.home)  # else: read again next night
    if not ctx.dry_run:
        count_patience(draft, config, ctx.home)
    outcome = finish(night_dir, draft, ctx.evidence)
    if config.auto_adopt and outcome.status == "staged" and not ctx.dry_run:
        return auto_adopt(outcome, night_dir, outcome.night, config, ctx.home, ctx.console)
    return outcome


def _skipped(
    project: str,
    config: NightConfig,
    home: Path,
    deadline: Deadline,
    after_one: bool,
    console: Console,
) -> bool:
    """A project this night leaves alone, saying why: its schedule is paused (a scheduled
    night only), or the night's --max-minutes passed (after at least one project); its
    interactions wait for the next night."""
    paused = pause.read(project, home).paused if config.scheduled else None
    if paused is not None:
        console.print(
            f"{project}: skipped, the schedule is paused since night {paused.night} "
            f"({paused.why}); `selftaught sleep resume --project {project}` resumes it",
            markup=False,
        )
        return True
    if after_one and deadline.passed():
        console.print(
            f"{project}: skipped, the night's --max-minutes ({config.stops.max_minutes:g}) "
            "has passed; its interactions wait for the next night",
            markup=False,
        )
        return True
    return False


@dataclass(frozen=True)
class NightSource:
    """A night's task: the project whose traffic it mines and the log that holds it
    (`build_trainer(NightConfig(project=...), log, model)`: a night's task is its log)."""

    project: str
    log: TaskLog

    @property
    def name(self) -> str:
        return self.project


class NightTrainer(BaseTrainer[NightConfig, NightResult, NightSource]):
    """One project's night as a trainer, built the way every trainer is:
    `NightTrainer(config, log, model, *, output_dir, callbacks, progress, console, ledger)`
    (through `build_trainer(NightConfig(project=...), log, model)`); `train()` runs the night
    (harvest, mine, split, the skill / memory / weight phases, the gate, staging) under the
    night lock and returns its typed, frozen `NightResult` (the phases fill a `NightDraft`,
    which the night's end makes the result, once); `callbacks` (and the tracker
    `config.report_to` names) see its phases, val before / after and the staging decision.

    Its `task` is a `NightSource` (the project and the log it mines), its `run` the night's
    folder (made when the night starts, under the lock: a night has no resume, an interrupted
    one is marked and its rows read again), its `info` the `RunInfo` its events carry.

    `log`: a `TaskLog`, its path or URL (None: `config.log_path`, else the default log);
    `model`: the target (a spec or a `ChatModel`; the config's roles load the others) or the
    `NightModels` of every role (None: `config.model`, else the logged upstream). `window`:
    the night `run_night` read under its lock (the trainer then takes no lock of its own);
    `callbacks` as a `CallbackList`: used as given (`run_night`'s, with the one tracker of
    every project's night)."""

    config_type: ClassVar[type] = NightConfig
    result_type: ClassVar[type[NightResult]] = NightResult
    result_file: ClassVar[str] = "report.json"

    def __init__(
        self,
        config: NightConfig,
        log: TaskLog | Path | str | None = None,
        model: NightModels | ChatModel | str | None = None,
        *,
        output_dir: str | Path | None = None,
        callbacks: Sequence[TrainerCallback] | CallbackList = (),
        progress: bool | None = None,
        console: Console | None = None,
        ledger: UsageLedger | None = None,
        loader: ModelLoader | None = None,
        marks: replay_mark.NightMarks | None = None,
        window: NightWindow | None = None,
        dry_run: bool = False,
        phases: Sequence[Phase] | None = None,
    ):
        self._check_config(config)
        if config.project is None:
            raise ConfigError("a NightTrainer runs one project's night: set NightConfig.project")
        self.home = config.home or sleep_home()
        self.window = window
        self.dry_run = dry_run
        self.phases: list[Phase] = list(default_phases(config) if phases is None else phases)
        self.night = window.night if window is not None else staging.new_night_id(self.home)
        self._own_dir = output_dir is None
        self._loader, self._marks = loader, marks
        self._caller_callbacks = isinstance(callbacks, CallbackList)
        show = config.progress if progress is None else progress
        self._own_log = not isinstance(log, TaskLog)
        opened = (
            log if isinstance(log, TaskLog) else TaskLog(config.log_path if log is None else log)
        )
        super().__init__(
            config,
            NightSource(config.project, opened),
            model,
            output_dir=output_dir,
            callbacks=callbacks.callbacks if isinstance(callbacks, CallbackList) else callbacks,
            progress=show,
            console=console or Console(stderr=True, quiet=not show),
            ledger=ledger,
        )

    # ---- the contract (`trainer_base.BaseTrainer`) -------------------------------------------
    @property
    def method(self) -> str:
        return "night"

    def _setup(self, model: Any) -> None:
        """The night's models (a `cmd:` one refused without its opt-in) and prompts, checked
        before any night."""
        config = self.config
        self.marks = self._marks or night_marks(config, self.home)
        self.loader = self._loader or default_loader(config, self.marks)
        self.models = night_models(model, config, self.loader)
        self.prompts = PromptSet.read(config.training.prompts)
        self._cache: dict[str, ChatModel] = {}

    def _trackers(self) -> list[TrainerCallback]:
        return [] if self._caller_callbacks else super()._trackers()

    def default_output_dir(self) -> Path:
        return staging.nights_dir(self.task.project, self.home) / self.night

    def _open_run(self, root: Path) -> RunDir:
        return RunDir(root, make=False)  # made by `_night`, under the lock, once

    def _run_info(self) -> RunInfo:
        return RunInfo(self.method, self.task.project, self.run.root, {"night": self.night})

    def run_config(self) -> dict[str, Any]:
        return self.config.to_dict()

    # ---- the night -----------------------------------------------------------------------------
    def train(self) -> NightResult:
        """The project's night: under the night lock it takes (`NightRunning`: another holds
        it), or the one `run_night` holds (`window`)."""
        try:
            if self.window is not None:
                return self._night(self.window)
            return self._locked()
        finally:
            if self._own_log:
                self.task.log.close()

    def _locked(self) -> NightResult:
        project, home, log = self.task.project, self.home, self.task.log
        private_home(home)
        kind = "dry run" if self.dry_run else "night"
        with night_lock(home, self.night, kind, project=project):
            for old in [] if self.dry_run else staging.mark_interrupted(project, home):
                self.console.print(f"{project}: night {old} had been interrupted; marked so")
            until = time.time()
            since, rows = window_rows(log, self.config, home, until)[project]
            drop_forgotten(project, home, log)
            deadline = Deadline.start(self.config.stops.max_minutes)
            return self._night(NightWindow(self.night, since, until, tuple(rows), deadline))

    def _night(self, window: NightWindow) -> NightResult:
        """The night over `window`'s rows, the lock held; its folder is made here."""
        project, home, config = self.task.project, self.home, self.config
        self.marks.project = project  # the night's calls are marked for this project's proxy
        root = self.run.root
        if self._own_dir:
            private_project_dir(project, home)  # 0700 even where an older version made it
        private_dirs(root.parent)
        root.mkdir(mode=0o700)
        rows = list(window.rows)
        if not rows:
            outcome = empty_night(project, window.night, window.since, window.until, home, root)
        else:
            models = self.models or load_models(config, rows, self.loader, self._cache)
            with using(self.prompts):  # the miner's, the judge's, the analyst's: the user's
                ctx = night_context(project, window, config, models, home, self.console, root,
                               self.dry_run, self.ledger)  # fmt: skip
                outcome = _run_phases(ctx, self.phases)
        _night_events(self.callbacks, self.info, outcome)
        return outcome


def run_night(
    config: NightConfig,
    *,
    models: NightModels | None = None,
    loader: ModelLoader | None = None,
    dry_run: bool = False,
    console: Console | None = None,
    callbacks: Sequence[TrainerCallback] = (),
) -> list[NightResult]:
    """Run one night over every project with traffic (or `config.project`): under the night
    lock, what spans projects (the window, the schedule, the clock, a dry run's scratch
    folder), then for each project `build_trainer(NightConfig(project=...), log, models)
    .train()`. Raises `NightRunning` at once when another night holds the lock. A dry run
    stages nothing: its folders go to a temporary directory (returned in each NightResult,
    deleted by the caller) and the next night reads the same interactions. Returns one
    `NightResult` per project; `callbacks` (and the tracker `config.report_to` names) see
    each project's night once it is done."""
    import tempfile

    console = console or Console(stderr=True, quiet=not config.progress)
    home = config.home or sleep_home()
    events = CallbackList(with_tracker(config.report_to, callbacks))
    marks = night_marks(config, home)
    loader = cached_loader(loader or default_loader(config, marks))
    night = staging.new_night_id(home)
    deadline = Deadline.start(config.stops.max_minutes)
    outcomes: list[NightResult] = []
    private_home(home)  # before the lock file and the log are made in it
    with night_lock(home, night, "dry run" if dry_run else "night", project=config.project):
        log = TaskLog(config.log_path)
        until = time.time()
        windows = window_rows(log, config, home, until)
        scratch = Path(tempfile.mkdtemp(prefix="selftaught-dry-run-")) if dry_run else None
        for project in [] if dry_run else staging.projects(home):
            for old in staging.mark_interrupted(project, home):  # we hold the lock: it died
                console.print(f"{project}: night {old} had been interrupted; marked so")
        for project in sorted(windows):
            since, rows = windows[project]
            if not rows and config.project is None:
                continue
            if _skipped(project, config, home, deadline, bool(outcomes), console):
                continue
            drop_forgotten(project, home, log)  # a pool written before a forget: its rows out
            window = NightWindow(night, since, until, tuple(rows), deadline)
            trainer = build_night_trainer(
                dataclasses.replace(config, project=project),
                log,
                models,
                output_dir=scratch / project if scratch is not None else None,
                callbacks=events,
                console=console,
                loader=loader,
                marks=marks,
                window=window,
                dry_run=dry_run,
            )
            outcomes.append(trainer.train())
        log.close()
    return outcomes


def build_night_trainer(
    config: NightConfig,
    task: TaskLog | Path | str | None,
    model: NightModels | ChatModel | str | None,
    **kwargs: Any,
) -> NightTrainer:
    """A night's trainer, built the one way: `build_trainer(NightConfig(...), log, models)`
    comes here, and so does each project of `run_night` (this module sits below `trainers`)."""
    return NightTrainer(config, task, model, **kwargs)


def __getattr__(name: str) -> Any:
    return renamed(__name__, name)  # SleepConfig, NightConfig's old name, with a warning
