"""One night: harvest → mine → split → consolidate (skill, then memory) → stage (→ adopt).

    from selftaught.sleep.night.cycle import SleepConfig, run_night
    nights = run_night(SleepConfig(model="http://127.0.0.1:8011/v1#SmolLM2-135M-Instruct"))

Per project with traffic since its last night (a first night looks back `lookback_days`), in
its own staging folder (`staging.NIGHT_LAYOUT`):

1. **harvest** the task log, oldest first, capped by `max_tasks` interactions and
   `max_sessions` transcript sessions (what the caps leave waits for the next night), no
   client holding more than its fair share (`max_client_share`, `window.py`: its rows over it
   are left out). Private (harvested) rows never reach a remote model (`openai:`, a
   non-loopback URL) unless they are reviewed or `allow_remote` is set;
2. **mine** tasks with checks, merge near-duplicates (`mine.py`);
3. **split** train / val / test, disjoint; too few to gate: nothing is staged (`split.py`);
   then, when asked, weak labels (`--pseudo-k`, `weak.py`) and synthetic variants
   (`--dream`, `dream.py`) join train only;
4. **consolidate** with `SkillTrainer` (reflect → merge → select → apply → gate): the skill
   with the memory held fixed, then the memory with the new skill held fixed, both charged to
   ONE usage ledger so the night's budget covers both; every call goes to the evidence log
   (`consolidate.py`);
5. **proofread** the proposal: lines holding a block marker and lines whose removal costs
   nothing on val are dropped (leave-one-out, at most `leave_one_out` val evaluations), and
   every line left names its tasks, interactions and clients (`proofread.py`);
6. **weights** (only with `weights` other than "off" and a local target): train a LoRA
   adapter on the train tasks and let the same gate pick text, weights or both on the same
   val tasks (`weight_night.py`);
7. **stage** the best skill and memory (and the winning adapter) as a proposal when the gate
   accepted one, with the report and the diagnostics; `auto_adopt` adopts it at once.

A night whose backend failed (a fatal error, the target failing on the baseline, every analyst
call failing, a candidate the gate could not evaluate for backend errors) ends
`backend_failed`, never "nothing to learn", and its interactions are read again next time.
The models behind a night are recorded; a change since the last night is warned about.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, TypeGuard
from urllib.parse import urlparse

from rich.console import Console

from selftaught.callbacks import CallbackList, RunInfo, TrainerCallback
from selftaught.demos import split_skill
from selftaught.errors import ConfigError
from selftaught.evaluation import ScoreCache, answer_dtype
from selftaught.gate import GateConfig, gate_power, smallest_accepted_gain
from selftaught.models.base import ChatModel
from selftaught.models.usage import Budget, TrackedModel, UsageLedger
from selftaught.policy import Policy
from selftaught.prompts import PromptSet, using
from selftaught.redact import redact_for_model
from selftaught.runs import (
    RunDir,
    atomic_write_json,
    atomic_write_text,
    make_private,
    private_dirs,
    write_jsonl,
)
from selftaught.serve import is_loopback
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.ledger import EditLedger
from selftaught.sleep import pause, replay_mark
from selftaught.sleep.adoption import staging
from selftaught.sleep.adoption.inject import BlockMarkerError
from selftaught.sleep.adoption.write_back import adopt_night
from selftaught.sleep.intake.log import Interaction, LogFilter, TaskLog
from selftaught.sleep.intake.sessions import collapse_sessions
from selftaught.sleep.intake.threads import logged_tools
from selftaught.sleep.kinds_file import load_kinds, save_kinds
from selftaught.sleep.lock import night_lock
from selftaught.sleep.night import recall, summary
from selftaught.sleep.night.agent_outcome import (
    WorkspaceMiner,
    for_target,
    read_outcomes,
)
from selftaught.sleep.night.agent_replay import (
    NOT_CHECKABLE,
    AgentNightTask,
    for_agent,
    is_agent,
)
from selftaught.sleep.night.consolidate import (
    Consolidation,
    backend_failure,
    consolidate,
    paired_val,
)
from selftaught.sleep.night.demo_modes import DemoModeConfig
from selftaught.sleep.night.dream import DreamConfig, dream
from selftaught.sleep.night.evidence import EvidenceLog, EvidenceModel
from selftaught.sleep.night.followup_model import ModelReader
from selftaught.sleep.night.forget import drop_forgotten
from selftaught.sleep.night.kinds import KindConfig, NightKinds, find_kinds, kind_records
from selftaught.sleep.night.mine import (
    NO_CHECK,
    MineConfig,
    MinedTask,
    MineReport,
    merge_near_duplicates,
    mine_one,
)
from selftaught.sleep.night.miner import Miner, MinerConfig, Pending, wants_check
from selftaught.sleep.night.proofread import proofread
from selftaught.sleep.night.replay import conversations, mine_tool_task, night_task
from selftaught.sleep.night.signals import REDONE, is_redo, read_threads, rejected_signals
from selftaught.sleep.night.skill_parts import SKILL_ADAPTERS
from selftaught.sleep.night.slow import night_ledger, sync_rollbacks, with_ledger
from selftaught.sleep.night.split import (
    NightTask,
    SplitConfig,
    SplitOverlap,
    TooFewTasks,
    add_train_only,
    assign_splits,
    more_tasks_for_val,
    train_only,
    train_only_use,
)
from selftaught.sleep.night.start_files import check_start_files, start_from
from selftaught.sleep.night.weak import (
    WeakConfig,
    load_waiting,
    remember_waiting,
    settle_weak,
    still_waiting,
    verify_waiting,
    weak_label,
)
from selftaught.sleep.night.weight_night import (
    WEIGHT_MODES,
    AdapterTrainer,
    NightText,
    WeightChoice,
    WeightNightConfig,
    adapter_trainer,
    discard_adapters,
    stage_adapter,
    weight_candidates,
)
from selftaught.sleep.night.window import take_fairly
from selftaught.sleep.paths import (
    Adopted,
    check_project,
    private_home,
    private_project_dir,
    sleep_home,
)
from selftaught.sleep.records import (
    AdoptedAdapter,
    BudgetRecord,
    ClientWindow,
    DreamRecord,
    GateMode,
    LateDuplicate,
    MiningRecord,
    ModelSpecs,
    NightPower,
    PairedRecord,
    PhaseRecord,
    ProofreadRecord,
    ProposalRecord,
    RecallRecord,
    SmallestGainRecord,
    SplitCounts,
    Summary,
    TrainingRecord,
    TrainOnlyUse,
    WeakRecord,
    WindowRecord,
    each,
    plain,
)
from selftaught.sleep.result import ROWS_READ_FILE, NightResult
from selftaught.stops import UNLIMITED, Deadline, StopReason, Stops
from selftaught.tasks.episode import is_tool_task
from selftaught.tasks.scorers import LlmJudge
from selftaught.tracking import check_report_to, with_tracker
from selftaught.trainer_base import BaseTrainer

DOCUMENTS = ("skill", "memory")


NIGHT_TAG_ALPHA = 0.1  # the per-kind veto's level in a night (docs/sleep-mixed-traffic.md)


def night_training_defaults() -> SkillOptConfig:
    """A night consolidates once over its train tasks (SkillOpt-Sleep: one epoch a night).
    Its gate is the margin, with the per-tag veto on every kind of request (`kinds.py`): a
    candidate that loses one kind's val items with a one-sided sign test p <= 0.1 is refused
    whatever its total (a kind of under four val items cannot veto: four losses and no win is
    p = 0.0625). No paired test on the total: a night's val set is a handful of mined tasks,
    too few for one to ever pass, and a person reviews every staged proposal before adoption."""
    return SkillOptConfig(epochs=1, batch_size=16, gate=GateConfig(tag_alpha=NIGHT_TAG_ALPHA))


@dataclass
class NightConfig:
    """A night's settings (`sleep run`'s flags), nesting the configs it runs: the skill and
    memory phases' `SkillOptConfig` (`training`, its `GateConfig` and `Budget`), the weight
    phase's `WeightNightConfig`, the `Stops`, and the mining, split, window and recall
    settings of its own. `build_trainer(NightConfig(project=...), log, model)` is one
    project's `NightTrainer`; `run_night(config)` runs every project with traffic."""

    model: str | None = None
    """Target model spec the tasks are replayed on; None: the upstream the operator's proxy
    logged (never a model named by an imported or API row). A coding agent (`claude-code`,
    `codex`, `cmd:`) replays them by running itself (`agent_replay.py`); `cmd:` only with
    `allow_cmd_replay`."""
    optimizer_model: str | None = None
    """Analyst model spec (reflects, merges); None: the target."""
    judge_model: str | None = None
    """Judge for tasks without a reference (rubrics); None: such tasks are dropped."""
    miner_model: str | None = None
    """Miner: writes a check for a row the user judged but gave no reference or rule, kept
    only when the thread's accepted reply passes it and its rejected reply fails it
    (`miner.py`); unset: the optimizer model; `off`: no miner."""
    miner: MinerConfig = field(default_factory=MinerConfig)
    """The miner's caps: rows a night, reply length, time limit."""
    project: str | None = None
    """One project; None: every project with traffic since its last night."""
    home: Path | None = None
    log_path: Path | str | None = None  # a file or a postgresql:// URL
    since: float | None = None
    """Read from here instead of the end of the last night (epoch seconds)."""
    lookback_days: float = 7.0
    """A project's first night reads this far back."""
    max_tasks: int = 200
    """Interactions read per project per night (oldest first; the rest wait)."""
    max_sessions: int = 50
    """Transcript sessions (harvested rows) read per project per night."""
    max_client_share: float = 0.25
    """At most this share of what a night reads comes from one client (an end user's key or
    label, `anonymous`, `import:<file>`, `unknown` for rows naming none); with k clients in
    the window, at least 1/k (a lone client is not capped). The operator's rows are never
    capped. A client's rows over its share are left out for good (`window.py`); 1: no cap."""
    documents: tuple[str, ...] = DOCUMENTS
    """What the night trains, in order: the skill, then the memory. Empty with `weights` on:
    a weights-only night (the adopted text is kept; the gate picks an adapter or nothing)."""
    allow_remote: bool = False
    """Send private (harvested, unreviewed) rows to remote models too."""
    allow_cmd_replay: bool = False
    """Let a `cmd:` model (target, analyst or judge) run on the night's logged traffic: it is a
    command of yours, run with your rights and no sandbox on text your users wrote. Its
    template is checked (no placeholder where a shell or interpreter reads code), but no such
    check is complete; without this a night refuses it (docs/security.md)."""
    auto_adopt: bool = False
    """Adopt the proposal at once when the gate accepted one."""
    target_skill_paths: tuple[Path, ...] = ()
    """Live files that also receive the adopted skill (with auto_adopt)."""
    follow_symlinks: bool = False
    """Write a live file that is a symlink where it points (else a symlink is refused)."""
    training: SkillOptConfig = field(default_factory=night_training_defaults)
    split: SplitConfig = field(default_factory=SplitConfig)
    demo_modes: DemoModeConfig = field(default_factory=DemoModeConfig)
    """After the skill phase: none / static / retrieved demos, gated on the same val."""
    leave_one_out: int = 8
    """Val evaluations spent dropping proposal lines that earn nothing (riders): one per added
    line when they fit, else per edit group, else per merged groups (`proofread.py`); 0: off
    (every line is staged as gated)."""
    recall_max: int = 200
    """Past tasks kept per project across nights (`recall.py`), recalled with their fixed
    splits so a quiet night still has val; the oldest are dropped (0: no recall)."""
    mining: MineConfig = field(default_factory=MineConfig)
    kinds: KindConfig = field(default_factory=KindConfig)
    """How the night groups its requests into kinds, each with an id kept across nights
    (`kinds.py`): each kind's tasks are its tag for the gate's veto, its share of recall, its
    skill with --skills, and its line in the report."""
    weak: WeakConfig = field(default_factory=WeakConfig)
    """Self-consistency labels for requests nobody checked, train only (`weak.py`)."""
    dream: DreamConfig = field(default_factory=DreamConfig)
    """Synthetic variants of train tasks, train only (`dream.py`)."""
    model_options: dict[str, Any] = field(default_factory=dict)
    """`load_model` keyword arguments (api_key, timeout_s, ...)."""
    weights: str = "off"
    """off | sft | dpo | auto: also train a LoRA adapter on the train tasks when the target is
    local (`local`, `local:PATH`), and let the gate pick text, weights or both (auto: SFT,
    plus DPO where the log holds rejected replies with their corrections)."""
    weight_training: WeightNightConfig = field(default_factory=WeightNightConfig)
    """The adapter's training: step and wall-clock caps, LoRA rank, batch, replays."""
    # many skills (nightskills): one skill per cluster of tasks, each staged on its own
    many_skills: bool = False
    """Train one skill per kind of request instead of the project's one skill: its text,
    then its memory (unless --documents skill), then with --weights an adapter as
    --skill-adapters says; each skill is staged, adopted (`sleep adopt --skill NAME`), rolled
    back and on probation on its own, memory and adapter included, and the proxy routes each
    request to one skill, its memory and its adapter."""
    skill_adapters: str = "per-skill"
    """With --skills and --weights: `per-skill` trains one adapter per kind, gated on that
    kind's val (text, weights or both, as a one-skill night chooses); `shared` trains one
    adapter on every kind's train tasks, gated on every kind's val with the per-kind veto, and
    stages it for the project (served to every request whose skill has no adapter of its
    own). The default keeps one adapter per kind: a kind's adapter then never moves another
    kind's replies, and a rollback or a probation drop of one kind's adapter leaves the others;
    the choice is to be measured on dev streams (`benchmarks/bench_stream.py --configs
    skills-per-skill,skills-shared`)."""
    skill_min_tasks: int = 4
    """With --skills: train tasks a cluster needs to get a skill of its own."""
    max_skills: int = 8
    """With --skills: at most this many skills trained a night."""
    # start documents (issue 51): the user's own files as what the night starts from
    skills_from: Path | None = None
    """With --skills: the user's SKILL.md files in this repository (.claude/skills,
    .agents/skills, .codex/skills) start the skills of their names (an adopted skill of that
    name wins); adopting one writes it back into its file, unless the file changed since."""
    start_document: Path | None = None
    """The project's skill starts from this file's text (CLAUDE.md, AGENTS.md, any Markdown)
    as if it were the adopted skill; adopting writes the adopted skill back into the file,
    unless the file changed since the night read it."""
    # --- stops: wall clock and patience over nights (issue 51, `selftaught.stops`) -------
    stops: Stops = field(default_factory=Stops)
    """`max_minutes`: the night ends its current phase cleanly (the skill trainer after its
    step) and stages only what the gate accepted; projects not reached wait for the next
    night. `patience`: that many nights in a row without an accepted proposal pause the
    project's schedule (`sleep/pause.py`)."""
    scheduled: bool = False
    """Run by a schedule (`sleep schedule` passes `--scheduled`; pass it from your own timer
    too): a project whose schedule `patience` paused is skipped, saying why."""

    val_split: bool = True
    """Hold out a validation set (`--no-val`: none, the daily-use design for a user who opts
    out of one): every mined task trains and none validates, the gate is off (every candidate
    accepted unchecked), the report says so at its top, a recalled val or test task stays
    out of the night, and a version adopted from it is on probation with auto-rollback by
    default (a live drop rolls it back, as `--auto-rollback` does). Text only: no --weights,
    no --skills."""

    allow_pooled_val: bool = False
    """Let the skill phase's gate read a pooled val (`training.pooled_val`, issue 52): refused
    in a night without this, until its false-accept rate is measured on a night's val sizes."""

    progress: bool = False
    report_to: str = "none"
    """Experiment tracker each project's night is logged to: `none`, `trackio`, `mlflow` or
    `wandb` (val before / after, the staging decision, usage, the proposal as text)."""

    def __post_init__(self) -> None:
        check_report_to(self.report_to)
        if self.project is not None:
            check_project(self.project)
        unknown = [d for d in self.documents if d not in DOCUMENTS]
        if unknown or (not self.documents and self.weights == "off"):
            raise ConfigError(
                f"documents must be among {', '.join(DOCUMENTS)} (none only with weights on), "
                f"got {self.documents}"
            )
        if self.max_tasks < 1 or self.max_sessions < 1:
            raise ConfigError("max_tasks and max_sessions must be at least 1")
        if not 0 < self.max_client_share <= 1:
            raise ConfigError(f"max_client_share must be in (0, 1], got {self.max_client_share}")
        if self.lookback_days <= 0:
            raise ConfigError("lookback_days must be positive")
        if self.leave_one_out < 0:
            raise ConfigError(f"leave_one_out must be >= 0, got {self.leave_one_out}")
        if self.recall_max < 0:
            raise ConfigError(f"recall_max must be >= 0, got {self.recall_max}")
        if self.weights not in WEIGHT_MODES:
            raise ConfigError(
                f"weights must be one of {', '.join(WEIGHT_MODES)}, got {self.weights!r}"
            )
        roles = {
            "model": self.model,
            "optimizer_model": self.optimizer_model,
            "judge_model": self.judge_model,
            "miner_model": None if self.miner_model == MINER_OFF else self.miner_model,
        }
        check_cmd_replay(roles, self.allow_cmd_replay)
        if self.many_skills and (self.skill_min_tasks < 1 or "skill" not in self.documents):
            raise ConfigError(
                "many_skills trains a skill per kind: documents must hold skill and "
                "skill_min_tasks must be >= 1"
            )
        if self.skill_adapters not in SKILL_ADAPTERS:
            raise ConfigError(
                f"skill_adapters must be one of {', '.join(SKILL_ADAPTERS)}, "
                f"got {self.skill_adapters!r}"
            )
        check_start_files(self)
        if not self.val_split:
            self._no_val()
        if self.training.pooled_val and not self.allow_pooled_val:
            raise ConfigError(
                "a night's gate does not read a pooled val (training.pooled_val) unless "
                "allow_pooled_val is set: its false-accept rate is not measured there"
            )

    # the trainer contract (`trainer_base.RunConfig`): what every run config offers
    def _no_val(self) -> None:
        """`--no-val`: nothing held out, the gate off (refused where a phase needs val)."""
        if self.weights != "off" or self.many_skills:
            raise ConfigError(
                "--no-val trains the project's skill and memory only: without val nothing can "
                "choose an adapter (--weights) or split skills (--skills)"
            )
        self.split = dataclasses.replace(self.split, val_fraction=0.0, test_fraction=0.0, min_val=0)
        gate = dataclasses.replace(self.training.gate, accept_all=True)
        self.training = dataclasses.replace(self.training, gate=gate)

    @property
    def budget(self) -> Budget:
        """The night's budget: the skill phase's, charged by every phase."""
        return self.training.budget

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON-ready values (paths as text)."""
        out: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return out


SleepConfig = NightConfig  # its name before the night was a trainer


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value) if isinstance(value, Path) else value


@dataclass
class NightModels:
    """The models of a night and the specs they were loaded from (recorded, and checked for
    remote use). Tests pass scripted models here."""

    target: ChatModel
    target_spec: str
    optimizer: ChatModel
    optimizer_spec: str
    judge: ChatModel | None = None
    judge_spec: str | None = None
    adapter_trainer: AdapterTrainer | None = None
    """Trains the night's adapters (None: `LocalAdapterTrainer` for a local target)."""
    miner: ChatModel | None = None
    """Writes checks for rows without one (`miner.py`); None: no miner."""
    miner_spec: str | None = None

    def specs(self) -> ModelSpecs:
        """report.json `models`: each role's spec and the target's name."""
        return ModelSpecs(
            target=self.target_spec,
            optimizer=self.optimizer_spec,
            judge=self.judge_spec,
            target_name=self.target.name,
            miner=self.miner_label(),
        )

    def miner_label(self) -> str | None:
        """The miner as the report names it: its spec, else its model's name."""
        if self.miner is None:
            return None
        return self.miner_spec or self.miner.name

    def remote(self) -> list[str]:
        specs: tuple[str | None, ...] = (self.target_spec, self.optimizer_spec, self.judge_spec)
        if self.miner is not None:
            specs += (self.miner_spec,)
        return [s for s in dict.fromkeys(specs) if is_remote(s)]

    def commands(self) -> dict[str, str]:
        """The roles a `cmd:` agent plays (known by its spec, or by the model passed), each
        with its spec."""
        from selftaught.models.agents.command import CommandAgent

        roles = {
            "model": (self.target, self.target_spec),
            "optimizer_model": (self.optimizer, self.optimizer_spec),
            "judge_model": (self.judge, self.judge_spec),
            "miner_model": (self.miner, self.miner_spec),
        }
        out = {}
        for role, (model, spec) in roles.items():
            inner = getattr(model, "inner", model)
            if isinstance(inner, CommandAgent):
                out[role] = inner.name  # "cmd:TEMPLATE"
            elif spec and is_cmd(spec):
                out[role] = spec
        return out


