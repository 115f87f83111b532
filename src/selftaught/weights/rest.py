"""Expert iteration / ReST-EM, and plain SFT on references, over a local model.

Each round: sample k completions per train prompt at temperature > 0 from the latest model
→ score each with the task → keep the elite → fine-tune (from the base model by default, as
in ReST-EM) → evaluate on val. The base model is round 0; the model shipped in `best/` is
the best round on val, never simply the last, so a run that never improves ships the base.

Run directory:
    config.json          settings (a resume with other settings is refused)
    history.jsonl        one row per round (round 0 = base)
    state.json           completed rounds, best round: written after each finished round
    rounds/N/samples.jsonl   every scored sample of round N, with the prompt it was scored on
    rounds/N/adapter/    LoRA adapter of round N (`full` / `scratch`: rounds/N/model/)
    best/                the shipped model (merged weights + tokenizer) and best.json
    result.json          base vs shipped test accuracy with 95% intervals
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from selftaught.models.base import GenerationParams
from selftaught.policy import Policy
from selftaught.runs import RunDir, atomic_write_json, read_json, write_jsonl
from selftaught.tasks.base import Task, check_disjoint
from selftaught.weights.config import ConfigError, RestConfig
from selftaught.weights.elite import select_elite
from selftaught.weights.sampling import (
    EvalResult,
    HFGenerator,
    RandomStrategySampler,
    Sample,
    Sampler,
    evaluate,
    sample_and_score,
)
from selftaught.weights.sft import (
    apply_adapter,
    check_batch,
    load_model,
    merged,
    prepare_trainable,
    save_atomic,
    sft_train,
)


@dataclass
class RestResult:
    """What a run shipped and how it got there."""

    best_round: int
    base_test: EvalResult
    shipped_test: EvalResult
    rounds: list[dict[str, Any]] = field(default_factory=list)
    best_dir: Path | None = None
    seconds: float = 0.0

    @property
    def gain(self) -> float:
        return self.shipped_test.accuracy - self.base_test.accuracy

    def to_dict(self) -> dict[str, Any]:
        return {
            "best_round": self.best_round,
            "shipped": "base model" if self.best_round == 0 else f"round {self.best_round}",
            "base_test": self.base_test.to_dict(),
            "shipped_test": self.shipped_test.to_dict(),
            "gain": round(self.gain, 4),
            "best_dir": str(self.best_dir) if self.best_dir else None,
            "seconds": round(self.seconds, 1),
        }


def _find_random_strategy(task: Task) -> Any:
    fn = getattr(task, "random_strategy", None)
    if fn is None:
        import sys

        fn = getattr(sys.modules.get(type(task).__module__), "random_strategy", None)
    return fn


class _GameRandomPolicy:
    """Adapter so RandomStrategySampler finds `random_strategy` on any game task."""

    def __init__(self, task: Task):
        fn = _find_random_strategy(task)
        if fn is None:
            raise ConfigError(
                f"backend 'scratch' needs a game task with random_strategy(rng); "
                f"{task.name!r} has none"
            )
        self.name = task.name
        self.random_strategy = fn


class RestTrainer:
    """ReST-EM (`method="rest"`) or one round of SFT on the task's references
    (`method="sft"`) with a LoRA / full / scratch backend. `train()` resumes a killed run
    from its run directory: a finished round is never redone."""

    def __init__(
        self,
        task: Task,
        config: RestConfig,
        run_dir: str | Path,
        *,
        model_path: str | Path | None = None,
        method: str = "rest",
        progress: bool = True,
        console: Console | None = None,
    ):
        if method not in ("rest", "sft"):
            raise ConfigError(f"RestTrainer runs method rest or sft, got {method!r}")
        self.task = task
        self.config = config
        self.method = method
        self.progress = progress
        self.console = console or Console(stderr=True)
        self.backend = config.backend.backend
        if self.backend == "scratch" and task.kind != "game":
            raise ConfigError(
                "backend 'scratch' trains a small model from random init for game strategies; "
                f"task {task.name!r} is not a game: use --backend lora or full"
            )
        if method == "sft":
            if task.kind == "game":
                raise ConfigError(
                    "method 'sft' trains on reference answers; games have none: use --method rest"
                )
            if config.rounds != 1:
                raise ConfigError("method 'sft' is a single fine-tune; --rounds must be 1")
        check_disjoint(task)
        self.train_examples = task.examples("train")
        self.val_examples = task.examples("val")
        self.test_examples = task.examples("test")
        if not self.train_examples:
            raise ConfigError(f"task {task.name!r} has no train examples")
        if not self.val_examples:
            raise ConfigError(
                f"task {task.name!r} has no val examples: the best round is chosen "
                "on val, so val cannot be empty"
            )
        # the elite is at most max_per_prompt per prompt; val must hold at least one batch so
        # that a held-out batch can be formed from it (clear message instead of a crash later)
        check_batch(len(self.val_examples), config.sft.batch_size, "val examples")
        self.model_path = model_path
        self.run = RunDir(run_dir)
        self.teacher = Policy(skill=config.teacher_skill or "")
        self.student = Policy()
        self.metric = "mean_soft" if task.kind == "game" else "accuracy"
        self._base: Any = None
        self._tok: Any = None

    # ----------------------------------------------------------------- config / state
    def run_config(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "task": self.task.name,
            "model": str(self.model_path or "embedded"),
            "sizes": [len(self.train_examples), len(self.val_examples), len(self.test_examples)],
            "rest": self.config.to_dict(),
        }

    def _log(self, msg: str) -> None:
        self.console.print(msg)

    # ----------------------------------------------------------------- models
    def _load_base(self) -> None:
        if self._base is not None:
            return
        if self.backend == "scratch":
            from selftaught.weights.scratch import build_scratch_model, scratch_tokenizer

            self._tok = scratch_tokenizer(self.model_path)
            self._base = build_scratch_model(self._tok, self.config.backend, seed=self.config.seed)
        else:
            from selftaught.models.embedded import resolve_local_path

            path = resolve_local_path(str(self.model_path) if self.model_path else None)
            self._base, self._tok = load_model(path)
        self._base.eval()

    def _fresh_base(self) -> Any:
        self._load_base()
        return copy.deepcopy(self._base)

    def _round_model(self, r: int, history: list[dict[str, Any]]) -> Any:
        """Rebuild the model of round r from its saved artifacts (resume)."""
        if r == 0:
            return self._fresh_base()
        row = next((h for h in history if h.get("round") == r), None)
        if row is not None and not row.get("trained", True):
            return self._round_model(r - 1, history)  # a round with no elite kept its model
        rdir = self.run.path("rounds", str(r))
        if (rdir / "model").exists():
            from transformers import AutoModelForCausalLM

            return AutoModelForCausalLM.from_pretrained(str(rdir / "model")).eval()
        start = (
            self._round_model(r - 1, history)
            if self.config.continue_training
            else self._fresh_base()
        )
        return apply_adapter(start, rdir / "adapter").eval()

    def _sampler(self, model: Any) -> Sampler:
        if model is None:  # scratch round 0: the game's random strategies
            return RandomStrategySampler(_GameRandomPolicy(self.task), seed=self.config.seed)
        return HFGenerator(model, self._tok, max_batch_size=self.config.gen_batch_size)

    def _eval(self, model: Any, split: str) -> EvalResult:
        examples = self.val_examples if split == "val" else self.test_examples
        return evaluate(
            self._sampler(model),
            self.task,
            examples,
            split=split,
            max_tokens=self.config.max_tokens,
            policy=self.student,
            chunk=self.config.gen_batch_size,
            progress=self.progress,
        )

    def _value(self, ev: EvalResult) -> float:
        return ev.mean_soft if self.metric == "mean_soft" else ev.accuracy

    # ----------------------------------------------------------------- data
    def _reference_samples(self) -> list[Sample]:
        out = []
        for ex in self.train_examples:
            if ex.reference is None:
                raise ConfigError(f"method 'sft' needs reference answers; {ex.id} has none")
            msgs = self.student.messages(self.task, ex)
            out.append(Sample(ex.id, msgs, msgs, str(ex.reference), str(ex.reference), 1.0, 1.0))
        return out

    def _samples(self, model: Any, r: int) -> list[Sample]:
        cfg = self.config
        params = GenerationParams(
            max_tokens=cfg.max_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            seed=cfg.seed * 10_000 + r * 1000,
        )
        return sample_and_score(
            self._sampler(model),
            self.task,
            self.train_examples,
            k=cfg.samples_per_prompt,
            params=params,
            policy=self.teacher,
            train_policy=self.student,
            chunk=cfg.gen_batch_size,
            progress=self.progress,
            description=f"round {r}: sampling",
        )

    # ----------------------------------------------------------------- the loop
    def train(self) -> RestResult:
        t_start = time.perf_counter()
        resuming = self.run.check_or_write_config(self.run_config())
        state = self.run.load_state() or {}
        history = self.run.history()
        done = int(state.get("completed_round", -1))
        if resuming and done >= 0:
            self._log(f"[bold]resuming[/] {self.run.root}: rounds 0..{done} already done")
        cfg = self.config
        scratch = self.backend == "scratch"
        random_base = scratch  # round 0 of scratch is the game's random strategies

        # round 0: the base model on val and test
        if done < 0:
            self._load_base()  # scratch: tokenizer + the random init round 1 trains from
            base = None if random_base else self._fresh_base()
            val = self._eval(base, "val")
            test = self._eval(base, "test")
            row = {
                "round": 0,
                "model": "random strategies" if random_base else "base",
                "val": val.to_dict(),
                "test": test.to_dict(),
                "trained": False,
            }
            self._log(f"round 0 ({row['model']}): {val.line()} | {test.line()}")
            if not random_base:
                save_atomic(base, self.run.path("best"), self._tok)
            atomic_write_json(
                self.run.path("best", "best.json"), {"round": 0, "val": val.to_dict()}
            )
            self.run.append_history(row, key="round")
            history = self.run.history()
            state = {
                "completed_round": 0,
                "best_round": 0,
                "best_val": self._value(val),
                "base_test": test.to_dict(),
            }
            self.run.save_state(state)
            done = 0
        else:
            self._load_base()

        best_round = int(state["best_round"])
        best_val = float(state["best_val"])
        current: Any = None
        if done < cfg.rounds:
            current = None if (random_base and done == 0) else self._round_model(done, history)

        for r in range(done + 1, cfg.rounds + 1):
            t0 = time.perf_counter()
            rdir = self.run.path("rounds", str(r))
            # 1) sample and score (or the references, for plain SFT)
            t_s = time.perf_counter()
            if self.method == "sft":
                samples = self._reference_samples()
            else:
                samples = self._samples(current, r)
            sample_s = time.perf_counter() - t_s
            write_jsonl(rdir / "samples.jsonl", [s.to_dict() for s in samples])
            # 2) the elite
            if self.method == "sft":
                elite, stats = samples, None
            else:
                min_score, fraction = cfg.resolved_filter(self.task.kind)
                elite, stats = select_elite(
                    samples,
                    min_score=min_score,
                    elite_fraction=fraction,
                    max_per_prompt=cfg.max_per_prompt,
                    keep_truncated=cfg.keep_truncated,
                )
            row: dict[str, Any] = {
                "round": r,
                "samples": len(samples),
                "sample_solved": sum(s.hard for s in samples) / max(1, len(samples)),
                "sample_truncated": sum(s.truncated for s in samples) / max(1, len(samples)),
                "sample_seconds": round(sample_s, 1),
                "samples_per_s": round(len(samples) / sample_s, 2) if sample_s > 0 else None,
                "elite": stats.to_dict() if stats else {"kept": len(elite)},
            }
            if len(elite) < cfg.sft.batch_size:
                # nothing (or too little) to learn from: keep the previous model, say why
                self._log(
                    f"[yellow]round {r}: only {len(elite)} elite samples (batch size "
                    f"{cfg.sft.batch_size}); no training this round[/]"
                )
                row.update(trained=False, reason="too few elite samples")
                val = self._eval(current, "val") if current is not None or random_base else None
            else:
                # 3) fine-tune: from the base model (ReST-EM) or the previous round's model
                if cfg.continue_training and current is not None:
                    start = copy.deepcopy(current)
                else:
                    start = self._fresh_base()
                model = prepare_trainable(start, cfg.backend)
                train_stats = sft_train(
                    model,
                    self._tok,
                    elite,
                    cfg.sft,
                    backend=self.backend,
                    seed=cfg.seed + r,
                    progress=self.progress,
                )
                if self.backend == "lora":
                    save_atomic(model, rdir / "adapter")
                model = merged(model).eval()
                if self.backend != "lora":
                    save_atomic(model, rdir / "model", self._tok)
                current = model
                row.update(trained=True, train=train_stats)
                val = self._eval(current, "val")
            assert val is not None
            row["val"] = val.to_dict()
            if cfg.eval_test_each_round:
                row["test"] = self._eval(current, "test").to_dict()
            improved = self._value(val) > best_val  # interim: the gate replaces this next
            if improved:
                best_round, best_val = r, self._value(val)
                save_atomic(current, self.run.path("best"), self._tok)
                atomic_write_json(
                    self.run.path("best", "best.json"), {"round": r, "val": val.to_dict()}
                )
            row["best_round"] = best_round
            row["seconds"] = round(time.perf_counter() - t0, 1)
            self._log(
                f"round {r}: sampled {row['sample_solved']:.0%} solved, kept {len(elite)}, "
                f"{val.line()}{' [bold green]new best[/]' if improved else ''}"
            )
            self.run.append_history(row, key="round")
            history = self.run.history()
            state.update(completed_round=r, best_round=best_round, best_val=best_val)
            self.run.save_state(state)

        # final: test accuracy of the base and the shipped model
        base_test = EvalResult(**{**state["base_test"], "ci": tuple(state["base_test"]["ci"])})
        if best_round == 0:
            shipped_test = base_test
            self._log("[yellow]no round beat the base model on val: the base model is shipped[/]")
        else:
            row = next(h for h in history if h.get("round") == best_round)
            if "test" in row:
                t = row["test"]
                shipped_test = EvalResult(**{**t, "ci": tuple(t["ci"])})
            elif "shipped_test" in state:
                t = state["shipped_test"]
                shipped_test = EvalResult(**{**t, "ci": tuple(t["ci"])})
            else:
                from transformers import AutoModelForCausalLM

                best = AutoModelForCausalLM.from_pretrained(str(self.run.path("best"))).eval()
                shipped_test = self._eval(best, "test")
            state["shipped_test"] = shipped_test.to_dict()
            self.run.save_state(state)
        result = RestResult(
            best_round=best_round,
            base_test=base_test,
            shipped_test=shipped_test,
            rounds=self.run.history(),
            best_dir=self.run.path("best") if (best_round > 0 or not random_base) else None,
            seconds=time.perf_counter() - t_start,
        )
        atomic_write_json(self.run.path("result.json"), result.to_dict())
        return result


def load_result(run_dir: str | Path) -> dict[str, Any]:
    return read_json(Path(run_dir) / "result.json")
