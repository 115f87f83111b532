"""What a many-skills night teaches each kind besides its skill's text: its memory and its
LoRA adapter (issue 62). `night/skills.py` trains the skills' text; this module goes on, kind
by kind, with the same phases a one-skill night runs after its skill, on that kind's tasks:

- **memory** (when `documents` holds it): the kind's memory trained with its skill held fixed
  (`consolidate.consolidate` with the memory document alone), gated on the kind's own val.
  Each skill's unit holds its own memory, injected after the skill when a request routes to it
  (`adoption/inject.py`): what one kind of request needs to know is kept from the others.
- **adapter** (when `weights` is on and the target is local), as `skill_adapters` says:
  - `per-skill`: one adapter per kind, trained on its train tasks as that kind is served
    (its skill and memory around each request) and gated on its own val against what serves
    it now (`current`): its text, the adapter, or both, by the one-skill night's weight phase
    itself (`weight_night.weight_candidates`). The winner is staged with the skill
    (`skills/<name>/adapter/`), adopted, rolled back and on probation with it;
  - `shared`: one adapter trained on every kind's train tasks, gated on every kind's val, each
    served its own text, with the per-kind veto (`weight_night.shared_candidates`): staged as
    the project's own proposal (`adapter/`, the project's skill and memory unchanged), served
    to every request whose skill has no adapter of its own.

What serves a kind now is its skill unit's adopted version: its adapter when it has one, else
the project's (`serving_targets`); its skill is trained and measured there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from selftaught.models.base import ChatModel
from selftaught.models.usage import UsageLedger
from selftaught.skill.skillset import SkillOutcome
from selftaught.sleep.adoption import staging
from selftaught.sleep.night.consolidate import consolidate
from selftaught.sleep.night.evidence import EvidenceLog
from selftaught.sleep.night.mine import MinedTask
from selftaught.sleep.night.split import NightTask
from selftaught.sleep.night.weight_night import (
    AdapterTrainer,
    NightText,
    ServedKind,
    WeightChoice,
    adapter_trainer,
    shared_candidates,
    weight_candidates,
)
from selftaught.sleep.paths import SKILLS_DIR, Adopted, Unit
from selftaught.sleep.records import LateDuplicate

SKILL_ADAPTERS = ("per-skill", "shared")


@dataclass(frozen=True)
class KindsNight:
    """What each step of a many-skills night works with once the kinds are mined: its
    settings (`config`: the `NightConfig`), its models (`NightModels`), its folder, evidence
    log, usage ledger and console."""

    config: Any
    models: Any
    night_dir: Path
    evidence: EvidenceLog
    ledger: UsageLedger
    console: Console


@dataclass(frozen=True)
class KindUnit:
    """One kind whose skill the night trained: its tasks, what serves it now (its unit's
    adopted files and the model serving them) and its skill's text as the skill set left it
    (`body`: the accepted one, else the adopted one)."""

    name: str
    task: NightTask
    train: tuple[MinedTask, ...]
    adopted: Adopted
    target: ChatModel
    body: str

    @property
    def folder(self) -> str:
        return f"{SKILLS_DIR}/{self.name}"


@dataclass(frozen=True)
class KindLearned:
    """What the night stages for one kind: its skill and memory, and its weight gate's choice
    (None: no adapter was tried, or none could be trained: `notes` say why)."""

    skill: str
    memory: str
    choice: WeightChoice | None = None
    notes: tuple[str, ...] = ()
    dropped: tuple[LateDuplicate, ...] = ()  # weight items dropped as copies of held-out ones

    def memory_changed(self, adopted: Adopted) -> bool:
        return self.memory.strip() != adopted.memory.strip()


def served_by(target: ChatModel, adapter: Path | None, name: str, notes: list[str]) -> ChatModel:
    """The model serving a kind whose unit's version has `adapter`: the base with it merged;
    `target` (the project's as served) when it has none, or when the target is not local (a
    note says so: the kind was measured without its adapter)."""
    if adapter is None:
        return target
    from selftaught.models.adapters import AdaptedLocalModel, with_adapter
    from selftaught.models.local import LocalModel

    inner = getattr(target, "inner", target)
    base = inner.base if isinstance(inner, AdaptedLocalModel) else inner
    if not isinstance(base, LocalModel):
        notes.append(
            f"skill {name} serves an adapter, but the night's target is not a local model: its "
            "val was measured without it"
        )
        return target
    return with_adapter(base, adapter)


def serving_targets(
    project: str, home: Path, names: Sequence[str], target: ChatModel, notes: list[str]
) -> dict[str, ChatModel]:
    """The kinds (skill names) whose unit serves an adapter of its own, each with its model."""
    out = {}
    for name in names:
        adapter = staging.read_adopted_files(Unit(project, name), home).adapter
        if adapter is not None:
            out[name] = served_by(target, adapter, name, notes)
    return out


def kind_splits(splits: Mapping[str, list[MinedTask]], name: str) -> dict[str, list[MinedTask]]:
    return {s: [t for t in tasks if t.kind == name] for s, tasks in splits.items()}


def kind_units(
    project: str,
    home: Path,
    outcomes: Sequence[SkillOutcome],
    splits: Mapping[str, list[MinedTask]],
    task: NightTask,
    targets: Mapping[str, ChatModel],
    target: ChatModel,
) -> list[KindUnit]:
    """One unit per kind the skill set saw with tasks tonight (trained or held): its tasks as
    a task of their own (the night's judge), what serves it (its skill as the set started it,
    its unit's memory and adapter, `targets` else `target`) and its skill after the set."""
    from selftaught.sleep.night.agent_replay import AgentNightTask
    from selftaught.sleep.night.replay import night_task

    out = []
    for o in outcomes:
        ks = kind_splits(splits, o.name)
        if not any(ks.values()):
            continue
        files = staging.read_adopted_files(Unit(project, o.name), home)
        adopted = dataclasses.replace(files, skill=o.start_body)
        own = (AgentNightTask(project, ks, task.judge) if isinstance(task, AgentNightTask)
               else night_task(project, ks, task.judge))  # fmt: skip
        body = o.trained_body if o.accepted else o.start_body
        out.append(KindUnit(o.name, own, tuple(ks.get("train", ())), adopted,
                            targets.get(o.name, target), body))  # fmt: skip
    return out


def learn_memory(unit: KindUnit, run: KindsNight) -> tuple[str, list[str]]:
    """The kind's memory trained with its skill held fixed, gated on its own val; the adopted
    one when nothing passed. With notes."""
    config = run.config
    held = Adopted(unit.body, unit.adopted.memory, unit.adopted.version)
    result = consolidate(config.training, ("memory",), config.progress, unit.task, unit.target,
                         run.models.optimizer, None, held, run.night_dir / unit.folder,
                         run.evidence, run.console, ledger=run.ledger)  # fmt: skip
    notes = [f"skill {unit.name}: {n}" for n in result.notes]
    if result.fatal is not None:
        notes.append(f"skill {unit.name}: memory not trained: {result.fatal}")
        return unit.adopted.memory, notes
    return result.memory, notes


def trainer_for(run: KindsNight, target: ChatModel) -> AdapterTrainer | None:
    """The night's adapter trainer for a kind served by `target` (training goes on from its
    adapter); None when the night's target is not local."""
    models, config = run.models, run.config
    return adapter_trainer(models.adapter_trainer, models.target_spec, config.weight_training,
                           target, config.training.seed)  # fmt: skip


def learn_adapter(
    unit: KindUnit,
    memory: str,
    trainer: AdapterTrainer,
    run: KindsNight,
    dropped: list[LateDuplicate],
) -> tuple[WeightChoice | None, list[str]]:
    """The kind's adapter, and the gate's choice among its text, the adapter and both on its
    own val (`weight_night.weight_candidates` on the kind's tasks)."""
    config = run.config
    text = NightText(unit.adopted, unit.body, memory)
    here = run.night_dir / unit.folder
    choice, notes = weight_candidates(config.weights, config.weight_training, config.training,
                                      unit.task, list(unit.train), unit.target, trainer, text,
                                      here, run.evidence, run.ledger, run.console,
                                      dropped)  # fmt: skip
    return choice, [f"skill {unit.name}: {n}" for n in notes]


def learn_kind(unit: KindUnit, run: KindsNight) -> KindLearned:
    """A kind's memory (when the night trains memory), then its own adapter (per-skill)."""
    config = run.config
    notes: list[str] = []
    memory = unit.adopted.memory
    if "memory" in config.documents:
        memory, said = learn_memory(unit, run)
        notes += said
    choice = None
    dropped: list[LateDuplicate] = []
    if config.weights != "off" and config.skill_adapters == "per-skill":
        trainer = trainer_for(run, unit.target)
        if trainer is None:
            notes.append(f"skill {unit.name}: weights not trained: the target is not local")
        else:
            choice, said = learn_adapter(unit, memory, trainer, run, dropped)
            notes += said
    return KindLearned(unit.body, memory, choice, tuple(notes), tuple(dropped))


def staged_text(unit: KindUnit, learned: KindLearned) -> tuple[str, str]:
    """The skill and memory staged for the kind: as the weight gate chose (an adapter alone
    keeps the adopted text), else as trained."""
    choice = learned.choice
    if choice is not None and not choice.with_text:
        return unit.adopted.skill, unit.adopted.memory
    return learned.skill, learned.memory


def shared_adapter(
    units: Sequence[KindUnit],
    learned: Mapping[str, KindLearned],
    whole: NightTask,
    run: KindsNight,
    dropped: list[LateDuplicate],
) -> tuple[WeightChoice | None, list[str]]:
    """One adapter for every kind served by the project's (none of its own): trained on their
    train tasks, gated on their val, each kind served the text the night stages for it."""
    config = run.config
    trainer = trainer_for(run, run.models.target)
    if trainer is None:
        return None, ["weights not trained: the target is not a local model"]
    kinds = []
    for unit in units:
        if unit.adopted.adapter is not None:
            continue  # served by its own adapter, never by the shared one
        done = learned.get(unit.name)
        skill, memory = staged_text(unit, done) if done else (unit.adopted.skill,
                                                               unit.adopted.memory)  # fmt: skip
        served = dataclasses.replace(unit.adopted, skill=skill, memory=memory)
        kinds.append(ServedKind(unit.name, unit.task, unit.train, served))
    if not kinds:
        return None, ["weights: every kind serves an adapter of its own (shared: none to train)"]
    return shared_candidates(config.weights, config.weight_training, config.training, kinds,
                             whole, run.models.target, trainer, run.night_dir, run.evidence,
                             run.ledger, run.console, dropped)  # fmt: skip
