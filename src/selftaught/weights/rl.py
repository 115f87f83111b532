"""Online RL with verifiable rewards: GRPO / GSPO through TRL's GRPOTrainer, the task's own
scorer as the reward. Prompts are conversational (chat template); free-text answers are
scored as text, JSON only for games.

Each logged step lands in history.jsonl with mean reward, reward std within groups, KL,
completion length and the share of completions cut by the length cap. The run warns loudly
when every reward of a step is equal (no learning signal) or when most completions are
truncated (the cap zeroes the reward). The model shipped is the better of the start model
and the trained one on val."""

from __future__ import annotations

import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from selftaught.policy import Policy
from selftaught.runs import RunDir, atomic_write_json
from selftaught.tasks.base import Example, Task, check_disjoint
from selftaught.weights.config import ConfigError, RLConfig
from selftaught.weights.sampling import EvalResult, HFGenerator, evaluate
from selftaught.weights.sft import load_model, merged, prepare_trainable, save_atomic, torch_device

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
}


def completion_text(completion: Any) -> str:
    """TRL passes conversational completions as a list of messages; plain ones as text."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


class TaskReward:
    """The task's scorer as a TRL reward function. Records, per call (= one generation
    batch), whether every reward was equal, so the run can say there was no signal."""

    def __init__(self, task: Task, examples: list[Example], kind: str = "soft"):
        self.task = task
        self.by_id = {ex.id: ex for ex in examples}
        self.kind = kind
        self.__name__ = f"{task.name}:{kind}"  # TRL names the reward column after this
        self.flat_batches = 0
        self.batches = 0
        self.last_rewards: list[float] = []

    def __call__(
        self, prompts: list[Any], completions: list[Any], example_id: list[str], **_: Any
    ) -> list[float]:
        rewards = []
        for completion, eid in zip(completions, example_id, strict=True):
            try:
                score = self.task.score(completion_text(completion), self.by_id[eid])
                rewards.append(float(score.soft if self.kind == "soft" else score.hard))
            except Exception:  # one odd reply must not stop training: it earns nothing
                rewards.append(0.0)
        self.batches += 1
        self.last_rewards = rewards
        if len(set(rewards)) <= 1:
            self.flat_batches += 1
        return rewards


def _make_callback(run: RunDir, reward: TaskReward, cfg: RLConfig, console: Console) -> Any:
    from transformers import TrainerCallback

    class MetricsCallback(TrainerCallback):
        """Writes one history row per logged step and warns when learning cannot happen."""

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if not logs or "reward" not in logs:
                return
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
            console.print(
                f"step {row['step']}: reward {row.get('reward', 0):.3f} "
                f"std {row.get('reward_std', 0):.3f} kl {row.get('kl', 0):.4f} "
                f"len {row.get('completion_length', 0):.1f} "
                f"truncated {row.get('truncated', 0):.0%}"
            )
            for w in warn:
                console.print(f"[bold red]WARNING step {row['step']}:[/] {w}")

    return MetricsCallback()


@dataclass
class RLResult:
    shipped: str  # "base" or "trained"
    base_val: EvalResult
    trained_val: EvalResult
    base_test: EvalResult
    shipped_test: EvalResult
    steps: list[dict[str, Any]] = field(default_factory=list)
    best_dir: Path | None = None
    seconds: float = 0.0
    step_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "shipped": self.shipped,
            "base_val": self.base_val.to_dict(),
            "trained_val": self.trained_val.to_dict(),
            "base_test": self.base_test.to_dict(),
            "shipped_test": self.shipped_test.to_dict(),
            "gain": round(self.shipped_test.accuracy - self.base_test.accuracy, 4),
            "steps_logged": len(self.steps),
            "flat_steps": sum(1 for s in self.steps if s.get("all_rewards_equal")),
            "step_seconds": self.step_seconds,
            "best_dir": str(self.best_dir) if self.best_dir else None,
            "seconds": round(self.seconds, 1),
        }


def _eval_from_dict(d: dict[str, Any]) -> EvalResult:
    return EvalResult(**{**d, "ci": tuple(d["ci"])})


class RLTrainer:
    """GRPO (`method="grpo"`) or GSPO (`"gspo"`, sequence-level importance sampling) on a
    local model with the task scorer as reward. Resumes from the last TRL checkpoint."""

    def __init__(
        self,
        task: Task,
        config: RLConfig,
        run_dir: str | Path,
        *,
        model_path: str | Path | None = None,
        progress: bool = True,
        console: Console | None = None,
    ):
        check_disjoint(task)
        self.task = task
        self.config = config
        self.model_path = model_path
        self.progress = progress
        self.console = console or Console(stderr=True)
        self.run = RunDir(run_dir)
        self.train_examples = task.examples("train")
        self.val_examples = task.examples("val")
        self.test_examples = task.examples("test")
        if not self.train_examples or not self.val_examples:
            raise ConfigError(f"task {task.name!r} needs train and val examples for RL")
        self.policy = Policy()

    def run_config(self) -> dict[str, Any]:
        return {
            "method": self.config.method,
            "task": self.task.name,
            "model": str(self.model_path or "embedded"),
            "sizes": [len(self.train_examples), len(self.val_examples), len(self.test_examples)],
            "rl": self.config.to_dict(),
        }

    def _eval(self, model: Any, tok: Any, split: str) -> EvalResult:
        examples = self.val_examples if split == "val" else self.test_examples
        return evaluate(
            HFGenerator(model, tok),
            self.task,
            examples,
            split=split,
            max_tokens=self.config.eval_max_tokens,
            policy=self.policy,
            progress=self.progress,
        )

    def dataset(self) -> Any:
        from datasets import Dataset

        return Dataset.from_list(
            [
                {"prompt": self.policy.messages(self.task, ex), "example_id": ex.id}
                for ex in self.train_examples
            ]
        )

    def train(self) -> RLResult:
        from trl import GRPOConfig, GRPOTrainer

        from selftaught.models.embedded import resolve_local_path

        t_start = time.perf_counter()
        cfg = self.config
        self.run.check_or_write_config(self.run_config())
        state = self.run.load_state() or {}
        path = resolve_local_path(str(self.model_path) if self.model_path else None)
        model, tok = load_model(path)
        model.eval()
        if "base_val" not in state:
            state["base_val"] = self._eval(model, tok, "val").to_dict()
            state["base_test"] = self._eval(model, tok, "test").to_dict()
            self.run.save_state(state)
        base_val = _eval_from_dict(state["base_val"])
        base_test = _eval_from_dict(state["base_test"])
        self.console.print(f"start model: {base_val.line()} | {base_test.line()}")

        if not state.get("trained"):
            reward = TaskReward(self.task, self.train_examples, cfg.reward)
            ckpt_dir = self.run.path("checkpoints")
            args = GRPOConfig(
                output_dir=str(ckpt_dir),
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
                report_to="none",
                use_cpu=torch_device() == "cpu",
                bf16=False,
                gradient_checkpointing=False,  # TRL's default on; not worth it on small models
                seed=cfg.seed,
                disable_tqdm=not self.progress,
            )
            trainable = prepare_trainable(model, cfg.backend)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer = GRPOTrainer(
                    model=trainable,
                    reward_funcs=reward,
                    args=args,
                    train_dataset=self.dataset(),
                    processing_class=tok,
                    callbacks=[_make_callback(self.run, reward, cfg, self.console)],
                )
            resume = any(ckpt_dir.glob("checkpoint-*")) if ckpt_dir.exists() else False
            if resume:
                self.console.print(f"[bold]resuming[/] from the last checkpoint in {ckpt_dir}")
            t0 = time.perf_counter()
            out = trainer.train(resume_from_checkpoint=True if resume else None)
            seconds = time.perf_counter() - t0
            # a resumed run times only the steps it ran itself
            steps_run = max(1, int(out.global_step))
            if reward.batches and reward.flat_batches == reward.batches:
                self.console.print(
                    "[bold red]WARNING:[/] every step had all rewards equal: the run learned "
                    "nothing. Check the answer format, max_completion_length and task difficulty."
                )
            model = merged(trainable).eval()
            save_atomic(model, self.run.path("trained"), tok)
            shutil.rmtree(ckpt_dir, ignore_errors=True)  # `trained/` supersedes them
            state.update(
                trained=True,
                step_seconds=None if resume else round(seconds / steps_run, 2),
                flat_batches=reward.flat_batches,
                batches=reward.batches,
            )
            self.run.save_state(state)
        else:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(self.run.path("trained"))).eval()

        if "trained_val" not in state:
            state["trained_val"] = self._eval(model, tok, "val").to_dict()
            self.run.save_state(state)
        trained_val = _eval_from_dict(state["trained_val"])
        self.console.print(f"trained model: {trained_val.line()}")
        better = trained_val.accuracy > base_val.accuracy
        if better:
            if "trained_test" not in state:
                state["trained_test"] = self._eval(model, tok, "test").to_dict()
                self.run.save_state(state)
            shipped_test = _eval_from_dict(state["trained_test"])
            save_atomic(model, self.run.path("best"), tok)
        else:
            shipped_test = base_test
            self.console.print(
                "[yellow]training did not beat the start model on val: the start "
                "model is shipped[/]"
            )
            base_model, _ = load_model(path)
            save_atomic(base_model, self.run.path("best"), tok)
        atomic_write_json(
            self.run.path("best", "best.json"),
            {
                "shipped": "trained" if better else "base",
                "val": (trained_val if better else base_val).to_dict(),
            },
        )
        result = RLResult(
            shipped="trained" if better else "base",
            base_val=base_val,
            trained_val=trained_val,
            base_test=base_test,
            shipped_test=shipped_test,
            steps=self.run.history(),
            best_dir=self.run.path("best"),
            seconds=time.perf_counter() - t_start,
            step_seconds=state.get("step_seconds"),
        )
        atomic_write_json(self.run.path("result.json"), result.to_dict())
        return result
