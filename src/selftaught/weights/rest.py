"""Expert iteration / ReST-EM, and plain SFT on references, over a local model.

Each round: sample k completions per train prompt at temperature > 0 from the current model →
score each with the task → keep the elite → fine-tune (from the base model by default, as in
ReST-EM) → evaluate on val → the gate decides. The base model is round 0. Sampling and
evaluation go through the one engine (`ChatModel` → `rollout` → `evaluation`): the model being
trained is wrapped by `LocalModel.from_pretrained_model`, or `sampler_url` names a vLLM
server that serves the base model and loads each round's adapter (`weights.served`). The
gate is the one `optimize` uses (margin / paired test on per-example val scores): a round
that beats the best by the margin ships (`best/`); one that is worse than the current model is
not sampled from next; a run that never improves ships the base model and says so. A round
that keeps fewer elite samples than one training batch stops the run at once, with advice,
instead of sampling again for nothing.

Run directory:
    config.json          settings (a resume with other settings is refused)
    history.jsonl        one row per round (round 0 = base)
    state.json           completed rounds, current and best round, per-example val scores
                         (and test scores of each round evaluated on test)
    rounds/N/samples.jsonl   every scored sample of round N, with the prompt it was scored on
                         (`dataset="grow"` trains round N on the elite of rounds 1..N)
    rounds/N/adapter/    LoRA adapter of round N (`full` / `scratch`: rounds/N/model/)
    best/                the shipped model (merged weights + tokenizer) and best.json
    result.json          base vs shipped test accuracy with 95% intervals
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from rich.console import Console

from selftaught.callbacks import TrainerCallback
from selftaught.evaluation import EvalResult, evaluate_split, tool_use
from selftaught.gate import GateResult, gate
from selftaught.models.base import ChatModel, GenerationParams
from selftaught.models.resolve import ModelLike, resolve_model
from selftaught.models.usage import BudgetExhausted, TrackedModel, UsageLedger
from selftaught.policy import Policy
from selftaught.results import RunResult
from selftaught.rollout import RolloutConfig, run_rollouts
from selftaught.runs import atomic_write_json, iter_jsonl, read_json, write_jsonl
from selftaught.stops import Deadline, StopReason, accepted, stop_text
from selftaught.tasks.base import Task
from selftaught.tasks.episode import is_tool_task
from selftaught.weights.config import ConfigError, DPOConfig, RestConfig
from selftaught.weights.elite import dedupe_samples, select_elite
from selftaught.weights.rows import RestRound
from selftaught.weights.sampling import (
    RandomStrategyModel,
    Sample,
    reference_samples,
    samples_from_rollouts,
)
from selftaught.weights.served import RoundServer
from selftaught.weights.sft import (
    apply_adapter,
    load_causal_lm,
    local_render,
    merged,
    prepare_trainable,
    save_atomic,
    sft_train,
)
from selftaught.weights.trainer import WeightTrainer, served_copy

TOO_FEW_ELITE_ADVICE = (
    "the model solves too few of its own samples to learn from; try an easier task config "
    "(e.g. gym:basic_arithmetic?max_terms=2&max_digits=1), more samples per prompt (-k), a "
    "larger --train-size, or a teacher skill (--teacher-skill) that raises the solve rate"
)


@dataclass(frozen=True)
class RestResult(RunResult):
    """What a run shipped and how it got there (`RunResult` plus the rounds)."""

    kind: ClassVar[str] = "rest"

    best_round: int
    base_test: EvalResult
    shipped_test: EvalResult
    rounds: list[RestRound] = field(default_factory=list)
    best_dir: Path | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._derive(
            base_score=self.base_score or self.base_test.score(),
            shipped_score=self.shipped_score or self.shipped_test.score(),
        )

    @property
    def gain(self) -> float:
        return self.shipped_test.hard - self.base_test.hard

    @property
    def shipped(self) -> str:
        """What shipped, in words: `base model` or `round N`."""
        return "base model" if self.best_round == 0 else f"round {self.best_round}"

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "best_round": self.best_round,
            "shipped": self.shipped,
            "base_test": self.base_test.summary(),
            "shipped_test": self.shipped_test.summary(),
            "gain": round(self.gain, 4),
            "best_dir": str(self.best_dir) if self.best_dir else None,
            "rounds": [r.to_dict() for r in self.rounds],
        }

    @classmethod
    def _fields_from_dict(cls, d: dict[str, Any]) -> dict[str, Any]:
        return {
            **super()._fields_from_dict(d),
            "best_round": int(d["best_round"]),
            "base_test": EvalResult.from_summary(d["base_test"]),
            "shipped_test": EvalResult.from_summary(d["shipped_test"]),
            "rounds": [RestRound.from_dict(r) for r in d.get("rounds") or []],
            "best_dir": Path(d["best_dir"]) if d.get("best_dir") else None,
        }


RoundConfigT = TypeVar("RoundConfigT", bound=RestConfig | DPOConfig)


class RoundTrainer(WeightTrainer[RoundConfigT, RestResult]):
    """What `RestTrainer` and `DPOTrainer` share: a run of gated rounds over a local base model.
    Round 0 is the base; each later round is a model `_round` trains (through the trainer's
    one fine-tune, `fit`), scored on val (and test) through the one engine; the gate (the one
    `optimize` uses) decides which round ships. `train()` resumes a killed run from its run
    directory: a finished round is never redone. A subclass provides `last_round`, `_round`,
    `_trained_model` (round r rebuilt from its files) and `_check_batch`."""

    result_type: ClassVar[type[RestResult]] = RestResult

    def __init__(
        self,
        config: RoundConfigT,
        task: Task,
        model: ModelLike | Path | None = None,
        *,
        output_dir: str | Path | None = None,
        callbacks: Sequence[TrainerCallback] = (),
        progress: bool = True,
        console: Console | None = None,
        ledger: UsageLedger | None = None,
    ):
        # sampling and val (and a judge charged to `ledger`) count against the run's budget;
        # test evaluations stand apart (the base's `test_ledger`)
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
        self.backend = config.backend.backend
        self.student = Policy()
        self._base: Any = None
        self._tok: Any = None
        self.server = self._round_server()  # `sampler_url`: the rounds on a vLLM server
        # the one served copy kept (a model in another dtype): its source, version, copy
        self._serving: tuple[Any, Any, Any] | None = None

    # ---- what a subclass provides -----------------------------------------------------------
    def _round_server(self) -> RoundServer | None:
        """The vLLM server the rounds are sampled and scored on (None: in process)."""
        return None

    def _check_data(self) -> None:
        self._check_batch()

    def _check_batch(self) -> None:
        """Refuse up front a run with nothing to train on (a batch it can never fill)."""
        raise NotImplementedError

    @property
    def last_round(self) -> int:
        """The rounds the run trains (round 0 is the base model)."""
        raise NotImplementedError

    def _round(self, r: int, current: Any, state: dict[str, Any]) -> Any:
        """Train round r and gate it (`_gate_round`); the model the next round starts from."""
        raise NotImplementedError

    def _trained_model(self, r: int) -> Any:
        """The model of trained round r (r >= 1), rebuilt from its saved files."""
        raise NotImplementedError

    # ----------------------------------------------------------------- models
    def _load_base(self) -> None:
        if self._base is not None:
            return
        if self.backend == "scratch":
            from selftaught.models.device import resolve_device
            from selftaught.weights.scratch import build_scratch_model, scratch_tokenizer

            self._tok = scratch_tokenizer(self.model_path)
            self._base = build_scratch_model(self._tok, self.config.backend, seed=self.config.seed)
            self._base.to(resolve_device(self.config.backend.device)[0])
        else:
            from selftaught.models.embedded import resolve_local_path

            path = resolve_local_path(str(self.model_path) if self.model_path else None)
            self._base, self._tok = load_causal_lm(path, device=self.config.backend.device)
        self._base.eval()

    def _fresh_base(self) -> Any:
        self._load_base()
        return copy.deepcopy(self._base)

    def _round_model(self, r: int, *, own: bool = False) -> Any:
        """The model of round r, rebuilt from its saved artifacts (resume); None is round 0
        of a from-scratch run (the game's random strategies). Round 0 is the loaded base
        itself (sampling and evaluating leave it as it is; training starts from a copy)
        unless `own` asks for a copy to change."""
        if r == 0:
            if self.backend == "scratch":
                return None
            self._load_base()
            return self._fresh_base() if own else self._base
        return self._trained_model(r)

    @contextlib.contextmanager
    def _chat(self, model: Any, r: int, ledger: UsageLedger) -> Iterator[ChatModel]:
        """Round r's model behind the chat protocol, every call charged to `ledger`, closed
        after use (an engine lets go of its KV and prefix caches at once, not at the next
        garbage collection). With `sampler_url`, round r's model on that server (sampling
        and evaluation alike, so every round is scored by the same engine)."""
        served: ChatModel
        if model is None:
            served = RandomStrategyModel(self.task, seed=self.config.seed)
        elif self.server is not None:
            served = self.server.model(r)
        else:
            from selftaught.models.local import LocalModel

            served = LocalModel.from_pretrained_model(
                self._served(model),
                self._tok,
                name=f"local:round-{r}",
                max_batch_size=self.config.gen_batch_size,
            )
        try:
            yield TrackedModel(served, ledger, "target")
        finally:
            close = getattr(served, "close", None)
            if callable(close):
                close()

    def _served(self, model: Any) -> Any:
        """`model` as the engine serves it (`served_copy`): a copy in the serving dtype is
        made once and kept while the same model, unchanged, is served again (its val, its
        test, the next round's sampling), so a round copies once, not once a call. One copy
        at most is kept: the next model's replaces it."""
        import weakref

        from selftaught.models.local_weights import weights_version

        dtype = self.serving_dtype()
        if dtype is None:
            return model
        version = weights_version(model)
        kept = self._serving
        if kept is not None and kept[0]() is model and kept[1] == version:
            return kept[2]
        self._serving = None  # let the old copy go before the next is made
        copied = served_copy(model, dtype)
        self._serving = (weakref.ref(model), version, copied)
        return copied

    def _drop_served(self) -> None:
        """Let the kept copy go (before a fine-tune, which serves nothing, and at the end)."""
        self._serving = None

    # ----------------------------------------------------------------- engine calls
    def _eval(self, model: Any, r: int, split: str) -> EvalResult:
        """Greedy replies on val (charged to the budget) or test (apart), through the engine."""
        ledger = self.ledger if split == "val" else self.test_ledger
        with self._chat(model, r, ledger) as chat:
            return evaluate_split(
                self.task,
                chat,
                self.student,
                split=split,
                rollout=RolloutConfig(
                    concurrency=self.config.gen_batch_size,
                    params=GenerationParams(max_tokens=self.config.max_tokens, temperature=0.0),
                    progress=self.show_progress,
                    description=f"round {r}: eval {split}",
                ),
            )

    def _test(self, model: Any, r: int, state: dict[str, Any]) -> EvalResult:
        """Round r on test, its per-example hard scores kept in `state["test_scores"]` (for
        a paired comparison of rounds; None where the rollout errored)."""
        test = self._eval(model, r, "test")
        state.setdefault("test_scores", {})[str(r)] = {
            x.example_id: x.score.hard if x.ok and x.score is not None else None
            for x in test.rollouts
        }
        return test

    # ----------------------------------------------------------------- the loop
    def train(self) -> RestResult:
        if not self.val_examples:  # a trainer built to `fit` alone needs none
            raise ConfigError(
                f"task {self.task.name!r} has no val examples: the best round is chosen "
                "on val, so val cannot be empty"
            )
        try:
            with self._unloading():
                return self._train()
        finally:
            self._drop_served()  # the kept served copy goes with the run

    @contextlib.contextmanager
    def _unloading(self) -> Iterator[None]:
        """With a sampler server, the adapters the run loaded are unloaded when it ends
        (after an error too, as far as the server still answers)."""
        try:
            yield
        except BaseException:
            if self.server is not None:
                with contextlib.suppress(Exception):
                    self.server.close()
            raise
        if self.server is not None:
            self.server.close()

    def _train(self) -> RestResult:
        t_start = time.perf_counter()
        resuming = self._begin()  # the resume check, on_start, this invocation's clock
        state = self.run.load_state() or {}
        if resuming and state.get("completed_round", -1) >= 0:
            done = state["completed_round"]
            self._log(f"[bold]resuming[/] {self.run.root}: rounds 0..{done} already done")
            stop = StopReason.read(state.get("stopped_by"))
            if stop is not None and stop.kind in ("max_minutes", "patience"):
                state.pop("stopped_by")  # a new time limit; patience's count is kept
        self._load_base()  # scratch: the tokenizer + the random init round 1 trains from
        try:
            if state.get("completed_round", -1) < 0:
                state = self._round_zero()
            current = self._round_model(state["current_round"])
            for r in range(state["completed_round"] + 1, self.last_round + 1):
                if not state.get("stopped_by") and self._stop_at(state, f"before round {r}"):
                    self.run.save_state(state)
                if state.get("stopped_by"):
                    break
                current = self._round(r, current, state)
        except BudgetExhausted as err:
            if "current_round" not in state:
                raise ConfigError(
                    f"the budget ran out during round 0 ({err.reason}); raise it"
                ) from err
            state["stopped_by"] = StopReason("budget", err.reason).to_dict()
            self.run.save_state(state)
            self._log(f"[bold yellow]budget exhausted[/] ({err.reason}): shipping the best round")
        return self._finish(state, time.perf_counter() - t_start)

    def _round_zero(self) -> dict[str, Any]:
        """The base model (or a scratch run's random strategies) on val and test."""
        base = self._round_model(0)
        val = self._eval(base, 0, "val")
        test_scores: dict[str, Any] = {}
        test = self._test(base, 0, {"test_scores": test_scores})
        kind = "random strategies" if base is None else "base"
        self._log(f"round 0 ({kind}): {val.line()} | {test.line()}")
        for split in (val, test):
            self._scored(0, split, "base")
        if base is not None:
            save_atomic(base, self.run.path("best"), self._tok)
        atomic_write_json(self.run.path("best", "best.json"), {"round": 0, "val": val.summary()})
        row = {"round": 0, "model": kind, "val": val.summary(), "test": test.summary()}
        self.run.append_history({**row, "trained": False}, key="round")
        state = {
            "completed_round": 0,
            "current_round": 0,
            "best_round": 0,
            "val_scores": {"0": val.val_scores(self.gate)},
            "test_scores": test_scores,
            "base_test": test.summary(),
        }
        self.run.save_state(state)
        return state

    def _gate_round(
        self,
        r: int,
        model: Any,
        current: Any,
        state: dict[str, Any],
        row: dict[str, Any],
        t0: float,
        *,
        what: str,
        test: bool,
    ) -> Any:
        """Round r's trained `model` on val (and test when `test`), through the gate against
        the current and the best round; the round recorded. Returns the model the next round
        starts from."""
        val = self._eval(model, r, "val")
        scores = state["val_scores"]
        scores[str(r)] = val.val_scores(self.gate)
        result = gate(
            scores[str(r)],
            scores[str(state["current_round"])],
            scores[str(state["best_round"])],
            self.gate,
        )
        row.update(trained=True, val=val.summary(), gate=result.to_dict())
        self._scored(r, val, "candidate")
        self._gated(r, result.to_dict())
        if test:
            tested = self._test(model, r, state)
            row["test"] = tested.summary()
            self._scored(r, tested, "candidate")
        self._apply_decision(r, model, val, result, state)
        if self.server is not None:  # no later round samples from or ships the others
            self.server.keep_only({int(state["current_round"]), int(state["best_round"])})
        row.update(best_round=state["best_round"], seconds=round(time.perf_counter() - t0, 1))
        state["without_accept"] = (
            0 if accepted(result.decision) else state.get("without_accept", 0) + 1
        )
        if r < self.last_round and self._stop_at(state, f"after round {r}"):
            row["stopped_by"] = state["stopped_by"]  # in history: a resumed run keeps it
        self._log(f"round {r}: {what}, {val.line()} · {result.decision} ({result.reason})")
        self.run.append_history(row, key="round")
        state["completed_round"] = r
        self.run.save_state(state)
        self._step_done(r, row)
        return model if result.decision != "reject" else current

    def _stop_at(self, state: dict[str, Any], at: str) -> bool:
        """Whether a stop fires at this safe point (patience, counted across resumes, then
        the wall clock); the stop goes into `state` (saved by the caller)."""
        stop = self._due_stop(int(state.get("without_accept") or 0), "rounds", at)
        if stop is None:
            return False
        state["stopped_by"] = stop.to_dict()
        self._log(f"[bold yellow]stopped:[/] {stop}: shipping the best round; re-run to resume")
        return True

    def _step_done(self, r: int, row: dict[str, Any]) -> None:
        metrics = {k: v for k, v in row.items() if k not in ("val", "test", "gate", "round")}
        self.callbacks.step(self.info, step=r, metrics={**metrics, "usage": self.ledger.to_dict()})

    def _apply_decision(
        self, r: int, model: Any, val: EvalResult, result: GateResult, state: dict[str, Any]
    ) -> None:
        if result.decision == "accept_new_best":
            state["best_round"] = r
            save_atomic(model, self.run.path("best"), self._tok)
            atomic_write_json(
                self.run.path("best", "best.json"), {"round": r, "val": val.summary()}
            )
        if result.decision != "reject":
            state["current_round"] = r

    # ----------------------------------------------------------------- the end
    def _finish(self, state: dict[str, Any], seconds: float) -> RestResult:
        """Base vs shipped test accuracy (test evaluated outside any budget)."""
        base_test = EvalResult.from_summary(state["base_test"])
        best_round = int(state["best_round"])
        if best_round == 0:
            shipped_test = base_test
            why = stop_text(state.get("stopped_by")) or "no round beat the base model on val"
            self._log(f"[yellow]{why}: the base model is shipped[/]")
        else:
            if "shipped_test" not in state or state.get("shipped_round") != best_round:
                row = next(h for h in self.run.history() if h.get("round") == best_round)
                if "test" in row:
                    state["shipped_test"] = row["test"]
                else:
                    best = self._round_model(best_round)
                    state["shipped_test"] = self._test(best, best_round, state).summary()
                state["shipped_round"] = best_round
                self.run.save_state(state)
            shipped_test = EvalResult.from_summary(state["shipped_test"])
        scratch_base = best_round == 0 and self.backend == "scratch"
        result = self.result_type(
            best_round=best_round,
            base_test=base_test,
            shipped_test=shipped_test,
            rounds=[RestRound.from_dict(h) for h in self.run.history()],
            best_dir=None if scratch_base else self.run.path("best"),
            seconds=seconds,
            stopped_by=StopReason.read(state.get("stopped_by")),
            run_dir=self.run.root,
            method=self.method,
            task=self.task.name,
            usage=self.ledger.to_dict(),
        )
        return self._end(result)


class RestTrainer(RoundTrainer[RestConfig]):
    """ReST-EM (`RestConfig(method="rest")`) or one round of SFT on the task's references
    (`method="sft"`) with a LoRA / full / scratch backend, on the local `model` (None or
    `local`: the embedded model; `local:PATH`, a path, or a `LocalModel` loaded from one).
    `train()` resumes a killed run from its run directory (`output_dir`, default
    `runs/train-...`): a finished round is never redone. `callbacks` see the run's events
    (`selftaught.callbacks`); `ledger` is charged with every call (the task's judge may share
    it). Its rounds, evaluation and gate are `RoundTrainer`'s; `fit` is its one fine-tune (a
    night's SFT adapter is trained by it too)."""

    config_type: ClassVar[type] = RestConfig
    settings_key: ClassVar[str] = "rest"
    _teacher: ChatModel | None = None  # `teacher_model`, loaded when first sampled

    def _round_server(self) -> RoundServer | None:
        url = self.config.sampler_url
        return RoundServer(url, self.config.sampler_base_model, self.run.root) if url else None

    def _check_data(self) -> None:
        self._check_fit(self.task, self.config, self.method)
        super()._check_data()

    @staticmethod
    def _check_fit(task: Task, config: RestConfig, method: str) -> None:
        if config.backend.backend == "scratch" and task.kind != "game":
            raise ConfigError(
                "backend 'scratch' trains a small model from random init for game strategies; "
                f"task {task.name!r} is not a game: use --backend lora or full"
            )
        if method == "sft" and task.kind == "game":
            raise ConfigError(
                "method 'sft' trains on reference answers; games have none: use --method rest"
            )

    def _check_batch(self) -> None:
        """Refuse up front a run with nothing to train on, or a batch no round could ever fill
        (instead of sampling first)."""
        config, method = self.config, self.method
        if not self.train_examples:
            raise ConfigError(f"task {self.task.name!r} has no train examples")
        n = len(self.train_examples)
        sampled = method == "rest" or config.teacher_model
        most = n * min(config.max_per_prompt, config.samples_per_prompt) if sampled else n
        if most < config.sft.batch_size:
            raise ConfigError(
                f"--batch-size {config.sft.batch_size} can never be filled: {n} train prompts "
                f"give at most {most} training samples per round; lower --batch-size or "
                "raise --train-size"
            )

    @property
    def last_round(self) -> int:
        """The rounds the run trains (round 0 is the base model)."""
        return int(self.config.rounds or 1)

    def _trained_model(self, r: int) -> Any:
        rdir = self.run.path("rounds", str(r))
        if (rdir / "model").exists():
            from transformers import AutoModelForCausalLM

            return AutoModelForCausalLM.from_pretrained(str(rdir / "model")).eval()
        start = (
            self._round_model(r - 1, own=True)
            if self.config.continue_training
            else self._fresh_base()
        )
        return apply_adapter(start, rdir / "adapter").eval()

    # ----------------------------------------------------------------- sampling
    def _samples(
        self, model: Any, r: int, source_round: int
    ) -> tuple[list[Sample], int, dict[str, Any] | None]:
        """Round r's k scored samples per train prompt (one n-completion request each) from
        the model of `source_round`, how many rollouts errored (no samples, never 0), and
        how the episodes used their tools (None for one-step tasks)."""
        cfg = self.config
        if self.method == "sft" and not cfg.teacher_model:
            return reference_samples(self.task, self.train_examples, self.student), 0, None
        with self._sampler(model, source_round) as chat:
            rollouts = run_rollouts(
                chat,
                Policy(skill=cfg.teacher_skill or ""),
                self.task,
                self.train_examples,
                RolloutConfig(
                    concurrency=self._sampling_calls(),
                    samples=cfg.samples_per_prompt,
                    params=GenerationParams(
                        max_tokens=cfg.max_tokens,
                        temperature=cfg.temperature,
                        top_p=cfg.top_p,
                        seed=cfg.seed * 10_000 + r * 1000,
                    ),
                    progress=self.show_progress,
                    description=f"round {r}: sampling",
                ),
            )
        samples = samples_from_rollouts(self.task, self.train_examples, rollouts, self.student)
        return samples, sum(not r.ok for r in rollouts), tool_use(rollouts)

    @contextlib.contextmanager
    def _sampler(self, model: Any, r: int) -> Iterator[ChatModel]:
        """Who is sampled: the teacher (`teacher_model`: model distillation, its calls role
        `teacher`), else round r's model."""
        if not self.config.teacher_model:
            with self._chat(model, r, self.ledger) as chat:
                yield chat
            return
        if self._teacher is None:
            self._teacher = resolve_model(self.config.teacher_model)
        yield TrackedModel(self._teacher, self.ledger, "teacher")

    def _sampling_calls(self) -> int:
        """Concurrent sampling calls that fill `gen_batch_size` rows: a one-step prompt's k
        samples are one call of k rows; an episode's turns are calls of one row each (the
        rollout's concurrency counts calls)."""
        cfg = self.config
        if is_tool_task(self.task):
            return cfg.gen_batch_size
        return max(1, cfg.gen_batch_size // cfg.samples_per_prompt)

    # ----------------------------------------------------------------- a round
    def _round(self, r: int, current: Any, state: dict[str, Any]) -> Any:
        """One round; returns the model the next round samples from."""
        cfg = self.config
        t0 = time.perf_counter()
        rdir = self.run.path("rounds", str(r))
        samples, errors, tools = self._samples(current, r, state["current_round"])
        sample_s = time.perf_counter() - t0
        write_jsonl(rdir / "samples.jsonl", [s.to_dict() for s in samples])
        elite, stats = self._elite(samples)
        row: dict[str, Any] = {
            "round": r,
            "samples": len(samples),
            "sample_errors": errors,
            "sample_solved": sum(s.hard for s in samples) / max(1, len(samples)),
            "sample_truncated": sum(s.truncated for s in samples) / max(1, len(samples)),
            "sample_seconds": round(sample_s, 1),
            "samples_per_s": round(len(samples) / sample_s, 2) if sample_s > 0 else None,
            "elite": stats,
            **({"sample_tool_use": tools} if tools is not None else {}),
        }
        if cfg.dataset == "grow":
            elite = self._grown(r, elite, row)
        if len(elite) < cfg.sft.batch_size:
            return self._stop_too_few(r, row, state, len(elite), current)
        self._drop_served()  # the copy sampled from is not served again before a rejection
        model = self._fine_tune(current, elite, r, row)
        what = f"sampled {row['sample_solved']:.0%} solved, kept {len(elite)}"
        test = cfg.eval_test_each_round
        return self._gate_round(r, model, current, state, row, t0, what=what, test=test)

    def _elite(self, samples: list[Sample]) -> tuple[list[Sample], dict[str, Any]]:
        if self.method == "sft" and not self.config.teacher_model:  # references: all kept
            return samples, {"kept": len(samples)}
        min_score, fraction = self.config.resolved_filter(self.task.kind)
        elite, stats = select_elite(
            samples,
            min_score=min_score,
            elite_fraction=fraction,
            max_per_prompt=self.config.max_per_prompt,
            keep_truncated=self.config.keep_truncated,
        )
        return elite, stats.to_dict()

    def _grown(self, r: int, elite: list[Sample], row: dict[str, Any]) -> list[Sample]:
        """`dataset="grow"`: the elite of rounds 1..r, older first, a reply to a prompt once
        (read again from each round's samples.jsonl: the filter is pure, so a resumed run
        trains on the same set)."""
        earlier = []
        for k in range(1, r):
            path = self.run.path("rounds", str(k), "samples.jsonl")
            if path.exists():
                earlier += self._elite([Sample.from_dict(d) for _, d in iter_jsonl(path)])[0]
        before = dedupe_samples(earlier)
        grown = dedupe_samples([*before, *elite])
        row["dataset"] = {"kind": "grow", "samples": len(grown), "new": len(grown) - len(before)}
        return grown

    def fit(
        self,
        model: Any,
        tokenizer: Any,
        samples: Sequence[Sample],
        *,
        seed: int | None = None,
        run_name: str | None = None,
        deadline: Deadline | None = None,
    ) -> dict[str, Any]:
        """The trainer's one fine-tune, on this config's schedule (`sft`, the backend, the
        seed unless given, `report_to`): the trainable `model` trained in place on `samples`
        (a round's elite or references, a night's SFT rows); loss, steps and timings.
        `deadline`: the wall-clock limit (default: this run's `--max-minutes`)."""
        cfg = self.config
        return sft_train(
            model,
            tokenizer,
            samples,
            cfg.sft,
            backend=self.backend,
            seed=cfg.seed if seed is None else seed,
            progress=self.show_progress,
            render=local_render(tokenizer),  # episodes: the text the local backend generated from
            report_to=cfg.report_to,
            run_name=run_name,
            deadline=self.deadline if deadline is None else deadline,  # the last step crosses it
        )

    def _fine_tune(self, current: Any, elite: list[Sample], r: int, row: dict[str, Any]) -> Any:
        """From the base model (ReST-EM) or the current one (`continue_training`)."""
        cfg = self.config
        if cfg.continue_training and current is not None:
            start = copy.deepcopy(current)
        else:
            start = self._fresh_base()
        model = prepare_trainable(start, cfg.backend)
        run_name = f"{self.run.root.name}-round-{r}"
        row["train"] = self.fit(model, self._tok, elite, seed=cfg.seed + r, run_name=run_name)
        rdir = self.run.path("rounds", str(r))
        if self.backend == "lora":
            save_atomic(model, rdir / "adapter")
        model = merged(model).eval()
        if self.backend != "lora":
            save_atomic(model, rdir / "model", self._tok)
        return model

    def _stop_too_few(
        self, r: int, row: dict[str, Any], state: dict[str, Any], kept: int, current: Any
    ) -> Any:
        batch = self.config.sft.batch_size
        why = f"round {r} kept {kept} elite samples, fewer than one batch ({batch})"
        self._log(f"[bold yellow]stopping:[/] {why}: {TOO_FEW_ELITE_ADVICE}")
        row.update(trained=False, reason=why, advice=TOO_FEW_ELITE_ADVICE)
        self.run.append_history(row, key="round")
        state.update(completed_round=r, stopped_by=StopReason("other", why).to_dict())
        self.run.save_state(state)
        self._step_done(r, row)
        return current


def load_result(run_dir: str | Path) -> dict[str, Any]:
    result: dict[str, Any] = read_json(Path(run_dir) / "result.json")  # a result's to_dict()
    return result