MINER_OFF = "off"


def is_cmd(spec: str | None) -> TypeGuard[str]:
    return spec is not None and spec.strip().startswith("cmd:")


def check_cmd_replay(roles: Mapping[str, str | None], allowed: bool) -> None:
    """A `cmd:` model's template is checked at once (ModelSpecError: one that could run the
    prompt as code), then ConfigError when it would run on logged traffic without the opt-in."""
    from selftaught.models.spec import parse_model_spec

    cmd = {role: spec for role, spec in roles.items() if is_cmd(spec)}
    for spec in cmd.values():
        parse_model_spec(spec)
    if cmd and not allowed:
        named = ", ".join(f"--{role.replace('_', '-')} {spec!r}" for role, spec in cmd.items())
        raise ConfigError(
            f"{named}: a night replays logged traffic (text your users wrote) on its models, "
            "and a cmd: model runs a command of yours on it, with your rights and no sandbox; "
            "its template is checked so that no placeholder is read as shell code, but no such "
            "check is complete. Pass --allow-cmd-replay (allow_cmd_replay=True) to run it "
            "anyway, under a user that holds no secrets, or use claude-code / codex (they run "
            "in their own sandbox) or a model endpoint"
        )


def is_remote(spec: str | None) -> TypeGuard[str]:
    """A model outside this machine: `openai:`, `anthropic:`, `gemini:` or a URL whose host
    is not loopback."""
    if not spec or spec == "local" or spec.startswith("local:"):
        return False
    if spec.startswith(("openai:", "anthropic:", "gemini:")):
        return True
    host = urlparse(spec.partition("#")[0]).hostname or ""
    return not is_loopback(host)


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


