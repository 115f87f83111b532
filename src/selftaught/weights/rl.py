"""Online RL with verifiable rewards: GRPO / GSPO through TRL's GRPOTrainer, the task's own
scorer as the reward. Prompts are conversational (chat template); free-text answers are
scored as text, JSON only for games.

Each logged step lands in history.jsonl with mean reward, reward std within groups, KL,
completion length and the share of completions cut by the length cap. The run warns loudly
when every reward of a step is equal (no learning signal) or when most completions are
truncated (the cap zeroes the reward). The trained model ships only when the gate (the one
`optimize` uses: margin / paired test on per-example val scores) says it beats the start
model; otherwise the start model ships.

A task with tools trains on whole episodes through TRL's own `environment_factory` support
(the adapter is `weights.trl_env`): the model calls the task's tools during generation, tool
results are masked out of the loss by TRL, and the reward is the task's `score_episode`.

Past one machine: `vllm_server_url` has TRL generate with a vLLM server (`trl vllm-serve
--model PATH`), and the run works under `accelerate launch` (see the README)."""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console

from selftaught.callbacks import CallbackList, RunInfo, TrainerCallback
from selftaught.errors import RunError
from selftaught.evaluation import EvalResult, evaluate_split
from selftaught.gate import gate
from selftaught.models.base import Completion, GenerationParams
from selftaught.models.resolve import ModelLike, local_model_path
from selftaught.models.usage import UsageLedger
from selftaught.policy import Policy
from selftaught.results import RunResult, Score
from selftaught.rollout import RolloutConfig
from selftaught.runs import RunDir, atomic_write_json
from selftaught.tasks.base import Example, Task, check_disjoint
from selftaught.tasks.episode import is_tool_task
from selftaught.tracking import trl_report_to
from selftaught.weights.config import (
    ConfigError,
    RLConfig,
    default_train_dir,
    resume_settings,
    task_gate,
)
from selftaught.weights.sft import load_causal_lm, merged, on_cpu, prepare_trainable, save_atomic

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


