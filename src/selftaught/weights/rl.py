"""Online RL with verifiable rewards: GRPO / GSPO through TRL's GRPOTrainer, the task's own
scorer as the reward (by default; `rewards` adds a format and an LLM-judge reward with
weights, `loss_type` picks TRL's loss: see `weights.rewards` and `RLConfig`). Prompts are
conversational (chat template); free-text answers are scored as text, JSON only for games.

Each logged step lands in history.jsonl with mean reward, reward std within groups, each
reward function's mean (`rewards/<name>`), KL, completion length and the share of completions
cut by the length cap. The run warns loudly when every reward of a step is equal (no learning
signal) or when most completions are truncated (the cap zeroes the reward). The trained model
ships only when the gate (the one `optimize` uses: margin / paired test on per-example val
scores) says it beats the start model; otherwise the start model ships.

A task with tools trains on whole episodes through TRL's own `environment_factory` support
(the adapter is `weights.trl_env`): the model calls the task's tools during generation, tool
results are masked out of the loss by TRL, and the reward is the task's `score_episode`.

On a GPU: `vllm_mode` has TRL generate the groups with vLLM, on a server (`vllm_server_url`,
started by `selftaught vllm-up --for grpo`) or colocated in the training process. Past one
machine the run works under `accelerate launch` (see docs/train.md)."""

from __future__ import annotations

import re
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

from rich.console import Console

from selftaught.callbacks import TrainerCallback
from selftaught.evaluation import EvalResult, evaluate_split
from selftaught.gate import GateResult, gate
from selftaught.models.base import GenerationParams
from selftaught.models.resolve import ModelLike, resolve_model
from selftaught.models.usage import TrackedModel, UsageLedger
from selftaught.policy import Policy
from selftaught.results import RunResult
from selftaught.rollout import RolloutConfig
from selftaught.runs import RunDir, atomic_write_json
from selftaught.stops import Deadline, StopReason, stop_dict
from selftaught.tasks.base import Task
from selftaught.tasks.episode import is_tool_task
from selftaught.tracking import trl_report_to
from selftaught.weights.config import ConfigError, RLConfig
from selftaught.weights.rewards import (
    EpisodeReward,
    FormatReward,
    JudgeReward,
    Reward,
    RewardError,
    RewardSet,
    TaskReward,
)
from selftaught.weights.rewards import (
    completion_text as completion_text,  # re-exported: where the reward functions were
)
from selftaught.weights.rows import RLStepRow
from selftaught.weights.sft import (
    load_causal_lm,
    merged,
    on_cpu,
    plain_progress,
    prepare_trainable,
    save_atomic,
    time_cap,
)
from selftaught.weights.trainer import WeightTrainer, served_copy

# what a run decided after training, decided again when a --max-minutes stop resumes
RESUMED_KEYS = (
    "trained",
    "trained_val",
    "trained_val_scores",
    "gate",
    "trained_test",
    "stopped_by",
    "steps_done",
)

# TRL log keys → our history names
_METRICS = {
    "reward": "reward",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "frac_groups_no_signal",
    "kl": "kl",
    "completions/mean_length": "completion_length",
    "completions/clipped_ratio": "truncated",
    "loss": "loss",
    "learning_rate": "lr",
    "tools/call_frequency": "tool_calls_per_completion",
    "tools/failure_frequency": "tool_failure_share",
}
_REWARD_MEAN = re.compile(r"^rewards/(?P<name>.+)/mean$")  # TRL's per-function means


def reward_means(logs: dict[str, Any]) -> dict[str, float]:
    """Each reward function's mean of a logged step, as `rewards/<name>` (history's keys)."""
    out = {}
    for key, value in logs.items():
        hit = _REWARD_MEAN.match(key)
        if hit is not None:
            out[f"rewards/{hit['name']}"] = float(value)
    return out