ModelLoader = Callable[[str], ChatModel]


# ---- harvest ------------------------------------------------------------------------------


def window_rows(
    log: TaskLog, config: SleepConfig, home: Path, until: float
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


def _private_filter(
    rows: list[Interaction], models: NightModels, allow_remote: bool
) -> tuple[list[Interaction], int]:
    remote = models.remote()
    if not remote or allow_remote:
        return rows, 0
    kept = [it for it in rows if not it.private or it.reviewed]
    return kept, len(rows) - len(kept)


def _gate_power(mode: GateMode, n_val: int, config: SleepConfig, console: Console) -> GateMode:
    """The gate's power on tonight's val tasks, said before the first training call and kept
    in the report: the smallest gain it could accept, the val tasks the gain the night looks
    for needs, and about how many more tasks of the traffic that takes."""
    gate = config.training.gate
    power = gate_power(n_val, gate, items="val tasks")
    missing = None if power.needed_val is None else power.needed_val - n_val
    more = None if missing is None else more_tasks_for_val(missing, config.split)
    line = power.line()
    if missing is not None and missing > 0:
        line += (
            f"; about {more} more checked tasks of your traffic"
            if more is not None
            else "; val takes no task (val_fraction 0)"
        )
    console.print(line, markup=False, highlight=False, soft_wrap=True)
    smallest = SmallestGainRecord.from_dict(smallest_accepted_gain(n_val, gate).to_dict())
    night_power = NightPower(
        target_gain=power.target_gain,
        needed_val=power.needed_val,
        more_tasks=more,
        val_fraction=config.split.val_fraction,
    )
    return dataclasses.replace(mode, smallest_gain=smallest, power=night_power)


def _gate_mode(training: SkillOptConfig, held_out: bool = True) -> GateMode:
    g = training.gate
    return GateMode(
        mode="off" if g.accept_all else "on",
        no_val=not held_out,
        metric=g.metric,
        margin=g.margin,
        confidence=g.confidence,
        tag_alpha=g.tag_alpha,
        tag_margin=g.tag_margin,
    )


class _Verdict(NamedTuple):
    """How a night that consolidated ends: its status, why, and the proposal it staged."""

    status: str
    reason: str
    proposal: ProposalRecord | None = None


def _summary(d: Mapping[str, Any] | None) -> Summary | None:
    return Summary.from_dict(d) if d is not None else None


def _outcome(
    night: NightResult,
    night_dir: Path,
    adopted: Adopted,
    result: Consolidation,
    evidence: EvidenceLog,
    config: SleepConfig,
    choice: WeightChoice | None = None,
    base_spec: str = "",
) -> None:
    """Status, reason and proposal of a night whose consolidation ran (with `choice`: the
    gate's pick among text, weights and both decides)."""
    night.phases = {
        d: PhaseRecord.from_dict({k: v for k, v in p.items() if k != "best"})
        for d, p in result.phases.items()
    }
    night.usage = result.ledger.to_dict()
    failure = backend_failure(result, evidence, config.training.gate.max_missing)
    if failure is not None:
        night.status, night.reason = "backend_failed", failure
        return
    if choice is not None:
        night.weights = choice.record()
        verdict = _weights_outcome(night_dir, adopted, result, config, choice, base_spec,
                                   night.proofread)  # fmt: skip
    else:
        verdict = _text_outcome(night_dir, adopted, result, config, night.proofread, night.notes)
    night.status, night.reason, night.proposal = verdict


def _text_outcome(
    night_dir: Path,
    adopted: Adopted,
    result: Consolidation,
    config: SleepConfig,
    proofread: ProofreadRecord | None,
    notes: Sequence[str],
) -> _Verdict:
    """Stage the night's text when it changed; else why nothing was proposed."""
    changed = result.skill.strip() != adopted.skill.strip() or (
        result.memory.strip() != adopted.memory.strip()
    )
    ran = [p for p in result.phases.values() if p.get("ran")]
    if not changed:
        reason = summary.why_nothing(night_dir, each(PhaseRecord)(result.phases))
        dropped = proofread.dropped if proofread is not None else ()
        if dropped:
            reason = (
                f"nothing to propose: leave-one-out dropped every line the night proposed "
                f"({len(dropped)}: each earned nothing on val, or held a block marker)"
            )
        prefix = "weights: "  # the notes `weight_candidates` wrote
        weight_notes = [n.removeprefix(prefix) for n in notes if n.startswith(prefix)]
        if not result.phases and weight_notes:  # a weights-only night: why no adapter
            reason = "nothing to propose: " + "; ".join(weight_notes)
        return _Verdict("no_proposal", reason)
    changes = staging.write_proposal(night_dir, adopted, result.skill, result.memory)
    first, last = ran[0], ran[-1]
    before = Summary.from_dict(first["val_initial"])
    after = Summary.from_dict(result.val_final or last["val_best"])
    proposal = ProposalRecord(
        skill_changed=changes["skill"],
        memory_changed=changes["memory"],
        lines=proofread.kept if proofread is not None else (),
        val_before=before,
        val_after=after,
        paired=PairedRecord.from_dict(paired_val(result, adopted, result.skill, result.memory)),
        test=_summary(last.get("test")),
    )
    gate = "gate off: accepted without a check" if config.training.gate.accept_all else "gate"
    what = " and ".join(k for k in ("skill", "memory") if changes[k])
    reason = f"a new {what} was proposed ({gate}): val {before.hard:.3f} → {after.hard:.3f}"
    return _Verdict("staged", reason, proposal)


def _weights_outcome(
    night_dir: Path,
    adopted: Adopted,
    result: Consolidation,
    config: SleepConfig,
    choice: WeightChoice,
    base_spec: str,
    proofread: ProofreadRecord | None,
) -> _Verdict:
    """Stage what the gate chose among text, weights and both (the adapter in `adapter/`)."""
    if choice.winner == "current":
        discard_adapters(night_dir)
        return _Verdict("no_proposal", f"the gate kept the adopted version: {choice.why}")
    text = choice.with_text
    skill, memory = (result.skill, result.memory) if text else (adopted.skill, adopted.memory)
    changes = staging.write_proposal(night_dir, adopted, skill, memory)
    ran = [p for p in result.phases.values() if p.get("ran")]
    before = Summary.from_dict(choice.candidates["current"])
    after = Summary.from_dict(choice.candidates[choice.winner])
    if choice.adapter is not None:
        adapter = stage_adapter(choice, night_dir, base_spec)
    else:
        adapter = None
        discard_adapters(night_dir)
    proposal = ProposalRecord(
        skill_changed=changes["skill"],
        memory_changed=changes["memory"],
        lines=proofread.kept if proofread is not None and text else (),
        val_before=before,
        val_after=after,
        paired=PairedRecord.from_dict(choice.paired()),
        test=_summary(ran[-1].get("test")) if choice.winner == "text" and ran else None,
        candidate=choice.winner,
        adapter=adapter,
    )
    gate = "gate off: accepted without a check" if config.training.gate.accept_all else "gate"
    reason = f"the {gate} chose {choice.winner}: val {before.hard:.3f} → {after.hard:.3f}"
    return _Verdict("staged", reason, proposal)


def _weights(
    night: NightResult,
    config: SleepConfig,
    models: NightModels,
    task: NightTask,
    mined: _Mined,
    adopted: Adopted,
    result: Consolidation,
    night_dir: Path,
    evidence: EvidenceLog,
    console: Console,
) -> WeightChoice | None:
    """The weight candidates and the gate's choice; None: the night stays text-only."""
    if config.weights == "off":
        return None
    if backend_failure(result, evidence, config.training.gate.max_missing) is not None:
        return None
    trainer = adapter_trainer(
        models.adapter_trainer, models.target_spec, config.weight_training, models.target
    )
    if trainer is None:
        night.note(
            f"weights not trained: the target {models.target_spec!r} is not a local model "
            "(`local` or `local:PATH`); the night stayed text-only"
        )
        return None
    if night.training is not None:
        night.training = dataclasses.replace(night.training, weights=config.weights)
    dropped: list[LateDuplicate] = []
    choice, notes = weight_candidates(
        config.weights,
        config.weight_training,
        config.training,
        task,
        mined.splits["train"],
        models.target,
        trainer,
        NightText(adopted, result.skill, result.memory),
        night_dir,
        evidence,
        result.ledger,
        console,
        dropped,
    )
    night.note(*notes)
    night.drop_duplicates(*dropped)
    return choice


# ---- one project ----------------------------------------------------------------------------


def _new_night(
    project: str, night: str, night_dir: Path, models: NightModels, config: SleepConfig, home: Path
) -> NightResult:
    """The night as it starts (report.json's first write, as running)."""
    training = config.training
    return NightResult(
        project=project,
        night_dir=night_dir,
        night=night,
        status="running",
        pid=os.getpid(),
        started_at=time.time(),
        models=models.specs(),
        gate=_gate_mode(training, config.split.held_out),
        training=TrainingRecord(
            epochs=training.epochs,
            batch_size=training.batch_size,
            rollouts_k=training.rollouts_k,
            concurrency=training.concurrency,
            documents=tuple(config.documents),
            preferences=bool(training.preferences.strip()),
            prompts=PromptSet.read(training.prompts).digests() or None,
        ),
        budget=BudgetRecord.from_dict(plain(dataclasses.asdict(training.budget))),
        base_version=staging.current_version(project, home),
    )


def _model_change(now: ModelSpecs | None, project: str, home: Path) -> str | None:
    last = staging.last_models(project, home)
    if last is None or now is None:
        return None
    night, before = last
    keys = ("target", "optimizer", "judge", "target_name")
    changed = [k for k in keys if getattr(before, k) != getattr(now, k)]
    if not changed:
        return None
    parts = ", ".join(f"{k} {getattr(before, k)!r} → {getattr(now, k)!r}" for k in changed)
    return (
        f"the models changed since night {night} ({parts}): a skill learned for one model may "
        "not suit another"
    )


def mine(
    interactions: list[Interaction],
    config: MineConfig,
    rejected: set[str] | None = None,
    unchecked: list[Interaction] | None = None,
    miner: Miner | None = None,
    workspaces: WorkspaceMiner | None = None,
) -> tuple[list[MinedTask], MineReport]:
    """Tasks from `interactions` (already filtered for privacy by the caller), with a report
    of what was dropped and why: chat threads read for the user's own verdicts first
    (`signals.read_threads`; `rejected`: signals the operator rejected), coding agents' rows
    for their own test runs (`agent_outcome.read_outcomes`), then a solved agent row with a
    session record through `workspaces` (a workspace task, when its check is two-sided),
    plain exchanges through `mine.mine_one`, tool-using conversations through
    `replay.mine_tool_task` (here, above both, so neither imports the other back). `miner`
    reads the next turns the rules could not (`followup_model.py`, when `read_followups` is
    set) and writes checks for the plain exchanges left without a strong one (`miner.py`).
    `unchecked`: receives the plain exchanges still dropped for having nothing to check them
    by (`mine.NO_CHECK`), as rows read from their threads, for `weak.py` (they are still
    counted as dropped)."""
    report = MineReport(read=len(interactions))
    reader = ModelReader(miner) if miner is not None and miner.config.read_followups else None
    rows, _, conversation = read_threads(interactions, config, rejected, reader)
    rows, _, agent = read_outcomes(rows, rejected)
    if workspaces is not None:
        workspaces.report = agent
    for kind, n in agent.signals.items():  # one count of signals by kind, whatever the source
        conversation.signals[kind] = conversation.signals.get(kind, 0) + n
    report.conversation = conversation.to_dict()
    dropped: Counter[str] = Counter()
    redone = sum(is_redo(it) for it in rows)  # a retry's reply, and its episode's tool calls
    if redone:
        dropped[REDONE] = redone
    tasks: list[MinedTask] = []
    steps = 0  # earlier steps of a tool-using conversation, folded into its last one
    pending: list[Pending] = []  # plain exchanges without a strong check, for the miner
    for group in conversations([it for it in rows if not is_redo(it)]):
        steps += len(group) - 1
        task = workspaces.mine(group[0], config) if workspaces is not None else None
        why: str | None = None
        if task is None and logged_tools(group[0]):
            task, why = mine_tool_task(group, config)
        elif task is None:
            task, why = mine_one(group[0], config)
            if miner is not None and wants_check(task, why):
                pending.append(Pending(group[0], task, why))
                continue
        _keep(group[0], task, why, tasks, dropped, unchecked)
    if miner is not None:
        found, written = miner.resolve(pending, rows)
        report.miner = written.to_dict()
        for p, (task, why) in zip(pending, found, strict=True):
            _keep(p.row, task, why, tasks, dropped, unchecked)
    merged = merge_near_duplicates(tasks, config.near_duplicate)
    seen: Counter[str] = Counter()
    for task in merged:  # equal ids from prompts that differ only in punctuation
        seen[task.id] += 1
        if seen[task.id] > 1:
            task.id = f"{task.id}-{seen[task.id]}"
    report.merged = len(tasks) - len(merged) + steps
    report.tasks = len(merged)
    report.by_check = dict(Counter(t.check for t in merged))
    report.negative = sum(t.negative for t in merged)
    report.dropped = dict(dropped)
    report.agent = agent.to_dict()
    return merged, report


def _keep(
    row: Interaction,
    task: MinedTask | None,
    why: str | None,
    tasks: list[MinedTask],
    dropped: Counter[str],
    unchecked: list[Interaction] | None,
) -> None:
    """A mined row's outcome: its task kept, or why it was dropped (and, with nothing to check
    it by, handed to the weak labels)."""
    if task is not None:
        tasks.append(task)
        return
    dropped[why or "unknown"] += 1
    if unchecked is not None and (why or "").startswith(NO_CHECK):
        unchecked.append(row)


@dataclass
class _Mined:
    """Tonight's tasks, the night's splits (tonight's and recalled tasks), and what the
    recall pool needs to be written back after the night."""

    tonight: list[MinedTask]
    splits: dict[str, list[MinedTask]]
    rest: list[recall.Recalled]
    private_ids: set[str]
    ledger: UsageLedger = field(default_factory=UsageLedger)
    """The night's one ledger: the miner's calls, weak-label samples and dream paraphrases
    are charged to it before consolidation goes on charging it."""
    weak_waiting: list[dict[str, Any]] | None = None
    """The project's weak-label file after the night (None: weak labels off)."""
    kinds: NightKinds | None = None
    """Every task's kind of request, and the kinds after tonight (`kinds.py`)."""


def _night_miner(
    config: SleepConfig,
    models: NightModels,
    mining: MineConfig,
    ledger: UsageLedger,
    evidence: EvidenceLog,
) -> Miner | None:
    """The night's miner, its calls (and the judge's, testing its rubrics) charged to the
    night's ledger and evidence log; None when the night has none."""
    if models.miner is None:
        return None
    config.training.budget.check_priced([models.miner.name])
    judge = None
    if models.judge is not None:
        tracked = TrackedModel(EvidenceModel(models.judge, evidence, "judge"), ledger, "judge")
        judge = LlmJudge(tracked)
    return Miner(
        TrackedModel(EvidenceModel(models.miner, evidence, "miner"), ledger, "miner"),
        models.miner_label() or "miner",
        config.miner,
        judge=judge,
        send_private=config.allow_remote or not is_remote(models.miner_spec),
        mining=mining,
    )


def _mine_and_split(
    night: NightResult,
    rows: list[Interaction],
    config: SleepConfig,
    models: NightModels,
    adopted: Adopted,
    home: Path,
    evidence: EvidenceLog,
    ledger: UsageLedger,
) -> _Mined:
    """Mine tonight's tasks, recall past ones, split them, then (when asked) add weak labels
    and dreamt variants to train; each section is the night's as soon as it is known (a night
    too small to gate still reports its mining). Every call is charged to `ledger`."""
    kept, withheld = _private_filter(rows, models, config.allow_remote)
    mining = dataclasses.replace(config.mining, judge=models.judge is not None)
    unchecked: list[Interaction] = []
    miner = _night_miner(config, models, mining, ledger, evidence)
    rejected = rejected_signals(night.project, home)
    workspaces = WorkspaceMiner(night.project, home)
    tasks, mined = mine(kept, mining, rejected, unchecked, miner, workspaces)
    mined.withheld_private = withheld
    night.mining = MiningRecord.from_dict(mined.to_dict())
    if ledger.roles:  # the miner's calls, even when the night stops before consolidating
        night.usage = ledger.to_dict()
    if mined.miner.get("backend_errors"):
        night.note(
            f"{mined.miner['backend_errors']} miner calls failed (first: "
            f"{mined.miner['first_error']}); those rows were left without a written check"
        )
    if withheld:
        night.note(
            f"{withheld} private (harvested) interactions were left out: "
            f"{', '.join(models.remote())} is a remote model; mark them reviewed or pass "
            "--allow-remote to use them"
        )
    combined, rest = _recall(night, tasks, config, models, adopted, home, mining)
    combined = _checkable(night, combined, tasks, is_agent(models.target))
    dropped: list[LateDuplicate] = []
    try:
        splits = assign_splits(combined, config.split, mining.near_duplicate, dropped)
    finally:  # a split too small after its drops still says what it dropped
        night.drop_duplicates(*dropped)
    private_ids = {it.id for it in kept if it.private and not it.reviewed}
    waiting = None
    if config.weak.k and is_agent(models.target):
        night.note("weak labels: not sampled on an agent target")
    elif config.weak.k:
        target = TrackedModel(EvidenceModel(models.target, evidence, "target"), ledger, "target")
        policy = Policy(adopted.skill, adopted.memory)
        waiting, night.weak = _weak_labels(night, unchecked, combined, splits, config, target,
                                           policy, home)  # fmt: skip
    if config.dream.n:
        analyst = EvidenceModel(models.optimizer, evidence, "optimizer")
        _, dreamt = dream(
            splits,
            config.dream,
            TrackedModel(analyst, ledger, "optimizer"),
            config.training,
            mining.near_duplicate,
            config.split.seed,
        )
        night.dream = DreamRecord.from_dict(dreamt.to_dict())
    mined_now = {id(t) for t in tasks}
    recalled = [t for t in combined if id(t) not in mined_now]
    kinds = _kinds(night, splits, recalled, config, home)
    return _Mined(tasks, splits, rest, private_ids, ledger, waiting, kinds)


def _kinds(
    night: NightResult,
    splits: dict[str, list[MinedTask]],
    recalled: list[MinedTask],
    config: SleepConfig,
    home: Path,
) -> NightKinds:
    """Every task of the night given its kind of request (`kinds.py`); recalled and dreamt
    tasks are not tonight's traffic. With many skills, a starting skill that is no kind yet
    takes the tasks its card routes (`skills.starting_cards`)."""
    from selftaught.sleep.adoption.skill_units import skill_names
    from selftaught.sleep.night.skills import starting_cards

    seeds = starting_cards(night.project, home, config.skills_from) if config.many_skills else []
    tasks = [t for split in splits.values() for t in split]
    dreamt = [t for t in tasks if train_only(t) == "synthetic"]
    return find_kinds(
        tasks,
        load_kinds(night.project, home),
        config.kinds,
        night.night,
        not_traffic={t.id for t in [*recalled, *dreamt]},
        seeds=seeds,
        reserved={*skill_names(night.project, home), *(c.name for c in seeds)},
    )


def _recall(
    night: NightResult,
    tasks: list[MinedTask],
    config: SleepConfig,
    models: NightModels,
    adopted: Adopted,
    home: Path,
    mining: MineConfig,
) -> tuple[list[MinedTask], list[recall.Recalled]]:
    """Tonight's tasks and the recalled ones (`recall.combine`), the night's `recall`
    recorded; the pool's records to write back after the night."""
    pool = recall.load(night.project, home) if config.recall_max else []
    combined, recalled, rest = recall.combine(
        tasks,
        pool,
        threshold=mining.near_duplicate,
        private_ok=config.allow_remote or not models.remote(),
        pinned=split_skill(adopted.skill).demos,
    )
    night.recall = RecallRecord(
        pool=recalled.pool,
        recalled=dict(recalled.recalled),
        mined_again=recalled.mined_again,
        pinned_train=recalled.pinned_train,
        withheld_private=recalled.withheld_private,
        max=config.recall_max,
    )
    return combined, rest


def _weak_labels(
    night: NightResult,
    unchecked: list[Interaction],
    checked: list[MinedTask],
    splits: dict[str, list[MinedTask]],
    config: SleepConfig,
    target: ChatModel,
    policy: Policy,
    home: Path,
) -> tuple[list[dict[str, Any]], WeakRecord]:
    """Weak labels (`weak.py`) added to train after the split (a night too small to gate
    spends nothing on them), past ones scored where a real reference came since: what the
    project's weak-label file is to hold after the night, and the night's `weak`."""
    found, labels = weak_label(
        unchecked, checked, config.weak, config.mining, target, policy, config.training
    )
    add_train_only(splits, found, config.mining.near_duplicate)
    settle_weak(splits, found, config.weak, labels)
    past = load_waiting(night.project, home)
    left = verify_waiting(past, checked, config.mining.near_duplicate, labels)
    waiting = still_waiting(left, found, night.night)
    labels.waiting = len(waiting)
    return waiting, WeakRecord.from_dict(labels.to_dict())


WORKSPACE_LEFT = "a workspace task (the agent's own test run) needs an agent target or its folder"


def _checkable(
    night: NightResult, combined: list[MinedTask], tonight: list[MinedTask], agent: bool
) -> list[MinedTask]:
    """The tasks the target can be checked on: on an agent, those its run can be checked on
    (`agent_replay.for_agent`); the workspace tasks only on an agent or with their folder
    (`agent_outcome.for_target`). The others are counted among tonight's dropped, or noted
    when recalled."""
    if agent:
        combined, left = for_agent(combined)
        _leave_out(night, left, tonight, NOT_CHECKABLE)
    kept, left = for_target(combined, agent)
    _leave_out(night, left, tonight, WORKSPACE_LEFT)
    return kept


def _leave_out(
    night: NightResult, left: list[MinedTask], tonight: list[MinedTask], why: str
) -> None:
    tonight_ids = {id(t) for t in tonight}
    mined_left = sum(id(t) in tonight_ids for t in left)
    if mined_left and night.mining is not None:
        dropped = dict(night.mining.dropped)
        dropped[why] = dropped.get(why, 0) + mined_left
        night.mining = dataclasses.replace(night.mining, dropped=dropped)
    if len(left) > mined_left:
        night.note(f"{len(left) - mined_left} recalled tasks were left out: {why}")


def run_project(
    project: str,
    night: str,
    since: float,
    until: float,
    rows: list[Interaction],
    config: SleepConfig,
    models: NightModels,
    home: Path,
    console: Console,
    night_dir: Path,
    dry_run: bool = False,
    deadline: Deadline = UNLIMITED,
    ledger: UsageLedger | None = None,
) -> NightResult:
    """One project's night, staged in `night_dir` (report.json is written first, as running);
    `deadline`: the night's `--max-minutes`, checked between phases; `ledger`: charged with
    every call of the night (None: a new one on the config's budget). The `NightResult` is
    built phase by phase; report.json is always its `report_dict()`."""
    ledger = ledger or UsageLedger(budget=config.budget)
    outcome = _new_night(project, night, night_dir, models, config, home)
    adopted = start_from(outcome, staging.read_adopted_files(project, home), config.start_document)
    models = _as_served(models, adopted, outcome)
    taken = _take_window(outcome, rows, since, until, config)
    # the ids (never the words) of what it read: a forget --everywhere finds the night by them
    atomic_write_text(night_dir / ROWS_READ_FILE, "".join(f"{it.id}\n" for it in taken))
    change = _model_change(outcome.models, project, home)
    if change:
        outcome.note(change)
        console.print(f"[bold yellow]warning:[/] {project}: {change}")
    # slow update (issue 51): the trainers write the project's edit ledger, rollbacks noted
    edits = night_ledger(project, home, night_dir, dry_run)
    config = dataclasses.replace(config, training=with_ledger(config.training, edits))
    sync_rollbacks(project, home, EditLedger(config.training.edit_ledger or edits))
    atomic_write_json(night_dir / "report.json", outcome.report_dict())
    evidence = EvidenceLog(night_dir / "evidence.jsonl")
    mined: _Mined | None = None
    try:
        with _timed(outcome, "mine"):
            mined = _mine_and_split(outcome, taken, config, models, adopted, home, evidence,
                                    ledger)  # fmt: skip
        _learn(outcome, mined, config, models, adopted, night_dir, evidence, console, deadline)
    except TooFewTasks as err:
        outcome.status, outcome.reason = "too_few_tasks", str(err)
    except (SplitOverlap, BlockMarkerError) as err:  # the latter: adopted text from before
        outcome.status, outcome.reason = "failed", str(err)
    except Exception as err:  # a bug or bad settings: the folder still says what happened
        outcome.status, outcome.reason = "failed", f"{type(err).__name__}: {err}"
        _finish(night_dir, outcome, evidence)
        raise
    if mined is not None and not dry_run and outcome.status in staging.ADVANCES_CURSOR:
        _remember(outcome, mined, config, home)  # else: read again next night
    if not dry_run:
        _count_patience(outcome, config, home)
    _finish(night_dir, outcome, evidence)
    if config.auto_adopt and outcome.status == "staged" and not dry_run:
        outcome = _auto_adopt(outcome, night_dir, night, config, home, console)
    return outcome


def _remember(night: NightResult, mined: _Mined, config: SleepConfig, home: Path) -> None:
    """Keep tonight's tasks for the nights to come (`recall.py`), the weak labels still
    waiting for a reference (`weak.py`) and the kinds found (`kinds.py`), once the night has
    used its interactions."""
    if config.recall_max and night.recall is not None:
        pool_after = recall.remember(night.project, home, night.night, mined.tonight,
                                     mined.rest, mined.private_ids, config.recall_max)  # fmt: skip
        night.recall = dataclasses.replace(night.recall, pool_after=pool_after)
    if mined.kinds is not None:
        save_kinds(night.project, home, mined.kinds.kinds, mined.kinds.similarity)
    if mined.weak_waiting is not None:
        remember_waiting(night.project, home, mined.weak_waiting)


def _count_patience(night: NightResult, config: SleepConfig, home: Path) -> None:
    """Count the night toward `--patience` (`sleep/pause.py`); the stop when it fired."""
    project = night.project
    stop = pause.count_night(project, night.night, night.status, config.stops.patience, home)
    if stop is not None:
        night.stopped_by = stop  # it outranks max-minutes: it pauses the schedule
        night.note(
            f"stopped by {stop}: the schedule of {project} is paused "
            f"(`selftaught sleep resume --project {project}` resumes it)"
        )


def _time_up(night: NightResult, config: SleepConfig, deadline: Deadline, at: str) -> bool:
    """Whether the night's `--max-minutes` has passed at this phase boundary; the first time,
    the stop is recorded."""
    if not deadline.passed():
        return False
    if night.stopped_by is None:
        assert config.stops.max_minutes is not None
        stop = StopReason.max_minutes(config.stops.max_minutes, at)
        night.stopped_by = stop
        night.note(
            f"stopped by {stop}: the phases after it were skipped; only what the gate accepted "
            "is staged"
        )
    return True


@contextmanager
def _timed(night: NightResult, phase: str) -> Iterator[None]:
    """Add the block's wall seconds to the night's `phase_seconds[phase]` (what a night
    costs)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        night.add_seconds(phase, time.perf_counter() - t0)


def _as_served(models: NightModels, adopted: Adopted, night: NightResult) -> NightModels:
    """The night measures the agent as it serves: with the adopted version's adapter, when it
    has one (a weight night then goes on training that adapter)."""
    if adopted.adapter is None:
        return models
    from selftaught.models.adapters import with_adapter
    from selftaught.models.local import LocalModel

    night.adapter = AdoptedAdapter(version=adopted.version, dir=str(adopted.adapter))
    if not isinstance(models.target, LocalModel):
        night.note(
            f"version {adopted.version} serves an adapter, but the night's target "
            f"{models.target_spec!r} is not a local model: val was measured without it"
        )
        return models
    return dataclasses.replace(models, target=with_adapter(models.target, adopted.adapter))


def _take_window(
    night: NightResult, rows: list[Interaction], since: float, until: float, config: SleepConfig
) -> list[Interaction]:
    """The rows this night reads (the caps may leave the newest for the next night, a client's
    rows over its share are left out)."""
    take = take_fairly(rows, config.max_tasks, config.max_sessions, config.max_client_share)
    taken, capped = take.rows, take.capped
    night.window = WindowRecord(
        since=since,
        until=until,
        read=len(taken),
        capped=capped,
        max_client_share=config.max_client_share,
        allowance=take.allowance,
        share=take.share,
        clients={
            c: ClientWindow(window=n, read=take.read[c], left_out=take.left_out[c])
            for c, n in take.window.most_common()
        },
    )
    night.consumed_until = taken[-1].created_at + 1e-6 if capped and taken else until
    for client, n in take.left_out.items():
        night.note(
            f"client {client!r} sent {take.window[client]} of the window's {len(rows)} "
            f"interactions: {take.read[client]} read, {n} left out over its share "
            f"({take.allowance} rows, {take.share:.0%} of the night)"
        )
    if capped:
        waiting = len(rows) - len(taken) - sum(take.left_out.values())
        night.note(f"stopped reading at {capped}: {waiting} interactions wait for the next night")
    return taken


def _learn(
    night: NightResult,
    mined: _Mined,
    config: SleepConfig,
    models: NightModels,
    adopted: Adopted,
    night_dir: Path,
    evidence: EvidenceLog,
    console: Console,
    deadline: Deadline = UNLIMITED,
) -> None:
    """Write the night's tasks, consolidate a skill and memory on them, record the outcome;
    past `deadline`, the phases left are skipped (proofreading spends no val calls)."""
    splits = mined.splits
    night.splits = SplitCounts(
        train=len(splits["train"]), val=len(splits["val"]), test=len(splits["test"])
    )
    if night.gate is not None:
        night.gate = _gate_power(night.gate, len(splits["val"]), config, console)
    task = _write_tasks(night, mined, models, night_dir)
    _time_up(night, config, deadline, "after mining")
    if config.many_skills and mined.kinds is not None:  # many skills: one per kind, apart
        from selftaught.sleep.night.skills import learn_skills

        home = config.home or sleep_home()
        with _timed(night, "skills"):
            learn_skills(night, task, config, models, night_dir, evidence, mined.ledger,
                         console, home, mined.kinds, mined.splits, deadline)  # fmt: skip
        return
    with _timed(night, "text"):
        result = consolidate(
            config.training,
            config.documents,
            config.progress,
            task,
            models.target,
            models.optimizer,
            models.judge,
            adopted,
            night_dir,
            evidence,
            console,
            modes=config.demo_modes,
            ledger=mined.ledger,
            deadline=deadline,
        )
    night.note(*result.notes)
    night.drop_duplicates(*result.duplicates)
    late = _time_up(night, config, deadline, "after the text phase")
    if late:  # the gated proposal is staged as the gate took it: no leave-one-out calls
        config = dataclasses.replace(config, leave_one_out=0)
    with _timed(night, "proofread"):
        done = _proofread(result, adopted, task, models.target, config, night_dir, evidence,
                          splits)  # fmt: skip
        if done is not None:
            night.proofread = done
            night.note(*done.notes)
    late = late or _time_up(night, config, deadline, "after proofreading")
    with _timed(night, "weights"):
        choice = None
        if late and config.weights != "off":
            night.note("weights not trained: the night's --max-minutes had passed")
        elif not late:
            choice = _weights(
                night, config, models, task, mined, adopted, result, night_dir, evidence, console
            )
    _outcome(night, night_dir, adopted, result, evidence, config, choice, models.target_spec)
    _train_only_use(night, night_dir, splits)
    if mined.kinds is not None:
        night.kinds = kind_records(mined.kinds, *_val_by_item(night, result, adopted))


def _val_by_item(
    night: NightResult, result: Consolidation, adopted: Adopted
) -> tuple[dict[str, float | None] | None, dict[str, float | None] | None]:
    """Each val task's hard score before the night (the adopted text) and after it (the staged
    text; nothing staged: the adopted one), from the scores the phases kept; None where not
    measured (no text phase ran; the gate chose an adapter, measured on its own)."""
    caches = list(result.val_scores.values())
    if not caches:
        return None, None
    scores = caches[0].merged(*caches[1:])
    before = _hard(scores.get(Policy(adopted.skill, adopted.memory).skill_hash()))
    proposal = night.proposal if night.status == "staged" else None
    if proposal is None:
        return before, before
    if proposal.candidate not in (None, "text"):
        return before, None
    return before, _hard(scores.get(Policy(result.skill, result.memory).skill_hash()))


def _hard(items: Mapping[str, Sequence[float] | None]) -> dict[str, float | None] | None:
    return {i: None if v is None else float(v[0]) for i, v in items.items()} or None


def _write_tasks(
    night: NightResult, mined: _Mined, models: NightModels, night_dir: Path
) -> NightTask:
    """tasks.jsonl (every task of the night, recalled ones marked) and the task the night
    replays them with: on the agent itself, else on a chat model (the night's `replay`)."""
    tonight = {id(t) for t in mined.tonight}
    rows_out = [
        {**summary.task_row(t), "recalled": id(t) not in tonight}
        for s in mined.splits.values()
        for t in s
    ]
    write_jsonl(night_dir / "tasks.jsonl", rows_out)
    agent = is_agent(models.target)
    project = night.project
    task = AgentNightTask(project, mined.splits) if agent else night_task(project, mined.splits)
    night.replay = "agent" if agent else "episode" if is_tool_task(task) else "reply"
    return task


def _train_only_use(
    night: NightResult, night_dir: Path, splits: dict[str, list[MinedTask]]
) -> None:
    """Whether what the night staged used its weak or synthetic tasks (`split.train_only_use`)."""
    staged = night_dir / "proposal" / "skill.md"
    skill = staged.read_text() if staged.is_file() else None
    used = train_only_use(splits, skill, night.proposal)
    empty = TrainOnlyUse.from_dict({})  # nothing staged: read back as `{}`, as written
    if night.weak is not None:
        night.weak = dataclasses.replace(night.weak, shipped=used.get("weak", empty))
    if night.dream is not None:
        night.dream = dataclasses.replace(night.dream, shipped=used.get("synthetic", empty))


def _proofread(
    result: Consolidation,
    adopted: Adopted,
    task: NightTask,
    target: ChatModel,
    config: SleepConfig,
    night_dir: Path,
    evidence: EvidenceLog,
    splits: dict[str, list[MinedTask]],
) -> ProofreadRecord | None:
    """Drop the proposal's riders and name every line's sources (`proofread.py`); the
    result's documents, val and score caches follow. None: nothing to proofread."""
    unchanged = result.skill.strip() == adopted.skill.strip() and (
        result.memory.strip() == adopted.memory.strip()
    )
    if unchanged or backend_failure(result, evidence, config.training.gate.max_missing):
        return None
    caches = list(result.val_scores.values())
    cache = caches[0].merged(*caches[1:]) if caches else ScoreCache(dtype=answer_dtype(target))
    done = proofread(
        result.skill,
        result.memory,
        adopted,
        task,
        TrackedModel(EvidenceModel(target, evidence, "target"), result.ledger, "target"),
        config.training,
        cache,
        {"skill": night_dir, "memory": night_dir / "memory"},
        config.leave_one_out,
    )
    result.val_scores["proofread"] = cache
    result.skill, result.memory = done.skill, done.memory
    if done.val is not None:
        result.val_final = done.val.summary()
    return done.record({t.id: t for s in splits.values() for t in s})


def _auto_adopt(
    outcome: NightResult,
    night_dir: Path,
    night: str,
    config: SleepConfig,
    home: Path,
    console: Console,
) -> NightResult:
    project = outcome.project
    if config.many_skills:  # each staged skill in its own unit (nightskills)
        from selftaught.sleep.night.skills import auto_adopt_skills

        auto_adopt_skills(project, night_dir, home, console)
        return staging.read_night(night_dir)
    try:
        adoption = adopt_night(  # staging.adopt, writing back a --start-document
            project,
            night,
            home=home,
            target_paths=config.target_skill_paths,
            follow_symlinks=config.follow_symlinks,
        )
    except staging.StagingError as err:  # e.g. someone adopted another version meanwhile
        console.print(f"[bold yellow]warning:[/] {project}: not adopted: {err}")
        return outcome
    console.print(f"{project}: adopted night {night} as version {adoption.version}")
    return staging.read_night(night_dir)


def _finish(night_dir: Path, night: NightResult, evidence: EvidenceLog) -> None:
    """The night's last writes: diagnostics, report.md, then report.json (its status). Its
    reason and notes are redacted first: they quote errors, and a server may quote a key."""
    night.reason = redact_for_model(night.reason) if night.reason else night.reason
    night.notes = tuple(redact_for_model(note) for note in night.notes)
    night.evidence_calls = evidence.calls
    night.ended_at = time.time()
    if night.status not in staging.ADVANCES_CURSOR:
        night.consumed_until = None  # read again next night
    night.settle()
    report = night.report_dict()
    summary.write_diagnostics(night_dir, night, evidence)
    summary.write_markdown(night_dir, night)
    atomic_write_text(night_dir / "README.txt", staging.NIGHT_LAYOUT)
    atomic_write_json(night_dir / "report.json", report)
    make_private(night_dir)  # what the trainers and peft wrote there with the umask's modes


def _empty_night(
    project: str, night: str, since: float, until: float, home: Path, night_dir: Path
) -> NightResult:
    """A named project with no traffic in its window: nothing to load, nothing to learn."""
    outcome = NightResult(
        project=project,
        night_dir=night_dir,
        night=night,
        status="too_few_tasks",
        reason="no interactions since the last night",
        started_at=until,
        ended_at=time.time(),
        base_version=staging.current_version(project, home),
        window=WindowRecord(since=since, until=until, read=0, capped=None),
    )
    report = outcome.report_dict()
    summary.write_markdown(night_dir, outcome)
    atomic_write_json(night_dir / "report.json", report)
    return outcome


# ---- the night ------------------------------------------------------------------------------


def _load_models(
    config: SleepConfig,
    project_rows: list[Interaction],
    loader: ModelLoader,
    cache: dict[str, ChatModel],
) -> NightModels:
    target = config.model or logged_upstream(project_rows)
    if target is None:
        raise ConfigError(
            "no --model given and no proxy traffic names its upstream: pass --model (the model "
            "your agent uses, not the proxy)"
        )

    def load(spec: str) -> ChatModel:
        if spec not in cache:
            cache[spec] = loader(spec)
        return cache[spec]

    optimizer = config.optimizer_model or target
    wanted = config.miner_model or optimizer
    miner = None if wanted == MINER_OFF else wanted
    roles = {
        "model": target,
        "optimizer_model": optimizer,
        "judge_model": config.judge_model,
        "miner_model": miner,
    }
    check_cmd_replay(roles, config.allow_cmd_replay)  # the target may be the logged upstream
    return NightModels(
        load(target),
        target,
        load(optimizer),
        optimizer,
        load(config.judge_model) if config.judge_model else None,
        config.judge_model,
        miner=load(miner) if miner else None,
        miner_spec=miner,
    )


def logged_upstream(rows: list[Interaction]) -> str | None:
    """The upstream the operator's proxy forwarded to, as the proxy itself recorded it. Only
    rows the proxy logged count: an imported row's `meta.upstream` once sent a night (other
    users' prompts) to the host a file named, so a row of any other source picks nothing
    (an untrusted import is stored with source "import" and without it)."""
    ups = Counter(
        it.meta.get("upstream")
        for it in rows
        if it.source == "proxy" and isinstance(it.meta, dict) and it.meta.get("upstream")
    )
    return ups.most_common(1)[0][0] if ups else None


def _skipped(
    project: str,
    config: SleepConfig,
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


@dataclass(frozen=True)
class NightWindow:
    """What `run_night`, holding the night lock, read for one project: the night's id, the
    project's window and its rows (oldest first), and the clock of the whole night."""

    night: str
    since: float
    until: float
    rows: tuple[Interaction, ...]
    deadline: Deadline = UNLIMITED


class NightTrainer(BaseTrainer[NightConfig, NightResult, NightSource]):
    """One project's night as a trainer, built the way every trainer is:
    `NightTrainer(config, log, model, *, output_dir, callbacks, progress, console, ledger)`
    (through `build_trainer(NightConfig(project=...), log, model)`); `train()` runs the night
    (harvest, mine, split, the skill / memory / weight phases, the gate, staging) under the
    night lock and returns its typed `NightResult`; `callbacks` (and the tracker
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
    ):
        self._check_config(config)
        if config.project is None:
            raise ConfigError("a NightTrainer runs one project's night: set NightConfig.project")
        self.home = config.home or sleep_home()
        self.window = window
        self.dry_run = dry_run
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
        self.marks = self._marks or _night_marks(config, self.home)
        self.loader = self._loader or _default_loader(config, self.marks)
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
            outcome = _empty_night(project, window.night, window.since, window.until, home, root)
        else:
            models = self.models or _load_models(config, rows, self.loader, self._cache)
            with using(self.prompts):  # the miner's, the judge's, the analyst's: the user's
                outcome = run_project(project, window.night, window.since, window.until, rows,
                                      config, models, home, self.console, root, self.dry_run,
                                      window.deadline, self.ledger)  # fmt: skip
        _night_events(self.callbacks, self.info, outcome)
        return outcome


def _default_loader(config: NightConfig, marks: replay_mark.NightMarks) -> ModelLoader:
    """`load_model` with the config's options; the night's calls carry its mark (`marks`, for
    the project whose night runs), so a proxy in front relays them instead of logging them."""
    from selftaught.models import load_model

    return lambda spec: load_model(spec, **config.model_options, sign=marks)


def _night_marks(config: NightConfig, home: Path) -> replay_mark.NightMarks:
    return replay_mark.NightMarks(replay_mark.replay_key(home), config.project or "")


def night_models(
    model: NightModels | ChatModel | str | None,
    config: NightConfig,
    loader: ModelLoader | None = None,
) -> NightModels | None:
    """The night's models from a trainer's `model`: every role given, or the target (the
    config's specs load the other roles; the analyst defaults to the target)."""
    if isinstance(model, NightModels):
        check_cmd_replay(model.commands(), config.allow_cmd_replay)
        return model
    if model is None:
        return None
    loader = loader or _default_loader(config, _night_marks(config, config.home or sleep_home()))
    if isinstance(model, str):
        config = dataclasses.replace(config, model=model)
        return _load_models(config, [], loader, {})
    optimizer = loader(config.optimizer_model) if config.optimizer_model else model
    judge = loader(config.judge_model) if config.judge_model else None
    models = NightModels(model, model.name, optimizer, config.optimizer_model or model.name,
                         judge, config.judge_model)  # fmt: skip
    check_cmd_replay(models.commands(), config.allow_cmd_replay)
    return models


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

    from selftaught.trainers import build_trainer

    console = console or Console(stderr=True, quiet=not config.progress)
    home = config.home or sleep_home()
    events = CallbackList(with_tracker(config.report_to, callbacks))
    marks = _night_marks(config, home)
    loader = _cached(loader or _default_loader(config, marks))
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
            trainer = build_trainer(
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


def _cached(loader: ModelLoader) -> ModelLoader:
    """`loader` loading each spec once (a night's projects share their models)."""
    loaded: dict[str, ChatModel] = {}

    def load(spec: str) -> ChatModel:
        if spec not in loaded:
            loaded[spec] = loader(spec)
        return loaded[spec]

    return load