def completion_text(completion: Any) -> str:
    """TRL passes conversational completions as a list of messages; plain ones as text."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


class RewardError(RunError):
    """Most rewards of a generation batch could not be computed: the run stops with the cause
    instead of learning from made-up rewards."""


class TaskReward:
    """The task's scorer as a TRL reward function, under the one error rule: a scorer that
    raises is an error, recorded with its message and counted, never a 0. An errored
    completion gets the mean reward of the other completions for its prompt in the batch, so
    its advantage is zero: it teaches nothing, and it does not drag its group down. A batch
    whose rewards are mostly errors stops the run (`RewardError`) with the first cause.

    Also records, per call (= one generation batch), whether every reward was equal, so the
    run can say there was no signal."""

    def __init__(
        self,
        task: Task,
        examples: list[Example],
        kind: str = "soft",
        *,
        max_error_share: float = 0.5,
        ledger: UsageLedger | None = None,
    ):
        self.task = task
        self.ledger = ledger  # each scored completion is charged here (the run's budget)
        self.by_id = {ex.id: ex for ex in examples}
        self.kind = kind
        self.max_error_share = max_error_share
        self.__name__ = f"{task.name}:{kind}"  # TRL names the reward column after this
        self.flat_batches = 0
        self.batches = 0
        self.errors = 0
        self.scored = 0
        self.error_messages: list[str] = []
        self.last_rewards: list[float] = []

    def _charge(self, completion_ids: list[list[int]]) -> None:
        if self.ledger is not None:
            _charge_completions(self.ledger, "local:grpo-policy", completion_ids)

    def _score(
        self, completion: Any, eid: str, environment: Any = None, n_tokens: int = 0
    ) -> tuple[float | None, str | None]:
        from selftaught.rollout import score_reply

        score, error, _ = score_reply(
            self.task, completion_text(completion), self.by_id[eid], truncated=False
        )
        return self._value(score, error)

    def _value(self, score: Any, error: str | None) -> tuple[float | None, str | None]:
        if score is None:
            return None, error
        return float(score.soft if self.kind == "soft" else score.hard), None

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        example_id: list[str],
        completion_ids: list[list[int]] | None = None,
        environments: list[Any] | None = None,
        **_: Any,
    ) -> list[float]:
        ids = completion_ids or [[] for _ in completions]
        self._charge(ids)
        envs = environments or [None] * len(completions)
        raw: list[float | None] = []
        for completion, eid, env, tokens in zip(completions, example_id, envs, ids, strict=True):
            value, error = self._score(completion, eid, env, len(tokens))
            raw.append(value)
            if error is not None:
                self.errors += 1
                if len(self.error_messages) < 20:
                    self.error_messages.append(error)
        self.batches += 1
        failed = sum(v is None for v in raw)
        self.scored += len(raw) - failed
        if raw and failed / len(raw) > self.max_error_share:
            raise RewardError(
                f"{failed} of {len(raw)} rewards of a step could not be computed (scorer "
                f"errors), e.g. {self.error_messages[-1]}"
            )
        rewards = _neutral_fill(raw, example_id)
        self.last_rewards = rewards
        if len(set(rewards)) <= 1:
            self.flat_batches += 1
        return rewards


class EpisodeReward(TaskReward):
    """The task's `score_episode` as the reward of an episode TRL played with its
    `environment_factory` (see `weights.trl_env`): failed calls cost soft score as in every
    other mode, and a crashed tool makes the completion an error (neutral), never a 0."""

    def __init__(
        self,
        task: Task,
        examples: list[Example],
        kind: str = "soft",
        *,
        max_iterations: int,
        max_completion_length: int,
        **kw: Any,
    ):
        super().__init__(task, examples, kind, **kw)
        self.max_iterations = max_iterations
        self.max_completion_length = max_completion_length

    def _score(
        self, completion: Any, eid: str, environment: Any = None, n_tokens: int = 0
    ) -> tuple[float | None, str | None]:
        from selftaught.rollout import score_episode
        from selftaught.weights.trl_env import episode_from_completion

        if environment is None or getattr(environment, "env", None) is None:
            return None, f"{eid}: TRL gave no environment for this episode"
        if environment.crash:
            return None, f"tool error on {eid}: {environment.crash}"
        if not isinstance(completion, list):
            completion = [{"role": "assistant", "content": str(completion)}]
        episode, truncated = episode_from_completion(
            completion,
            environment,
            max_iterations=self.max_iterations,
            truncated=n_tokens >= self.max_completion_length,
        )
        score, error, _ = score_episode(self.task, episode, self.by_id[eid], truncated)
        return self._value(score, error)


def _charge_completions(ledger: UsageLedger, name: str, completion_ids: list[list[int]]) -> None:
    for ids in completion_ids:
        ledger.record("target", name, Completion(text="", completion_tokens=len(ids)))


def _neutral_fill(raw: list[float | None], group_of: list[str]) -> list[float]:
    """Errored rewards become their group's mean over the scored ones (advantage zero)."""
    groups: dict[str, list[float]] = {}
    for value, group in zip(raw, group_of, strict=True):
        if value is not None:
            groups.setdefault(group, []).append(value)
    filled = []
    for value, group in zip(raw, group_of, strict=True):
        if value is None:
            scored = groups.get(group, [])
            value = sum(scored) / len(scored) if scored else 0.0
        filled.append(value)
    return filled


