"""Weight candidates of a night, and the one gate that picks text, weights or both.

When the deployed model is local (`local`, `local:PATH`) and `NightConfig.weights` allows it,
a night also fine-tunes a LoRA adapter on its TRAIN tasks, through the weight half's own code
(`weights.sampling`, `weights.elite`; each adapter by the trainer `selftaught train` runs,
built by `build_trainer`: `RestTrainer.fit` for SFT, `DPOTrainer.fit` for preferences):

- ``sft``  supervised on the user's corrections (the reply the user typed instead) and on
           the model's own replayed replies that passed their checks (ReST-style elite:
           k samples per train task at temperature, solved and not truncated, deduplicated);
- ``dpo``  preference pairs where the log holds a rejected reply and its correction
           (``auto`` trains it beside ``sft`` when there are enough pairs for one batch).

Training prompts are the requests as served (the adopted skill and memory around them).
Nothing from val or test is trained on: every item must be a train task (else the night fails
closed, `SplitOverlap`: a bug), and an item that is the same item as a val / test task
(`selftaught.duplicates`; another instance of one template, other values or another answer, is
not) is dropped from the data and listed in the night's `duplicates`; the night trains on the
rest.
Training is capped by steps and wall-clock seconds (`WeightNightConfig`); the sampling and
val replays are charged to the night's ledger, so its budget covers them too.

The candidates then meet the same gate on the same val tasks, against the adopted version
(``current``): ``text`` (the night's skill / memory), each adapter with the adopted text
(``sft``, ``dpo``) and with the new text (``sft+text``, ``dpo+text``). A candidate wins only
when the gate accepts it as a new best against ``current``; among those, the largest net
gain wins (ties: the simpler candidate, in the order above). Gate off: the best val mean.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from selftaught.demos import Demo, LeakCheck
from selftaught.evaluation import ItemScores, ScoreCache, answer_dtype, summarize
from selftaught.gate import Paired, ValScores, example_tags, paired_comparison
from selftaught.models.base import ChatModel, GenerationParams, Message
from selftaught.models.errors import BackendError
from selftaught.models.usage import BudgetExhausted, TrackedModel, UsageLedger
from selftaught.policy import Policy
from selftaught.rollout import RolloutConfig, run_rollouts
from selftaught.runs import make_private, private_dirs
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.demo_search import no_demo
from selftaught.sleep.night.demo_modes import ValScorer, decide_mode
from selftaught.sleep.night.evidence import EvidenceLog, EvidenceModel
from selftaught.sleep.night.mine import MinedTask
from selftaught.sleep.night.split import NightTask, SplitOverlap
from selftaught.sleep.paths import ADAPTER_DIR, Adopted
from selftaught.sleep.records import (
    AdapterRecord,
    GateRecord,
    LateDuplicate,
    ReplayStats,
    Summary,
    TrainedRecord,
    WeightDataRecord,
    WeightsRecord,
)
from selftaught.tasks.base import Example, Score, Split, TaskKind
from selftaught.weights.config import (
    BackendConfig,
    ConfigError,
    DPOConfig,
    RestConfig,
    SFTTrainConfig,
)
from selftaught.weights.dpo import PreferencePair
from selftaught.weights.elite import select_elite
from selftaught.weights.sampling import Sample, samples_from_rollouts

WEIGHT_MODES = ("off", "sft", "dpo", "auto")


@dataclass
class WeightNightConfig:
    """How a night trains an adapter (only when `NightConfig.weights` is not "off"). Its
    fields say they are the adapter's (`adapter_epochs`, not the skill's `training.epochs`):
    every leaf of a `NightConfig` has one name. The adapter's seed is the night's
    (`training.seed`)."""

    adapter_max_steps: int = 16
    """Optimizer steps per adapter at most (the night's step cap)."""
    adapter_max_minutes: float = 5.0
    """Wall-clock minutes of training per adapter at most: training stops after the optimizer
    step that crosses it (the one notion of `--max-minutes`, `selftaught.stops`)."""
    adapter_epochs: float = 3.0
    """Passes over the adapter's training rows (the step cap may end it first)."""
    adapter_batch_size: int = 4
    """Rows per optimizer step (a method with fewer rows than one batch is not trained)."""
    learning_rate: float | None = 1e-3
    """SFT learning rate (None: the LoRA default of `train`, 2e-4). Measured on the embedded
    model, 17 corrections "N km": 8 steps at 2e-4 left val at 0/7, 12 steps at 1e-3 took it
    to 3/7; the gate stands between a too-high rate and the user."""
    dpo_learning_rate: float = 5e-5
    dpo_beta: float = 0.1
    lora_r: int = 8
    lora_alpha: int = 16
    max_length: int = 512
    samples_per_prompt: int = 2
    """Replays per train task for the ReST-style elite (0: corrections only)."""
    replay_temperature: float = 0.8
    """Sampling temperature of those replays."""
    device: str | None = None
    """Where training runs (None: the best available)."""

    def __post_init__(self) -> None:
        if self.adapter_max_steps < 1 or self.adapter_max_minutes <= 0:
            raise ConfigError("adapter_max_steps must be >= 1 and adapter_max_minutes > 0")
        if self.adapter_batch_size < 1 or self.samples_per_prompt < 0:
            raise ConfigError("adapter_batch_size must be >= 1 and samples_per_prompt >= 0")
        if self.samples_per_prompt and self.replay_temperature <= 0:
            raise ConfigError("replay_temperature must be > 0 (k greedy samples are k copies)")
        self.dpo_config(self.adapter_batch_size)  # the trainers' configs validate the rest
        self.rest_config(self.adapter_batch_size)

    # The trainers' own configs, built from these flat fields (their names are `sleep run`'s
    # and a night's report's): an adapter trains through the same validated settings and the
    # trainers as `train --method sft / dpo` (`LocalAdapterTrainer`).
    def backend_config(self) -> BackendConfig:
        return BackendConfig(lora_r=self.lora_r, lora_alpha=self.lora_alpha, device=self.device)

    def sft_config(self, rows: int, learning_rate: float | None = None) -> SFTTrainConfig:
        """The fine-tune's schedule for `rows` training rows (a batch never larger)."""
        return SFTTrainConfig(
            epochs=self.adapter_epochs,
            learning_rate=self.learning_rate if learning_rate is None else learning_rate,
            batch_size=max(1, min(self.adapter_batch_size, rows)),
            max_length=self.max_length,
            max_steps=self.adapter_max_steps,
        )

    def rest_config(self, rows: int, seed: int = 0) -> RestConfig:
        """`train --method sft`'s config for `rows` training rows (`seed`: the night's)."""
        return RestConfig(
            method="sft",
            seed=seed,
            sft=self.sft_config(rows),
            backend=self.backend_config(),
        )

    def dpo_config(self, rows: int, seed: int = 0) -> DPOConfig:
        """`train --method dpo`'s config for `rows` preference pairs (`seed`: the night's)."""
        return DPOConfig(
            beta=self.dpo_beta,
            seed=seed,
            train=self.sft_config(rows, self.dpo_learning_rate),
            backend=self.backend_config(),
        )


def is_local_spec(spec: str | None) -> bool:
    """A model this process can fine-tune: the embedded one or a local folder."""
    return bool(spec) and (spec == "local" or str(spec).startswith("local:"))


# ---- data -----------------------------------------------------------------------------------


@dataclass
class WeightData:
    """What the adapters train on, all from train tasks: SFT samples (the user's corrections
    first, then the target's elite replays) and preference pairs; `record()` is its report
    section, made once its data is final."""

    sft: list[Sample] = field(default_factory=list)
    pairs: list[PreferencePair] = field(default_factory=list)
    corrections: int = 0
    """How many of `sft` are the user's corrections (the first ones; the rest: elite)."""
    replays: ReplayStats | None = None
    """The elite filter on the target's replays (None: several kinds' data added up)."""

    def train_items(self) -> list[str]:
        ids = [s.example_id for s in self.sft] + [p.example_id for p in self.pairs]
        return sorted(set(ids))

    @property
    def elite(self) -> int:
        return len(self.sft) - self.corrections

    def record(self) -> WeightDataRecord:
        """report.json `weights.data`: its counts, and the replays' filter when it has one (a
        many-skills night's shared data never had it)."""
        record = WeightDataRecord(corrections=self.corrections, elite=self.elite,
                                  sft_samples=len(self.sft), preference_pairs=len(self.pairs),
                                  replays=self.replays)  # fmt: skip
        if self.replays is None:
            return record.only("corrections", "elite", "sft_samples", "preference_pairs")
        return record


def _correction(ex: Any) -> str | None:
    if ex.state.get("demo_source") != "correction" or ex.reference is None:
        return None
    ref = ex.reference[0] if isinstance(ex.reference, list) else ex.reference
    return str(ref) if str(ref).strip() else None


def _elite(
    task: NightTask,
    target: ChatModel,
    policy: Policy,
    cfg: WeightNightConfig,
    training: SkillOptConfig,
) -> tuple[list[Sample], ReplayStats]:
    """The target's own replays of the train tasks that passed their checks (not of a task an
    end user's correction checks: it would teach their words)."""
    examples = [ex for ex in task.examples("train") if not no_demo(ex)]
    if not cfg.samples_per_prompt or not examples:
        return [], ReplayStats(samples=0).only("samples")
    rollouts = run_rollouts(
        target,
        policy,
        task,
        examples,
        RolloutConfig(
            concurrency=training.concurrency,
            timeout_s=training.timeout_s,
            samples=cfg.samples_per_prompt,
            params=GenerationParams(
                max_tokens=training.max_tokens,
                temperature=cfg.replay_temperature,
                seed=training.seed,
            ),
            progress=False,
            description="weights: replays for the elite",
        ),
    )
    samples = samples_from_rollouts(task, examples, rollouts, policy)
    solved = [s for s in samples if s.hard >= 1.0]
    elite, stats = select_elite(solved, min_score=None, max_per_prompt=2)
    return elite, ReplayStats.of(stats, samples=len(samples), errors=len(rollouts) - len(samples))


def build_data(
    task: NightTask,
    train_tasks: list[MinedTask],
    target: ChatModel,
    adopted: Adopted,
    cfg: WeightNightConfig,
    training: SkillOptConfig,
) -> WeightData:
    """Corrections + elite replays (SFT) and rejected-vs-corrected pairs (DPO), train only."""
    policy = Policy(skill=adopted.skill, memory=adopted.memory)
    mined = {t.id: t for t in train_tasks}
    data = WeightData()
    for ex in task.examples("train"):
        fixed = _correction(ex)
        if fixed is None:
            continue
        msgs = policy.messages(task, ex)
        data.sft.append(Sample(ex.id, msgs, msgs, fixed, fixed, 1.0, 1.0))
        t = mined.get(ex.id)
        if t is not None and t.negative and t.logged_reply and t.logged_reply.strip() != fixed:
            data.pairs.append(PreferencePair(ex.id, msgs, fixed, t.logged_reply))
    data.corrections = len(data.sft)
    elite, data.replays = _elite(task, target, policy, cfg, training)
    seen = {(s.example_id, " ".join(s.target.split())) for s in data.sft}
    for s in elite:
        key = (s.example_id, " ".join(s.target.split()))
        if key not in seen:
            seen.add(key)
            data.sft.append(s)
    return data


def train_only_data(data: WeightData, task: NightTask) -> list[LateDuplicate]:
    """Keep `data` to what a night may train on. An item that is not a train task fails the
    night closed (`SplitOverlap`: a bug, never traffic); one that is the same item as a val
    or test task (`selftaught.duplicates`) is dropped with its samples and pairs, and
    returned: the night trains on the rest."""
    train = {ex.id: ex for ex in task.examples("train")}
    strays = [i for i in data.train_items() if i not in train]
    if strays:
        raise SplitOverlap(
            f"weight training got items that are not train tasks ({', '.join(strays[:5])}); "
            "val and test never feed what is learned"
        )
    held_out = LeakCheck.of_task(task)
    leaks = [
        leak
        for i in data.train_items()
        if (leak := held_out.find(Demo.of(i, train[i].input, "", "correction"))) is not None
    ]
    if leaks:
        _drop(data, {x.demo_id for x in leaks})
    return [
        LateDuplicate(item=x.demo_id, held_out=x.held_out_id, split=x.split, phase="weights")
        for x in leaks
    ]


def _drop(data: WeightData, ids: set[str]) -> None:
    """Remove the samples and pairs of `ids` from `data`, its counts with them."""
    data.corrections = sum(s.example_id not in ids for s in data.sft[: data.corrections])
    data.sft = [s for s in data.sft if s.example_id not in ids]
    data.pairs = [p for p in data.pairs if p.example_id not in ids]


# ---- training ---------------------------------------------------------------------------------


@dataclass
class TrainedAdapter:
    """An adapter saved with peft's `save_pretrained` in `adapter_dir`, and the base model with
    it applied behind the chat protocol (for the val replays)."""

    method: str
    adapter_dir: Path
    model: ChatModel
    training: TrainedRecord = field(default_factory=TrainedRecord.empty)
    """How it trained, as its trainer told it (the night adds the seconds it took)."""
    base_model: str = ""


class AdapterTrainer(Protocol):
    def __call__(self, method: str, data: WeightData, out_dir: Path) -> TrainedAdapter: ...


class LocalAdapterTrainer:
    """Trains LoRA adapters on the night's local target with the trainers `selftaught train`
    runs: `build_trainer` on the configs `WeightNightConfig` builds (`rest_config`: a
    `RestTrainer` for SFT, `dpo_config`: a `DPOTrainer`), over the adapter's rows
    (`AdapterRows`), and the trainer's one fine-tune, `fit` (what its rounds train with). The
    base weights are read once (from the target's loaded model when it is a `LocalModel`, else
    from its spec) and copied per adapter. When the target serves an adopted adapter
    (`models.adapters.AdaptedLocalModel`), training continues that adapter on the base, so
    every staged adapter applies to the base alone and what was learned before is kept.
    `seed`: the night's (`NightConfig.training.seed`)."""

    def __init__(
        self, spec: str, cfg: WeightNightConfig, target: ChatModel | None = None, seed: int = 0
    ):
        self.spec, self.cfg, self.target, self.seed = spec, cfg, target, seed
        self._base: Any = None
        self._tok: Any = None
        self.base_model = spec
        self.start_adapter: Path | None = None  # the adopted adapter training continues

    def _load(self) -> None:
        if self._base is not None:
            return
        from selftaught.models.adapters import AdaptedLocalModel
        from selftaught.models.local import LocalModel

        inner = getattr(self.target, "inner", self.target)
        if isinstance(inner, AdaptedLocalModel):
            self.start_adapter, inner = inner.adapter_dir, inner.base
        if isinstance(inner, LocalModel):
            self._base, self._tok = inner.model, inner.tokenizer
            if not inner._in_memory:
                self.base_model = str(inner.path)
            return
        from selftaught.models.embedded import resolve_local_path
        from selftaught.models.spec import parse_model_spec
        from selftaught.weights.sft import load_causal_lm

        path = resolve_local_path(parse_model_spec(self.spec).model or None)
        self._base, self._tok = load_causal_lm(path, device=self.cfg.device)
        self.base_model = str(path)

    def __call__(self, method: str, data: WeightData, out_dir: Path) -> TrainedAdapter:
        from selftaught.models.local import LocalModel
        from selftaught.weights.sft import merged, save_atomic

        self._load()
        model = self._trainable(self.cfg.backend_config())
        # the trainers print their logs; a night's stdout is the CLI's (its report, --json)
        with contextlib.redirect_stdout(sys.stderr):
            fitted = self._train(method, model, data, out_dir.parent)
        # the trainer's report (`fine_tune_report`), key for key: its keys are the method's
        start = str(self.start_adapter) if self.start_adapter else None
        training = TrainedRecord.from_dict(fitted).but(continued_from=start)
        save_atomic(model, out_dir)  # adapter_config.json + adapter_model.safetensors
        served = LocalModel.from_pretrained_model(
            merged(model).eval(), self._tok, name=f"local:night-{method}-adapter"
        )
        return TrainedAdapter(method, out_dir, served, training, self.base_model)

    def _trainable(self, backend: Any) -> Any:
        """A copy of the base with a fresh LoRA adapter, or with the adopted one to go on from."""
        from selftaught.weights.sft import prepare_trainable

        if self.start_adapter is None:
            return prepare_trainable(copy.deepcopy(self._base), backend)
        from peft import PeftModel

        return PeftModel.from_pretrained(
            copy.deepcopy(self._base), str(self.start_adapter), is_trainable=True
        )

    def _train(self, method: str, model: Any, data: WeightData, run_dir: Path) -> dict[str, Any]:
        """`model` trained in place by `fit` of the trainer `train --method <method>` runs,
        built the one way (`build_weight_trainer`, which `build_trainer` calls) in `run_dir`;
        nothing else of its run is used: the night's gate, not the trainer's, decides on the
        night's val."""
        from selftaught.stops import Deadline
        from selftaught.weights import build

        cfg = self.cfg
        if method == "sft":
            rows = AdapterRows(
                "night-sft", [(s.example_id, s.train_messages, s.target) for s in data.sft]
            )
            sft = build.build_weight_trainer(
                cfg.rest_config(len(data.sft), self.seed),
                rows,
                self.spec,
                output_dir=run_dir,
                progress=False,
            )
            return sft.fit(
                model, self._tok, data.sft, deadline=Deadline.start(cfg.adapter_max_minutes)
            )
        rows = AdapterRows("night-dpo", [(p.example_id, p.prompt, p.chosen) for p in data.pairs])
        dpo = build.build_weight_trainer(
            cfg.dpo_config(len(data.pairs), self.seed),
            rows,
            self.spec,
            preferences=data.pairs,
            output_dir=run_dir,
            progress=False,
        )
        return dpo.fit(model, self._tok, deadline=Deadline.start(cfg.adapter_max_minutes))


class AdapterRows:
    """A night adapter's rows as the `Task` its trainer is built on: train holds one example
    a row (the prompt as served, its target as the reference); val and test are empty, as the
    night's gate scores the adapters on the night's val (the trainer fits, never gates)."""

    kind: TaskKind = "agent"
    instructions = ""

    def __init__(self, name: str, rows: Sequence[tuple[str, list[Message], str]]):
        self.name = name
        self._train = [Example(id=i, input=list(prompt), reference=t) for i, prompt, t in rows]

    def examples(self, split: Split) -> list[Example]:
        return list(self._train) if split == "train" else []

    def score(self, output: str, example: Example) -> Score:
        raise ConfigError(f"{self.name}: an adapter's rows are trained on, never scored")


def adapter_trainer(
    given: AdapterTrainer | None, spec: str, cfg: WeightNightConfig, target: ChatModel, seed: int
) -> AdapterTrainer | None:
    """The night's adapter trainer: the one `given` (`NightModels.adapter_trainer`), else one
    on `target` (the model serving: training goes on from its adapter) when the target's
    `spec` is local, seeded with the night's `seed`; None when it is not."""
    if given is not None:
        return given
    if not is_local_spec(spec):
        return None
    return LocalAdapterTrainer(spec, cfg, target, seed)


# ---- the gate's choice ---------------------------------------------------------------------


@dataclass
class WeightChoice:
    """Every candidate's val and gate result, the winner and why."""

    winner: str
    why: str
    candidates: dict[str, Summary]
    gates: dict[str, GateRecord]
    scores: dict[str, ItemScores]  # per candidate, per val task [hard, soft]: paired
    data: WeightDataRecord
    trained: dict[str, TrainedRecord]
    adapter: TrainedAdapter | None = None
    train_items: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # replay, train, gate

    @property
    def with_text(self) -> bool:
        return self.winner == "text" or self.winner.endswith("+text")

    def record(self) -> WeightsRecord:
        """report.json `weights`: every candidate's val, the gate's decisions, the winner."""
        return WeightsRecord(
            winner=self.winner,
            why=self.why,
            candidates=dict(self.candidates),
            gates=dict(self.gates),
            data=self.data,
            trained=dict(self.trained),
            train_items=tuple(self.train_items),
            notes=tuple(self.notes),
            seconds=dict(self.seconds),
        )

    def paired(self) -> Paired:
        """Per val task, the winner against the adopted version (hard scores)."""
        hard = {
            name: {k: v[0] if v else None for k, v in items.items()}
            for name, items in self.scores.items()
        }
        return paired_comparison(hard.get(self.winner, {}), hard.get("current", {}))


def _why(winner: str, gates: Mapping[str, GateRecord], candidates: Mapping[str, Summary]) -> str:
    val = {m: f"{c.score.hard:.3f}" for m, c in candidates.items()}
    if winner == "current":
        if not gates:
            return "no candidate to compare with the adopted version"
        best = max(gates, key=lambda m: gates[m].gain_vs_best)
        return (
            f"no candidate passed the gate against the adopted version (val {val['current']}); "
            f"the closest, {best} (val {val[best]}): {gates[best].reason}"
        )
    g = gates.get(winner)
    passed = [m for m, r in gates.items() if r.decision == "accept_new_best" and m != winner]
    others = f"; {', '.join(passed)} also passed with less gain" if passed else ""
    gain, reason = (0.0, "gate off: the best val mean") if g is None else (g.gain_vs_best, g.reason)
    return (
        f"{winner} won: val {val['current']} → {val[winner]} "
        f"({gain:+g} net val items vs the adopted version; {reason}){others}"
    )


def _tracked(model: ChatModel, evidence: EvidenceLog, ledger: UsageLedger) -> ChatModel:
    return TrackedModel(EvidenceModel(model, evidence, "target"), ledger, "target")


def _close(model: ChatModel) -> None:
    close = getattr(model, "close", None)
    if callable(close):
        close()


@dataclass
class NightText:
    """The adopted documents and the night's text proposal (equal when it proposed none)."""

    adopted: Adopted
    skill: str
    memory: str

    @property
    def changed(self) -> bool:
        return self.skill.strip() != self.adopted.skill.strip() or (
            self.memory.strip() != self.adopted.memory.strip()
        )


def _methods(mode: str, data: WeightData, cfg: WeightNightConfig) -> tuple[list[str], list[str]]:
    """(methods to train, why others were not)."""
    want = {"sft": ["sft"], "dpo": ["dpo"], "auto": ["sft", "dpo"]}[mode]
    need = {"sft": len(data.sft), "dpo": len(data.pairs)}
    least = {"sft": cfg.adapter_batch_size, "dpo": cfg.adapter_batch_size}
    go, notes = [], []
    for m in want:
        if need[m] >= least[m]:
            go.append(m)
        else:
            what = "training samples" if m == "sft" else "preference pairs"
            notes.append(f"{m} not trained: {need[m]} {what}, fewer than one batch ({least[m]})")
    return go, notes


def train_adapters(
    mode: str,
    data: WeightData,
    cfg: WeightNightConfig,
    trainer: AdapterTrainer,
    weights_dir: Path,
) -> tuple[dict[str, TrainedAdapter], dict[str, TrainedRecord], list[str]]:
    """Each method's adapter (a failed one is a note, never a candidate), and its training
    as the trainer told it (`AdapterTrainer`'s stats) with the seconds it took."""
    methods, notes = _methods(mode, data, cfg)
    adapters: dict[str, TrainedAdapter] = {}
    trained: dict[str, TrainedRecord] = {}
    for m in methods:
        t0 = time.perf_counter()
        try:
            adapters[m] = trainer(m, data, weights_dir / m / ADAPTER_DIR)
        except (ConfigError, ValueError, RuntimeError, ImportError) as err:
            notes.append(f"{m} adapter not trained: {type(err).__name__}: {err}")
            continue
        seconds = round(time.perf_counter() - t0, 2)
        trained[m] = adapters[m].training.but(seconds=seconds)
    return adapters, trained, notes


def choose(
    training: SkillOptConfig,
    task: NightTask,
    base: ChatModel,
    text: NightText,
    adapters: dict[str, TrainedAdapter],
    night_dir: Path,
    evidence: EvidenceLog,
    ledger: UsageLedger,
) -> Choice:
    """Score every candidate on the same val tasks and let the gate choose:
    (winner, summaries, gate results, raw scores)."""
    adopted = text.adopted
    memory_run = night_dir / "memory"
    text_run = memory_run if (memory_run / "val_cache.json").exists() else night_dir
    runs: dict[str, tuple[ChatModel, str, str, Path]] = {
        "current": (base, adopted.skill, adopted.memory, night_dir)
    }
    if text.changed:
        runs["text"] = (base, text.skill, text.memory, text_run)
    for m, a in adapters.items():
        model = _tracked(a.model, evidence, ledger)
        runs[m] = (model, adopted.skill, adopted.memory, night_dir / "weights" / m)
        if text.changed:
            runs[f"{m}+text"] = (model, text.skill, text.memory, night_dir / "weights" / m)
    raw: dict[str, ItemScores] = {}
    metrics: dict[str, ValScores] = {}
    summaries: dict[str, Summary] = {}
    for name, (model, skill, memory, run) in runs.items():
        private_dirs(run)
        # one cache per model: a skill hash names the text, not the weights that read it
        cache = ScoreCache.load(run / "val_cache.json", answer_dtype(model))
        scorer = ValScorer(training, task, model, memory, cache)
        result = scorer.score(skill)
        raw[name] = result.items
        metrics[name] = scorer.metric(result)
        summaries[name] = Summary.of(result)
    tags = example_tags(task.examples("val"))  # each kind's: the per-kind veto
    winner, gates = decide_mode(metrics, "current", training, tags)
    return winner, summaries, gates, raw


def weight_candidates(
    mode: str,
    cfg: WeightNightConfig,
    training: SkillOptConfig,
    task: NightTask,
    train_tasks: list[MinedTask],
    target: ChatModel,
    trainer: AdapterTrainer,
    text: NightText,
    night_dir: Path,
    evidence: EvidenceLog,
    ledger: UsageLedger,
    console: Console,
    dropped: list[LateDuplicate] | None = None,
) -> tuple[WeightChoice | None, list[str]]:
    """Build the data, train the adapters, let the gate choose. None (with notes) when no
    adapter could be trained: the night then stays text-only, as without weights. Items
    dropped as duplicates of held-out tasks are appended to `dropped`."""
    base = _tracked(target, evidence, ledger)
    return _candidates(
        mode,
        cfg,
        trainer,
        task,
        night_dir,
        console,
        build=lambda: build_data(task, train_tasks, base, text.adopted, cfg, training),
        pick=lambda found: choose(training, task, base, text, found, night_dir, evidence, ledger),
        dropped=dropped,
    )


Choice = tuple[str, dict[str, Summary], dict[str, GateRecord], dict[str, ItemScores]]
"""The winner, every candidate's val, the gate's results, the raw val scores."""
Pick = Callable[[dict[str, TrainedAdapter]], Choice]


def _candidates(
    mode: str,
    cfg: WeightNightConfig,
    trainer: AdapterTrainer,
    held_out: NightTask,
    night_dir: Path,
    console: Console,
    build: Callable[[], WeightData],
    pick: Pick,
    dropped: list[LateDuplicate] | None = None,
) -> tuple[WeightChoice | None, list[str]]:
    """The weight phase's steps, whatever the adapters are for: `build` the data (an item that
    is the same as one of `held_out`'s val or test tasks is dropped and added to `dropped`),
    train each method's adapter, and `pick` among them."""
    clock = time.perf_counter()
    seconds: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[name] = round(now - clock, 2)
        clock = now

    try:
        data = build()
    except (BudgetExhausted, BackendError) as err:
        return None, [f"weights not trained: replaying the train tasks failed ({err})"]
    lap("replay")
    gone = train_only_data(data, held_out)
    if dropped is not None:
        dropped += gone
    console.print(
        f"weights: {data.corrections} corrections, {data.elite} elite replays, "
        f"{len(data.pairs)} preference pairs"
    )
    adapters, trained, notes = train_adapters(mode, data, cfg, trainer, night_dir / "weights")
    lap("train")
    if not adapters:
        return None, [f"weights: {n}" for n in notes] or ["weights: no adapter was trained"]
    try:
        winner, summaries, gates, raw = pick(adapters)
    except BudgetExhausted as err:
        for a in adapters.values():
            _close(a.model)
        return None, [*notes, f"weights not compared: the budget ran out ({err})"]
    lap("gate")
    choice = WeightChoice(
        winner=winner,
        why=_why(winner, gates, summaries),
        candidates=summaries,
        gates=gates,
        scores=raw,
        data=data.record(),
        trained=trained,
        train_items=data.train_items(),
        notes=notes,
        seconds=seconds,
    )
    for m, a in adapters.items():
        if winner.split("+")[0] == m:
            choice.adapter = a
        _close(a.model)
    return choice, []


# ---- one adapter shared by every kind (many skills, `skill_adapters="shared"`) ------------------


@dataclass(frozen=True)
class ServedKind:
    """One kind of request as a shared adapter meets it: its tasks (`task`: its splits, its
    mined `train` tasks) and the text it is served with once the night is adopted (`served`:
    its skill and memory; its adapter is the one the shared adapter would replace)."""

    name: str
    task: NightTask
    train: tuple[MinedTask, ...]
    served: Adopted


def shared_candidates(
    mode: str,
    cfg: WeightNightConfig,
    training: SkillOptConfig,
    kinds: Sequence[ServedKind],
    whole: NightTask,
    target: ChatModel,
    trainer: AdapterTrainer,
    night_dir: Path,
    evidence: EvidenceLog,
    ledger: UsageLedger,
    console: Console,
    dropped: list[LateDuplicate] | None = None,
) -> tuple[WeightChoice | None, list[str]]:
    """One adapter trained on every kind's train tasks (each request as its kind is served),
    and the gate's choice between it and what serves now (`current`) on every kind's val,
    each kind served its own text, with the per-kind veto (`whole`: the night's task; an item
    that is one of its val or test tasks is dropped into `dropped`). None (with notes): no
    adapter trained."""
    base = _tracked(target, evidence, ledger)

    def build() -> WeightData:
        parts = [build_data(k.task, list(k.train), base, k.served, cfg, training) for k in kinds]
        return merged_data(parts)

    def pick(found: dict[str, TrainedAdapter]) -> Choice:
        return choose_shared(training, kinds, base, found, night_dir, evidence, ledger)

    return _candidates(mode, cfg, trainer, whole, night_dir, console, build, pick, dropped)


def merged_data(parts: Sequence[WeightData]) -> WeightData:
    """Several kinds' weight data as one (their counts added; their replays' filters are
    not)."""
    out = WeightData()
    for part in parts:
        out.sft += part.sft
        out.pairs += part.pairs
        out.corrections += part.corrections
    return out


def choose_shared(
    training: SkillOptConfig,
    kinds: Sequence[ServedKind],
    base: ChatModel,
    adapters: dict[str, TrainedAdapter],
    night_dir: Path,
    evidence: EvidenceLog,
    ledger: UsageLedger,
) -> Choice:
    """Every kind's val served its own text, on the model serving now and on each adapter;
    the gate (with its per-kind veto: each val task is tagged with its kind) chooses."""
    runs = {"current": (base, night_dir / "weights" / "current")}
    for m, a in adapters.items():
        runs[m] = (_tracked(a.model, evidence, ledger), night_dir / "weights" / m)
    raw: dict[str, ItemScores] = {}
    metrics: dict[str, ValScores] = {}
    summaries: dict[str, Summary] = {}
    for name, (model, run) in runs.items():
        private_dirs(run)
        cache = ScoreCache.load(run / "val_cache.json", answer_dtype(model))  # one per model
        items: ItemScores = {}
        for k in kinds:
            scorer = ValScorer(training, k.task, model, k.served.memory, cache)
            items.update(scorer.score(k.served.skill).items)
        result = summarize([], task="kinds", model=model.name, split="val", wall_s=0.0,
                           skill_hash="served", items=items)  # fmt: skip
        raw[name], summaries[name] = items, Summary.of(result)
        metrics[name] = result.val_scores(training.gate)
    tags = example_tags(ex for k in kinds for ex in k.task.examples("val"))
    winner, gates = decide_mode(metrics, "current", training, tags)
    return winner, summaries, gates, raw


def stage_adapter(choice: WeightChoice, night_dir: Path, base_spec: str) -> AdapterRecord:
    """Move the winning adapter to `<night>/adapter/` (peft's save_pretrained layout) and
    return its record for the staged proposal (`proposal.adapter`); the losers' adapters are
    deleted."""
    assert choice.adapter is not None
    dest = night_dir / ADAPTER_DIR
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(choice.adapter.adapter_dir, dest)
    make_private(dest)
    discard_adapters(night_dir)
    return AdapterRecord(
        dir=ADAPTER_DIR,
        method=choice.adapter.method,
        base_model=base_spec,
        base_model_path=choice.adapter.base_model or base_spec,
        files=tuple(sorted(p.name for p in dest.iterdir())),
        train_items=tuple(choice.train_items),
        data=choice.data,
        training=choice.trained.get(choice.adapter.method),
        val=choice.candidates[choice.winner],
        with_text=choice.with_text,
    )


def discard_adapters(night_dir: Path) -> None:
    """No adapter won: the trained ones are deleted (their metrics stay in the report)."""
    for folder in (night_dir / "weights").glob(f"*/{ADAPTER_DIR}"):
        shutil.rmtree(folder, ignore_errors=True)
