"""A night's settings and models: `NightConfig` (`sleep run`'s flags, nesting the configs its
phases run) and `NightModels` (the models of every role, with the specs they came from)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard
from urllib.parse import urlparse

from selftaught.errors import ConfigError
from selftaught.gate import GateConfig
from selftaught.models import ModelOptions
from selftaught.models.base import ChatModel
from selftaught.models.usage import Budget
from selftaught.serve import is_loopback
from selftaught.skill.config import SkillOptConfig
from selftaught.sleep.night.demo_modes import DemoModeConfig
from selftaught.sleep.night.dream import DreamConfig
from selftaught.sleep.night.kinds import (
    KindConfig,
)
from selftaught.sleep.night.mine import (
    MineConfig,
)
from selftaught.sleep.night.miner import MinerConfig
from selftaught.sleep.night.skill_parts import SKILL_ADAPTERS
from selftaught.sleep.night.split import (
    SplitConfig,
)
from selftaught.sleep.night.start_files import check_start_files
from selftaught.sleep.night.weak import (
    WeakConfig,
)
from selftaught.sleep.night.weight_night import (
    WEIGHT_MODES,
    AdapterTrainer,
    WeightNightConfig,
)
from selftaught.sleep.paths import (
    check_project,
)
from selftaught.sleep.records import (
    ModelSpecs,
)
from selftaught.stops import Stops
from selftaught.tracking import check_report_to

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
    """The skill and memory phases' trainer settings. Its `seed` is the night's (`--seed`):
    it seeds the split, the dreams and the adapters too. Its `stops` and `report_to` stay
    unset: the night's own (`stops`, `report_to` below) are those settings."""
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
    model_options: ModelOptions = field(default_factory=ModelOptions)
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
        check_night_training(self.training)
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


# SkillOptConfig's settings a night has as its own (NightConfig's, by the flags that set them):
# `training` leaves them unset, so each is one setting in one place
NIGHT_OWNS: dict[str, tuple[object, str]] = {
    "stops": (Stops(), "--max-minutes, --patience"),
    "report_to": ("none", "--report-to"),
}


def check_night_training(training: SkillOptConfig) -> None:
    """A night's `training` leaves `stops` and `report_to` unset: the night's own
    (`NightConfig.stops`, `NightConfig.report_to`) are those settings; the skill phase stops at
    the night's deadline (`consolidate.py`) and the night's tracker logs the night."""
    for name, (unset, flags) in NIGHT_OWNS.items():
        if getattr(training, name) != unset:
            raise ConfigError(
                f"a night's {name} is NightConfig.{name} ({flags}), not training.{name}: "
                f"leave training.{name} unset"
            )


RENAMED = {"SleepConfig": "NightConfig"}  # names the night's settings had before


def renamed(module: str, name: str) -> Any:
    """An old name of the night's settings (`RENAMED`: `SleepConfig` was `NightConfig`'s before
    the night was a trainer, and the docs named it), still read with a DeprecationWarning; any
    other name is missing as usual. `module`'s `__getattr__` calls it."""
    if name in RENAMED:
        new = RENAMED[name]
        warnings.warn(f"{module}.{name} is now {new}", DeprecationWarning, stacklevel=3)
        return globals()[new]
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def __getattr__(name: str) -> Any:
    return renamed(__name__, name)


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