def _make_callback(
    run: RunDir,
    reward: TaskReward,
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
            console.print(
                f"step {row['step']}: reward {row.get('reward', 0):.3f} "
                f"std {row.get('reward_std', 0):.3f} kl {row.get('kl', 0):.4f} "
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
        stopped_by: str | None = None

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if getattr(state, "is_world_process_zero", True):
                persist(ledger.to_dict())
            why = ledger.exhausted()
            if why is not None and self.stopped_by is None:
                self.stopped_by = f"budget ({why}) after step {state.global_step}"
                console.print(f"[bold yellow]budget exhausted[/] ({why}): training stops here")
            if why is not None:
                control.should_training_stop = True

    return BudgetStop()


@dataclass
class RLResult(RunResult):
    """What a GRPO / GSPO run shipped (`RunResult` plus the start / trained val scores, the
    gate decision and the logged steps)."""

    kind: ClassVar[str] = "rl"

    shipped: str  # "base" or "trained"
    base_val: EvalResult
    trained_val: EvalResult
    base_test: EvalResult
    shipped_test: EvalResult
    gate: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    best_dir: Path | None = None
    step_seconds: float | None = None
    reward_errors: int = 0

    def __post_init__(self) -> None:
        self.base_score = self.base_score or Score.from_summary(self.base_test.summary())
        self.shipped_score = self.shipped_score or Score.from_summary(self.shipped_test.summary())

    @classmethod
    def _fields_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        return {
            **super()._fields_from_dict(d),
            "shipped": d["shipped"],
            **{
                k: EvalResult.from_summary(d[k])
                for k in ("base_val", "trained_val", "base_test", "shipped_test")
            },
            "gate": d.get("gate") or {},
            "steps": list(d.get("steps") or []),
            "best_dir": Path(d["best_dir"]) if d.get("best_dir") else None,
            "step_seconds": d.get("step_seconds"),
            "reward_errors": int(d.get("reward_errors") or 0),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "shipped": self.shipped,
            "stopped_by": self.stopped_by,
            "gate": self.gate,
            "base_val": self.base_val.summary(),
            "trained_val": self.trained_val.summary(),
            "base_test": self.base_test.summary(),
            "shipped_test": self.shipped_test.summary(),
            "gain": round(self.shipped_test.hard - self.base_test.hard, 4),
            "steps_logged": len(self.steps),
            "flat_steps": sum(1 for s in self.steps if s.get("all_rewards_equal")),
            "reward_errors": self.reward_errors,
            "step_seconds": self.step_seconds,
            "best_dir": str(self.best_dir) if self.best_dir else None,
            "steps": self.steps,
        }


class RLTrainer:
    """GRPO (`method="grpo"`) or GSPO (`"gspo"`, sequence-level importance sampling) on a
    local model with the task scorer as reward. Resumes from the last TRL checkpoint. The
    start and the trained model are evaluated through the one engine (`LocalModel` wrapping
    the model in memory → rollout → evaluation); the gate `optimize` uses decides which one
    ships. Under `accelerate launch`, every process trains and the main one evaluates and
    writes the run directory."""

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
    ):
        if not isinstance(config, RLConfig):
            raise ConfigError(f"RLTrainer needs an RLConfig, got {type(config).__name__}")
        check_disjoint(task)
        self.task = task
        self.config = config
        self.model_path = local_model_path(model)
        self.progress = progress
        self.console = console or Console(stderr=True)
        self.run = RunDir(output_dir or default_train_dir(config, task.name))
        self.callbacks = CallbackList(callbacks)
        self.info = RunInfo(config.method, task.name, self.run.root, config.to_dict())
        self.train_examples = task.examples("train")
        self.val_examples = task.examples("val")
        self.test_examples = task.examples("test")
        if not self.train_examples or not self.val_examples:
            raise ConfigError(f"task {task.name!r} needs train and val examples for RL")
        self.policy = Policy()
        self.gate = task_gate(config.gate, task.kind)
        # every scored completion (and a judge charged to it) counts against the budget
        self.ledger = ledger or UsageLedger()

    def run_config(self) -> dict[str, Any]:
        return {
            "method": self.config.method,
            "task": self.task.name,
            "model": str(self.model_path or "embedded"),
            "sizes": [len(self.train_examples), len(self.val_examples), len(self.test_examples)],
            "rl": resume_settings(self.config),
        }

    def _eval(self, model: Any, tok: Any, split: str, name: str) -> EvalResult:
        from selftaught.models.local import LocalModel

        chat = LocalModel.from_pretrained_model(model, tok, name=f"local:{name}")
        try:
            return evaluate_split(
                self.task,
                chat,
                self.policy,
                split=split,  # type: ignore[arg-type]
                rollout=RolloutConfig(
                    params=GenerationParams(
                        max_tokens=self.config.eval_max_tokens, temperature=0.0
                    ),
                    progress=self.progress,
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
        """TRL's GRPOConfig for this run (vLLM generation in server mode when asked)."""
        from trl import GRPOConfig

        cfg = self.config
        vllm: dict[str, Any] = {}
        if cfg.vllm_server_url:
            vllm = {
                "use_vllm": True,
                "vllm_mode": "server",
                "vllm_server_base_url": cfg.vllm_server_url,
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
            disable_tqdm=not self.progress,
            **vllm,
            **extra,
        )

    def train(self) -> RLResult:
        from accelerate import PartialState

        from selftaught.models.embedded import resolve_local_path

        t_start = time.perf_counter()
        main = PartialState().is_main_process
        if main:
            self.run.check_or_write_config(self.run_config())
            self.callbacks.start(self.info)
        state = self.run.load_state() or {}
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

    def _scored(self, step: int, result: EvalResult, label: str) -> None:
        scores = Score.from_summary(result.summary())
        self.callbacks.evaluate(
            self.info, step=step, split=result.split, scores=scores, label=label
        )

    def _train(self, model: Any, tok: Any, state: dict[str, Any], main: bool) -> Any:
        """GRPO / GSPO through TRL; returns the trained model (merged) and records the run."""
        from trl import GRPOTrainer

        cfg = self.config
        ledger = self.ledger
        ledger.budget = cfg.budget
        if "usage" in state:  # a resumed run has spent what it spent
            from selftaught.models.usage import RoleUsage

            ledger.roles = {role: RoleUsage(**u) for role, u in state["usage"].items()}
        episodes = self.episode_setup(tok) if is_tool_task(self.task) else None
        reward: TaskReward
        if episodes is not None:
            reward = EpisodeReward(
                self.task,
                self.train_examples,
                cfg.reward,
                ledger=ledger,
                max_iterations=episodes["args"]["max_tool_calling_iterations"],
                max_completion_length=cfg.max_completion_length,
            )
        else:
            reward = TaskReward(self.task, self.train_examples, cfg.reward, ledger=ledger)

        def persist(usage: dict[str, Any]) -> None:
            state["usage"] = usage
            self.run.save_state(state)

        budget_stop = _budget_stop(ledger, self.console, persist)
        ckpt_dir = self.run.path("checkpoints")
        trainable = prepare_trainable(model, cfg.backend)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = GRPOTrainer(
                model=trainable,
                reward_funcs=reward,
                args=self.grpo_args(on_cpu(model), **(episodes["args"] if episodes else {})),
                train_dataset=episodes["train_dataset"] if episodes else self.dataset(),
                processing_class=episodes["processing_class"] if episodes else tok,
                callbacks=[
                    _make_callback(self.run, reward, cfg, self.console, self._on_step),
                    budget_stop,
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
        if reward.batches and reward.flat_batches == reward.batches:
            self.console.print(
                "[bold red]WARNING:[/] every step had all rewards equal: the run learned "
                "nothing. Check the answer format, max_completion_length and task difficulty."
            )
        model = merged(trainable).eval()
        state.update(
            trained=True,
            steps_done=int(out.global_step),
            step_seconds=None if resume else round(seconds / steps_run, 2),
            flat_batches=reward.flat_batches,
            batches=reward.batches,
            reward_errors=reward.errors,
            usage=ledger.to_dict(),
            stopped_by=budget_stop.stopped_by,
        )
        if main:
            save_atomic(model, self.run.path("trained"), tok)
            shutil.rmtree(ckpt_dir, ignore_errors=True)  # `trained/` supersedes them
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
        self.callbacks.gate(
            self.info,
            step=last_step,
            decision=result.decision,
            reason=result.reason,
            details=result.to_dict(),
        )
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
        out = self._result(state, self.run.path("best"), seconds)
        atomic_write_json(self.run.path("result.json"), out.to_dict())
        self.callbacks.end(self.info, out)
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
            gate=state.get("gate", {}),
            steps=self.run.history(),
            best_dir=best_dir,
            seconds=seconds,
            step_seconds=state.get("step_seconds"),
            reward_errors=state.get("reward_errors", 0),
            stopped_by=state.get("stopped_by"),
            run_dir=self.run.root,
            method=self.config.method,
            task=self.task.name,
            usage=state.get("usage") or {},
        )

    def _on_step(self, row: dict[str, Any]) -> None:
        """TRL's logged step, bridged to our callbacks."""
        metrics = {k: v for k, v in row.items() if k not in ("step", "warnings")}
        self.callbacks.step(self.info, step=row["step"], metrics=metrics)