def _make_callback(
    run: RunDir,
    reward: Reward | RewardSet,
    cfg: RLConfig,
    console: Console,
    on_row: Callable[[dict[str, Any]], None] = lambda row: None,
) -> Any:
    from transformers import TrainerCallback

    class MetricsCallback(TrainerCallback):
        """Writes one history row per logged step and warns when learning cannot happen."""

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if not logs or "reward" not in logs:
                return
            if not getattr(state, "is_world_process_zero", True):
                return  # under accelerate launch, one process writes the history
            row: dict[str, Any] = {"step": int(state.global_step)}
            for key, name in _METRICS.items():
                if key in logs:
                    row[name] = float(logs[key])
            row.update(reward_means(logs))
            row["all_rewards_equal"] = len(set(reward.last_rewards)) <= 1
            warn = []
            if row["all_rewards_equal"]:
                value = reward.last_rewards[0] if reward.last_rewards else 0.0
                warn.append(
                    f"every reward of this step was {value:g}: no learning signal (the task is "
                    "too hard or too easy for the model, or answers are cut off)"
                )
            if row.get("truncated", 0.0) > cfg.truncation_warn:
                warn.append(
                    f"{row['truncated']:.0%} of completions hit max_completion_length "
                    f"{cfg.max_completion_length}: truncated answers score 0; raise the cap"
                )
            row["warnings"] = warn
            run.append_history(row, key="step")
            on_row(row)
            means = {k[8:]: v for k, v in row.items() if k.startswith("rewards/")}
            each = " ".join(f"{k} {v:.3f}" for k, v in means.items())
            console.print(
                f"step {row['step']}: reward {row.get('reward', 0):.3f} "
                + (f"({each}) " if len(means) > 1 else "")
                + f"std {row.get('reward_std', 0):.3f} kl {row.get('kl', 0):.4f} "
                f"len {row.get('completion_length', 0):.1f} "
                f"truncated {row.get('truncated', 0):.0%}"
            )
            for w in warn:
                console.print(f"[bold red]WARNING step {row['step']}:[/] {w}")

    return MetricsCallback()


def _budget_stop(
    ledger: UsageLedger, console: Console, persist: Callable[[dict[str, Any]], None]
) -> Any:
    """A callback that records what training spent after every step (`persist`, so a
    resumed run keeps counting) and ends training after the step during which the budget ran
    out."""
    from transformers import TrainerCallback

    class BudgetStop(TrainerCallback):
        stopped_by: StopReason | None = None

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if getattr(state, "is_world_process_zero", True):
                persist(ledger.to_dict())
            why = ledger.exhausted()
            if why is not None and self.stopped_by is None:
                self.stopped_by = StopReason("budget", why, f"after step {state.global_step}")
                console.print(f"[bold yellow]budget exhausted[/] ({why}): training stops here")
            if why is not None:
                control.should_training_stop = True

    return BudgetStop()


@dataclass(frozen=True)
class RLResult(RunResult):
    """What a GRPO / GSPO run shipped (`RunResult` plus the start / trained val scores, the
    gate decision and the logged steps)."""

    kind: ClassVar[str] = "rl"

    shipped: str  # "base" or "trained"
    base_val: EvalResult
    trained_val: EvalResult
    base_test: EvalResult
    shipped_test: EvalResult
    gate: GateResult | None = None  # None: the run ended before the gate decided
    steps: list[RLStepRow] = field(default_factory=list)
    best_dir: Path | None = None
    step_seconds: float | None = None
    reward_errors: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._derive(
            base_score=self.base_score or self.base_test.score(),
            shipped_score=self.shipped_score or self.shipped_test.score(),
        )

    @classmethod
    def _fields_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        return {
            **super()._fields_from_dict(d),
            "shipped": d["shipped"],
            **{
                k: EvalResult.from_summary(d[k])
                for k in ("base_val", "trained_val", "base_test", "shipped_test")
            },
            "gate": GateResult.from_dict(d["gate"]) if d.get("gate") else None,
            "steps": [RLStepRow.from_dict(s, i) for i, s in enumerate(d.get("steps") or [])],
            "best_dir": Path(d["best_dir"]) if d.get("best_dir") else None,
            "step_seconds": d.get("step_seconds"),
            "reward_errors": int(d.get("reward_errors") or 0),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "shipped": self.shipped,
            "gate": self.gate.to_dict() if self.gate is not None else {},
            "base_val": self.base_val.summary(),
            "trained_val": self.trained_val.summary(),
            "base_test": self.base_test.summary(),
            "shipped_test": self.shipped_test.summary(),
            "gain": round(self.shipped_test.hard - self.base_test.hard, 4),
            "steps_logged": len(self.steps),
            "flat_steps": sum(1 for s in self.steps if s.all_rewards_equal),
            "reward_errors": self.reward_errors,
            "step_seconds": self.step_seconds,
            "best_dir": str(self.best_dir) if self.best_dir else None,
            "steps": [s.to_dict() for s in self.steps],
        }


class RLTrainer(WeightTrainer[RLConfig, RLResult]):
    """GRPO (`method="grpo"`) or GSPO (`"gspo"`, sequence-level importance sampling) on a
    local model with the task scorer as reward (and the others `config.rewards` names; the
    judge reward is scored by `judge_model`). Resumes from the last TRL checkpoint. The
    start and the trained model are evaluated through the one engine (`LocalModel` wrapping
    the model in memory → rollout → evaluation); the gate `optimize` uses decides which one
    ships. Under `accelerate launch`, every process trains and the main one evaluates and
    writes the run directory."""

    config_type: ClassVar[type] = RLConfig
    result_type: ClassVar[type[RLResult]] = RLResult
    settings_key: ClassVar[str] = "rl"

    def __init__(
        self,
        config: RLConfig,
        task: Task,
        model: ModelLike | Path | None = None,
        *,
        output_dir: str | Path | None = None,
        callbacks: Sequence[TrainerCallback] = (),
        progress: bool = True,
        console: Console | None = None,
        ledger: UsageLedger | None = None,
        judge_model: ModelLike | None = None,
    ):
        # every scored completion (and a judge charged to it) counts against the budget
        super().__init__(
            config,
            task,
            model,
            output_dir=output_dir,
            callbacks=callbacks,
            progress=progress,
            console=console,
            ledger=ledger,
        )
        self.policy = Policy()
        self.judge_name, self.judge = self._judge(judge_model)

    def _check_data(self) -> None:
        if not self.train_examples or not self.val_examples:
            raise ConfigError(f"task {self.task.name!r} needs train and val examples for RL")

    def _judge(self, judge_model: ModelLike | None) -> tuple[str | None, TrackedModel | None]:
        """The judge reward's model (its calls charged to `judge`), needed exactly when the
        judge reward is named."""
        named = "judge" in self.config.rewards
        if named and judge_model is None:
            raise ConfigError(
                "the judge reward needs a judge model: --judge-model SPEC (judge_model= in "
                "the Python API)"
            )
        if judge_model is None:
            return None, None
        if not named:
            raise ConfigError(
                "a judge model scores the judge reward, which is not named: add --reward "
                "judge=WEIGHT (rewards={..., 'judge': WEIGHT} in the Python API)"
            )
        model = resolve_model(judge_model)
        name = judge_model if isinstance(judge_model, str) else model.name
        return name, TrackedModel(model, self.ledger, "judge")

    def run_config(self) -> dict[str, Any]:
        out = super().run_config()
        if self.judge_name is not None:  # a resumed run is judged by the same model
            out["judge_model"] = self.judge_name
        return out

    def rewards(self, episodes: dict[str, Any] | None = None) -> RewardSet:
        """TRL's reward functions and weights, in the config's order. The first one charges
        each sampled completion to the budget (the judge charges its own calls)."""
        cfg = self.config
        funcs: list[Reward] = []
        for name in cfg.rewards:
            ledger = None if funcs else self.ledger
            if name == "format":
                funcs.append(
                    FormatReward(
                        self.task,
                        self.train_examples,
                        max_completion_length=cfg.max_completion_length,
                        ledger=ledger,
                    )
                )
            elif name == "judge":
                assert self.judge is not None  # refused in __init__ otherwise
                funcs.append(
                    JudgeReward(self.train_examples, self.judge, cfg.reward, ledger=ledger)
                )
            elif episodes is not None:
                funcs.append(
                    EpisodeReward(
                        self.task,
                        self.train_examples,
                        cfg.reward,
                        ledger=ledger,
                        max_iterations=episodes["args"]["max_tool_calling_iterations"],
                        max_completion_length=cfg.max_completion_length,
                    )
                )
            else:
                funcs.append(TaskReward(self.task, self.train_examples, cfg.reward, ledger=ledger))
        return RewardSet(funcs, list(cfg.rewards.values()))

    def _eval(self, model: Any, tok: Any, split: str, name: str) -> EvalResult:
        from selftaught.models.local import LocalModel

        served = served_copy(model, self.serving_dtype())
        chat = LocalModel.from_pretrained_model(served, tok, name=f"local:{name}")
        try:
            return evaluate_split(
                self.task,
                chat,
                self.policy,
                split=split,
                rollout=RolloutConfig(
                    params=GenerationParams(
                        max_tokens=self.config.eval_max_tokens, temperature=0.0
                    ),
                    progress=self.show_progress,
                    description=f"{name}: eval {split}",
                ),
            )
        finally:
            chat.close()

    def dataset(self, environment_of: dict[str, str] | None = None) -> Any:
        """Conversational prompts with their example ids (and, for episodes whose examples
        offer different tool sets, the name of each one's TRL environment)."""
        from datasets import Dataset

        rows = []
        for ex in self.train_examples:
            row = {"prompt": self.policy.messages(self.task, ex), "example_id": ex.id}
            if environment_of is not None:
                row["environment"] = environment_of[ex.id]
            rows.append(row)
        return Dataset.from_list(rows)

    def episode_setup(self, tok: Any) -> dict[str, Any]:
        """For a task with tools: what GRPOTrainer needs to play its episodes with TRL's own
        environment support (`weights.trl_env`): the environment factory, the tokenizer that
        renders tools as the local backend does, the dataset and the config's extras."""
        from selftaught.weights.trl_env import (
            SCHEMAS_KWARG,
            environment_factories,
            max_tool_iterations,
            trl_tokenizer,
        )

        classes, env_of, schemas = environment_factories(self.task, self.train_examples)
        several = len(classes) > 1
        return {
            "environment_factory": classes if several else next(iter(classes.values())),
            "processing_class": trl_tokenizer(tok),
            "train_dataset": self.dataset(env_of if several else None),
            "args": {
                "max_tool_calling_iterations": max_tool_iterations(self.task),
                "chat_template_kwargs": {SCHEMAS_KWARG: schemas},
            },
        }

    def grpo_args(self, use_cpu: bool, **extra: Any) -> Any:
        """TRL's GRPOConfig for this run (vLLM generation, server or colocated, when asked)."""
        from trl import GRPOConfig

        cfg = self.config
        vllm: dict[str, Any] = {}
        if cfg.vllm == "server":
            vllm = {
                "use_vllm": True,
                "vllm_mode": "server",
                "vllm_server_base_url": cfg.vllm_server_url,
            }
        elif cfg.vllm == "colocate":
            vllm = {
                "use_vllm": True,
                "vllm_mode": "colocate",
                "vllm_gpu_memory_utilization": cfg.vllm_gpu_memory_utilization,
            }
        return GRPOConfig(
            output_dir=str(self.run.path("checkpoints")),
            max_steps=cfg.steps,
            per_device_train_batch_size=cfg.prompts_per_step * cfg.num_generations,
            gradient_accumulation_steps=1,
            num_generations=cfg.num_generations,
            max_completion_length=cfg.max_completion_length,
            temperature=cfg.temperature,
            beta=cfg.beta,
            importance_sampling_level=cfg.importance_sampling_level,
            loss_type=cfg.loss_type,
            reward_weights=list(cfg.rewards.values()),
            learning_rate=cfg.lr(),
            logging_steps=1,
            save_strategy="steps",
            save_steps=max(1, cfg.steps // 4),
            save_total_limit=1,
            **trl_report_to(cfg.report_to),
            run_name=self.run.root.name,
            use_cpu=use_cpu,
            bf16=False,
            gradient_checkpointing=False,  # TRL's default on; not worth it on small models
            seed=cfg.seed,
            disable_tqdm=not self.show_progress,
            **vllm,
            **extra,
        )

    def train(self) -> RLResult:
        from accelerate import PartialState

        from selftaught.models.embedded import resolve_local_path

        if self.config.vllm is not None:  # before anything is written or loaded
            from selftaught.models.vllm import require_vllm

            require_vllm(f"--vllm-mode {self.config.vllm}")
        t_start = time.perf_counter()
        main = PartialState().is_main_process
        if main:
            self._begin()  # the resume check and on_start
        state = self.run.load_state() or {}
        if main:
            self._resume_after_time_stop(state)
        path = resolve_local_path(str(self.model_path) if self.model_path else None)
        model, tok = load_causal_lm(path, device=self.config.backend.device)
        model.eval()
        if main and "base_val" not in state:
            base_val = self._eval(model, tok, "val", "start")
            state["base_val"] = base_val.summary()
            state["base_val_scores"] = base_val.val_scores(self.gate)
            base_test = self._eval(model, tok, "test", "start")
            state["base_test"] = base_test.summary()
            self.run.save_state(state)
            for split in (base_val, base_test):
                self._scored(0, split, "base")
        PartialState().wait_for_everyone()
        if not state.get("trained"):
            model = self._train(model, tok, state, main)
        else:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(self.run.path("trained"))).eval()
        PartialState().wait_for_everyone()
        if main:  # the main process evaluates, decides and writes
            return self._ship(model, tok, path, state, time.perf_counter() - t_start)
        PartialState().wait_for_everyone()
        return self._result(self.run.load_state() or {}, self.run.path("best"), 0.0)

    def _resume_after_time_stop(self, state: dict[str, Any]) -> None:
        """A run `--max-minutes` stopped trains on from the checkpoint it wrote there (with
        this invocation's limit); what was gated and shipped is decided again after."""
        stop = StopReason.read(state.get("stopped_by"))
        ckpt = self.run.path("checkpoints")
        if stop is None or stop.kind != "max_minutes" or not any(ckpt.glob("checkpoint-*")):
            return
        for key in RESUMED_KEYS:
            state.pop(key, None)
        self.run.save_state(state)

    def _train(self, model: Any, tok: Any, state: dict[str, Any], main: bool) -> Any:
        """GRPO / GSPO through TRL; returns the trained model (merged) and records the run."""
        from trl import GRPOTrainer

        cfg = self.config
        ledger = self.ledger
        if "usage" in state:  # a resumed run has spent what it spent
            self._restore_usage(state["usage"])
        episodes = self.episode_setup(tok) if is_tool_task(self.task) else None
        rewards = self.rewards(episodes)

        def persist(usage: dict[str, Any]) -> None:
            state["usage"] = usage
            self.run.save_state(state)

        budget_stop = _budget_stop(ledger, self.console, persist)
        timed_out: list[StopReason] = []  # --max-minutes: a checkpoint is saved at the stop
        deadline = Deadline.start(cfg.stops.max_minutes)
        ckpt_dir = self.run.path("checkpoints")
        trainable = prepare_trainable(model, cfg.backend)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = GRPOTrainer(
                model=trainable,
                # Rewards return list[float], which TRL takes; list's invariance alone refuses
                reward_funcs=cast("list[Any]", rewards.funcs),
                args=self.grpo_args(on_cpu(model), **(episodes["args"] if episodes else {})),
                train_dataset=episodes["train_dataset"] if episodes else self.dataset(),
                processing_class=episodes["processing_class"] if episodes else tok,
                callbacks=[
                    _make_callback(self.run, rewards, cfg, self.console, self._on_step),
                    budget_stop,
                    plain_progress(cfg.method, self.show_progress),
                    time_cap(deadline, timed_out, save=True),
                ],
                **({"environment_factory": episodes["environment_factory"]} if episodes else {}),
            )
        resume = any(ckpt_dir.glob("checkpoint-*")) if ckpt_dir.exists() else False
        if resume:
            self.console.print(f"[bold]resuming[/] from the last checkpoint in {ckpt_dir}")
        t0 = time.perf_counter()
        try:
            out = trainer.train(resume_from_checkpoint=True if resume else None)
        except RewardError as err:
            atomic_write_json(self.run.path("error.json"), {"stage": "train", "cause": str(err)})
            raise ConfigError(f"training stopped: {err}") from err
        seconds = time.perf_counter() - t0
        steps_run = max(1, int(out.global_step))  # a resumed run times only its own steps
        if rewards.batches and rewards.flat_batches == rewards.batches:
            self.console.print(
                "[bold red]WARNING:[/] every step had all rewards equal: the run learned "
                "nothing. Check the answer format, max_completion_length and task difficulty."
            )
        model = merged(trainable).eval()
        stop = budget_stop.stopped_by or (timed_out[0] if timed_out else None)
        if timed_out:
            self.console.print(
                f"[bold yellow]stopped:[/] {timed_out[0]}: the gate decides on what was "
                "learned; re-running the same command trains on from here"
            )
        state.update(
            trained=True,
            steps_done=int(out.global_step),
            step_seconds=None if resume else round(seconds / steps_run, 2),
            flat_batches=rewards.flat_batches,
            batches=rewards.batches,
            reward_errors=rewards.errors,
            usage=ledger.to_dict(),
            stopped_by=stop_dict(stop),
        )
        if main:
            save_atomic(model, self.run.path("trained"), tok)
            if not timed_out:  # `trained/` supersedes them; a timed-out run resumes from one
                shutil.rmtree(ckpt_dir, ignore_errors=True)
            self.run.save_state(state)
        return model

    def _ship(
        self, model: Any, tok: Any, path: Path, state: dict[str, Any], seconds: float
    ) -> RLResult:
        """Gate the trained model against the start model on val; ship the winner."""
        base_val = EvalResult.from_summary(state["base_val"])
        if "trained_val" not in state:
            trained = self._eval(model, tok, "val", "trained")
            state["trained_val"] = trained.summary()
            state["trained_val_scores"] = trained.val_scores(self.gate)
            self.run.save_state(state)
        trained_val = EvalResult.from_summary(state["trained_val"])
        last_step = int(state.get("steps_done") or self.config.steps)
        self._scored(last_step, trained_val, "trained")
        self.console.print(f"start model:   {base_val.line()}")
        self.console.print(f"trained model: {trained_val.line()}")
        result = gate(
            state["trained_val_scores"],
            state["base_val_scores"],
            state["base_val_scores"],
            self.gate,
        )
        state["gate"] = result.to_dict()
        self._gated(last_step, result.to_dict())
        better = result.decision == "accept_new_best"
        if better:
            if "trained_test" not in state:
                state["trained_test"] = self._eval(model, tok, "test", "trained").summary()
            save_atomic(model, self.run.path("best"), tok)
        else:
            self.console.print(
                f"[yellow]the gate kept the start model ({result.reason}): it is shipped[/]"
            )
            base_model, _ = load_causal_lm(path, device=self.config.backend.device)
            save_atomic(base_model, self.run.path("best"), tok)
        self.run.save_state(state)
        atomic_write_json(
            self.run.path("best", "best.json"),
            {"shipped": "trained" if better else "base", "gate": result.to_dict()},
        )
        out = self._end(self._result(state, self.run.path("best"), seconds))
        from accelerate import PartialState

        PartialState().wait_for_everyone()  # the other processes read the shipped result
        return out

    def _result(self, state: dict[str, Any], best_dir: Path | None, seconds: float) -> RLResult:
        better = state.get("gate", {}).get("decision") == "accept_new_best"
        base_test = EvalResult.from_summary(state["base_test"])
        return RLResult(
            shipped="trained" if better else "base",
            base_val=EvalResult.from_summary(state["base_val"]),
            trained_val=EvalResult.from_summary(state.get("trained_val", state["base_val"])),
            base_test=base_test,
            shipped_test=EvalResult.from_summary(state["trained_test"]) if better else base_test,
            gate=GateResult.from_dict(state["gate"]) if state.get("gate") else None,
            steps=[RLStepRow.from_dict(row, i) for i, row in enumerate(self.run.history())],
            best_dir=best_dir,
            seconds=seconds,
            step_seconds=state.get("step_seconds"),
            reward_errors=state.get("reward_errors", 0),
            stopped_by=StopReason.read(state.get("stopped_by")),
            run_dir=self.run.root,
            method=self.method,
            task=self.task.name,
            usage=state.get("usage") or {},
        )

    def _on_step(self, row: dict[str, Any]) -> None:
        """TRL's logged step, bridged to our callbacks."""
        metrics = {k: v for k, v in row.items() if k not in ("step", "warnings")}
        self.callbacks.step(self.info, step=row["step"], metrics=metrics)
