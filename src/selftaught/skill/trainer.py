"""SkillTrainer: SkillOpt in text space. The model stays frozen; the trainable state is a skill
document. One step = rollout a train batch → reflect on failed and solved minibatches →
aggregate the patches → select under the edit budget → apply → gate on val.

    trainer = SkillTrainer(SkillOptConfig(epochs=1), task, model, optimizer_model=analyst,
                           initial_skill=skill, output_dir="runs/x", callbacks=[...])
    result = trainer.train()   # a SkillRunResult

The trainer runs the steps; each part reads in one sitting: `propose` (reflect → aggregate →
select → apply), `candidates` (rules, demo sets, merges), `screen` and `gating` (successive
halving, the gate and what it moves), `scoring` (rollouts and cached val scores) and `persist`
(the run directory, `persist.RUN_LAYOUT`). A killed run resumes from its last completed step
when started again with the same settings."""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console

from selftaught.callbacks import TrainerCallback
from selftaught.demos import LeakCheck, split_skill
from selftaught.errors import BudgetTooSmall, ConfigError, TaskError
from selftaught.evaluation import ScoreCache, answer_dtype, rollout_row
from selftaught.gate import GatePower, gate_power, gate_tags, paired_comparison
from selftaught.models.base import GenerationParams
from selftaught.models.errors import FatalBackendError
from selftaught.models.resolve import ModelLike, resolve_model
from selftaught.models.usage import Budget, BudgetExhausted, TrackedModel, UsageLedger
from selftaught.prompts import PromptSet, using
from selftaught.redact import redact_for_model
from selftaught.results import SplitScore
from selftaught.rollout import Rollout
from selftaught.runs import atomic_write_json, atomic_write_text, read_json, write_jsonl
from selftaught.skill.agent_edit import agent_of
from selftaught.skill.budget_schedule import adapted_budget, edit_budget
from selftaught.skill.candidates import CandidateBuilder
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.curriculum import (
    curriculum_order,
    epoch_order,
    example_difficulty,
    orderable,
)
from selftaught.skill.demo_search import bootstrapped, from_references
from selftaught.skill.document import Edit
from selftaught.skill.documents import TrainedDocument, VersionStore
from selftaught.skill.gating import apply_verdict, choose, edit_fates
from selftaught.skill.grounding import Summarizer, summary_sample
from selftaught.skill.guard import EditGuard
from selftaught.skill.ledger import LEDGER_FILE, EditLedger, LedgerEvent, step_events
from selftaught.skill.persist import RUN_LAYOUT, RunStore, StepOutcome, default_output_dir
from selftaught.skill.pool import pick_parent
from selftaught.skill.pooled_val import check_pool, pool_check, split_pool
from selftaught.skill.progress import RunProgress
from selftaught.skill.propose import Proposer
from selftaught.skill.reflect import Analyst, DocumentKind
from selftaught.skill.result import SkillRunResult, SkillTest, SlowUpdate
from selftaught.skill.rows import BaselineRow, StepRow
from selftaught.skill.scoring import SkillScorer
from selftaught.skill.slow import SlowConsolidator
from selftaught.skill.state import RunState, SkillVersion
from selftaught.skill.teacher import Teacher, TeacherAttempt, teach
from selftaught.skill_package import export_package, split_files
from selftaught.stops import StopReason, accepted
from selftaught.tasks.base import Example, Task
from selftaught.trainer_base import BaseTrainer

__all__ = ["SkillTrainer"]

# settings a resumed run may change (the others must match the run it continues)
RESUMABLE = {
    "epochs",
    "max_steps",
    "concurrency",
    "timeout_s",
    "evaluate_test",
    "budget",
    "report_to",
    # the slow update's (issue 51): they shape the run's end, or the prompt, not its steps
    "edit_ledger",
    "tried_failed_min",
    "tried_failed_max",
    "slow_every",
    "slow_max_trials",
    "slow_min_accepted",
    "stops",  # each invocation has its own time limit; patience's count is in the state
}


class SkillTrainer(BaseTrainer[SkillOptConfig, SkillRunResult, Task]):
    """Skill optimization (SkillOpt, text space) over `task` with a frozen target `model`; the
    `optimizer_model` (default: the target) is the analyst; each a spec string or a
    `ChatModel` (`selftaught.models.resolve`). Every call of both is counted.
    Built as every trainer is (`SkillTrainer(config, task, model, *, output_dir, callbacks,
    progress, console)`); `train()` returns a `SkillRunResult`."""

    config_type: ClassVar[type] = SkillOptConfig
    result_type: ClassVar[type[SkillRunResult]] = SkillRunResult
    result_file: ClassVar[str] = "summary.json"
    resumable: ClassVar[frozenset[str]] = frozenset(RESUMABLE)
    quiet_without_progress: ClassVar[bool] = True

    def __init__(
        self,
        config: SkillOptConfig,
        task: Task,
        model: ModelLike,
        optimizer_model: ModelLike | None = None,
        initial_skill: str = "",
        *,
        document: DocumentKind = "skill",
        other_document: str = "",
        proposals: Sequence[Edit] = (),
        output_dir: str | Path | None = None,
        ledger: UsageLedger | None = None,
        callbacks: Sequence[TrainerCallback] = (),
        progress: bool = True,
        console: Console | None = None,
        say_power: bool = True,
    ):
        self.initial_skill = initial_skill
        self.document = document  # what is trained: the skill, or the memory
        self.say_power = say_power  # a night says its own, in val tasks (sleep/night/cycle.py)
        self._optimizer_model = optimizer_model
        # the base: the tracker (report_to) is built there, so a missing package fails before
        # any call; the models are resolved in `_setup`
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
        # what is trained and the other document, held fixed
        self.doc = TrainedDocument(document, other_document, config.demo_placement)
        self.versions = VersionStore(self.run, self.doc)
        self.progress = RunProgress(self.console, progress)
        with using(self.prompt_set):  # the analyst reads its templates now
            self.analyst = self._analyst(config, document)
        self.scorer = SkillScorer(
            config,
            task,
            self.doc,
            self.target,
            self.test_target,
            ScoreCache(self.run.path("val_cache.json"), dtype=answer_dtype(self.target)),
        )
        # edits proposed from outside the analyst (e.g. what the user stated): they join the
        # first step's merged edits and meet the same budget, guard-free apply and gate
        user_edits = [replace(e, source="user") for e in proposals]
        package = document == "skill" and bool(split_files(initial_skill)[1])
        self.proposer = Proposer(
            config, self.analyst, self.doc, self.scorer, user_edits, package=package
        )

    def _setup(self, model: Any) -> None:
        """The prompts (`--prompts DIR`, checked before anything is written), the target and
        the analyst (default: the target), each call charged to the ledger; the final test
        evaluation is charged apart, outside any budget (as GEPA's harness)."""
        self.prompt_set = PromptSet.read(self.config.prompts)
        target = resolve_model(model)
        given = self._optimizer_model
        same = given is None or given is model or given == model
        analyst = target if given is None or same else resolve_model(given)
        self.target = TrackedModel(target, self.ledger, "target")
        self.test_target = TrackedModel(target, self.test_ledger, "target")
        self.optimizer = TrackedModel(analyst, self.ledger, "optimizer")

    def _analyst(self, config: SkillOptConfig, document: DocumentKind) -> Analyst:
        return Analyst(
            self.optimizer,
            max_tokens=config.analyst_max_tokens,
            temperature=config.analyst_temperature,
            repair=config.repair,
            max_input_chars=config.max_input_chars,
            max_reply_chars=config.max_reply_chars,
            max_feedback_chars=config.max_feedback_chars,
            max_edit_chars=config.max_edit_chars,
            timeout_s=config.timeout_s,
            document=document,
            preferences=config.preferences,
            grounded=config.grounded_proposals,
            agent=agent_of(self.optimizer) is not None,
        )

    @property
    def method(self) -> str:
        """What is trained: `skill` or `memory`."""
        return self.document

    def default_output_dir(self) -> Path:
        return default_output_dir(self.task.name)

    @property
    def val_cache(self) -> ScoreCache:
        """Val scores by skill hash (what a night pairs before and after)."""
        return self.scorer.val_cache

    # ---- public -------------------------------------------------------------------------
    def train(self) -> SkillRunResult:
        """Run (or resume) the optimization; returns the result (its summary also in
        summary.json)."""
        from selftaught.models.base import run_sync

        return run_sync(self.atrain())

    async def atrain(self) -> SkillRunResult:
        with using(self.prompt_set):  # every template the run reads: the user's, where given
            return await self._atrain()

    async def _atrain(self) -> SkillRunResult:
        self._prepare()
        resumed = self._begin()  # the resume check, on_start, this invocation's clock
        atomic_write_text(self.run.path("README.txt"), RUN_LAYOUT)
        st = self.store.load_state() if resumed else RunState()
        run_row = LedgerEvent("run", self.run_id, document=self.document, time=time.time())
        self.edit_ledger.append([run_row])
        if resumed:
            self.progress.log(f"resuming {self.run.root} after step {st.step}")
        t_start = time.perf_counter()
        elapsed0 = st.elapsed_s
        test = await self._run_stages(st, elapsed0, t_start)
        st.elapsed_s = elapsed0 + time.perf_counter() - t_start
        st.finished = True
        self.store.save_state(st)
        if st.best is not None and self.document == "skill":
            export_package(st.best.text, self.run.path("best_package"))
        self.run.path("error.json").unlink(missing_ok=True)  # a resumed run got past it
        result = self.store.result(
            st,
            test,
            task=self.task.name,
            document=self.document,
            test_ledger=self.test_ledger,
            slow=self.slow_update,
        )
        return self._end(result)  # summary.json, on_end

    async def _run_stages(self, st: RunState, elapsed0: float, t_start: float) -> SkillTest | None:
        """Baseline, steps (until the budget runs out) and test; a fatal backend error is
        written to error.json (the run resumes where it stopped)."""
        stage = "baseline"
        try:
            with self.progress.bar(self.total_steps, max(st.step, 0)):
                try:
                    if st.step < 0:
                        await self._baseline(st, elapsed0, t_start)
                    else:
                        await self._score_held(st)
                    st.stopped_by = None
                    for step in range(st.step + 1, self.total_steps + 1):
                        st.stopped_by = self._due_stop(
                            st.without_accept, "steps", f"before step {step}"
                        )
                        if st.stopped_by is not None:
                            break
                        stage = f"step {step}"
                        await self._step(st, step, elapsed0, t_start)
                        if st.stopped_by is not None:
                            break
                    if st.stopped_by is not None:
                        self.progress.log(
                            f"[bold yellow]stopped:[/] {st.stopped_by}: shipping the best "
                            f"skill so far ({st.best.version if st.best else '-'}); the same "
                            "command resumes the run"
                        )
                    if self.config.slow_every and not self._out_of_time(st):
                        stage = "slow update"
                        await self._slow(st)
                except BudgetExhausted as err:
                    self._stop_for_budget(st, stage, err)
                stage = "test"
                with self._outside_budget():
                    test = await self._test(st)
                self._test_events(st, test)
        except FatalBackendError as err:
            atomic_write_json(
                self.run.path("error.json"),
                {
                    "stage": stage,
                    "after_step": st.step,
                    "backend": err.backend,
                    "cause": redact_for_model(err.cause),  # a server may quote a key
                    "status": err.status,
                },
            )
            raise
        return test

    @contextlib.contextmanager
    def _outside_budget(self) -> Iterator[None]:
        """The final test stands outside the budget: the target's calls go to their own
        ledger, and a judge charged to the run's (a task's llm_judge) may still answer."""
        budget, self.ledger.budget = self.ledger.budget, Budget()
        try:
            yield
        finally:
            self.ledger.budget = budget

    # ---- callback events ------------------------------------------------------------------
    def _step_events(self, row: dict[str, Any]) -> None:
        """A committed history row as events: the candidate's val, the gate, the step."""
        step = int(row["step"])
        if row.get("val"):
            label = "base" if step == 0 else "candidate"
            scores = SplitScore.from_summary(row["val"], "val")
            self.callbacks.evaluate(self.info, step=step, split="val", scores=scores, label=label)
        if row.get("gate"):
            self._gated(step, row["gate"])
        skip = ("val", "gate", "step", "candidates", "pool", "demos")
        self.callbacks.step(
            self.info, step=step, metrics={k: v for k, v in row.items() if k not in skip}
        )

    def _test_events(self, st: RunState, test: SkillTest | None) -> None:
        if test is None:
            return
        for label, result in (("initial", test.initial), ("best", test.best)):
            self._scored(max(st.step, 0), result, label)

    # ---- before anything is written or called ---------------------------------------------
    def _prepare(self) -> None:
        """Splits, schedule and budget checks, before anything is written or called."""
        # validation that overlaps training fails closed (here, when the run starts)
        self.train_set, self.val_set, test = self._read_splits()
        pool = self._split_pool()
        self.scorer.val_set = self.val_set
        self.scorer.val_tags = gate_tags(self.val_set, self.config.gate)
        self.test_set = test if self.config.evaluate_test else []
        if not self.train_set:
            raise TaskError(f"task {self.task.name!r} has an empty train split")
        if not self.val_set and not self.config.gate.accept_all:
            raise TaskError(f"task {self.task.name!r} has an empty val split; the gate needs one")
        batches = math.ceil(len(self.train_set) / self.config.batch_size)
        self.steps_per_epoch = math.ceil(batches / self.config.accumulate_steps)
        self.first_epoch = self._first_epoch_order()
        self.total_steps = self.config.epochs * self.steps_per_epoch
        if self.config.max_steps is not None:
            self.total_steps = min(self.total_steps, self.config.max_steps)
        self._check_budget()
        if self.config.guard_edits:
            inputs = [ex.prompt_text() for ex in self.train_set + self.val_set + pool]
            self.analyst.guard = EditGuard(self.analyst.templates(), inputs)
        self.train_by_id = {ex.id: ex for ex in self.train_set}
        # demos are the skill's: a run that trains the memory keeps the skill's as they are
        self.demos_on = self.document == "skill" and self.config.demos_max > 0
        # the optimizer model writing demos the task's scorer verifies (`skill.teacher`)
        self.teacher = Teacher(self.optimizer, self.task, self.config)
        self.leak_check = LeakCheck.of_task(self.task, also=pool_check(pool).items)
        # nothing held out may be in a demo, not even in the skill the user started from
        self.leak_check.assert_clean(split_skill(self.initial_skill).demos)
        self.builder = CandidateBuilder(
            self.config, self.doc, self.versions, self.scorer, self.demos_on
        )
        self._open_ledger()
        self.store = RunStore(
            self.run,
            self.config,
            self.versions,
            self.scorer,
            self.ledger,
            total_steps=self.total_steps,
            demos_on=self.demos_on,
        )

    def _split_pool(self) -> list[Example]:
        """`--pooled-val N`: N train items held out as the gate's second val pool, before
        anything is learned; an overlap with what is learned fails closed, naming it."""
        n = self.config.pooled_val
        if not n:
            return []
        self.train_set, pool = split_pool(self.train_set, n, self.config.seed)
        check_pool(pool, self.train_set, split_skill(self.initial_skill).demos)
        self.scorer.pool_set = pool
        self.scorer.pool_cache = ScoreCache.load(
            self.run.path("pool_cache.json"), self.scorer.val_cache.dtype
        )
        return pool

    def _open_ledger(self) -> None:
        """The edit ledger (`skill.ledger`), and what it holds as tried and failed in other
        runs: shown to the analyst, and not applied again."""
        self.edit_ledger = EditLedger(self.config.edit_ledger or self.run.path(LEDGER_FILE))
        self.run_id = str(self.run.root.resolve())
        self.slow_update: SlowUpdate | None = None
        if not self.config.tried_failed_min:
            return
        failed = self.edit_ledger.tried_and_failed(
            self.document,
            min_failures=self.config.tried_failed_min,
            limit=self.config.tried_failed_max,
            exclude_run=self.run_id,  # a resumed run's prompts are the uninterrupted run's
        )
        self.analyst.tried_failed = [e.edit() for e in failed]
        self.analyst.tried_failed_min = self.config.tried_failed_min

    def _check_budget(self) -> None:
        """Prices known for every model the budget counts in USD, and enough calls for the
        baseline; then the ledger enforces it."""
        budget = self.config.budget
        budget.check_priced([self.target.name, self.optimizer.name])
        counts_target = budget.roles is None or "target" in budget.roles
        if budget.calls is not None and counts_target and budget.calls < len(self.val_set):
            raise ConfigError(
                f"--budget-calls {budget.calls} cannot cover even the baseline evaluation "
                f"({len(self.val_set)} val examples); raise it or shrink --val-size"
            )

    def _stop_for_budget(self, st: RunState, stage: str, err: BudgetExhausted) -> None:
        """End the run cleanly: the partial step is dropped, the best skill so far ships."""
        if st.best is None:
            raise BudgetTooSmall(
                f"the budget ran out during the baseline evaluation ({err.reason}); "
                "nothing was learned: raise the budget"
            ) from err
        st.stopped_by = StopReason("budget", err.reason, f"during {stage}")
        self.progress.log(
            f"[bold yellow]budget exhausted[/] ({err.reason}) during {stage}: shipping the best "
            f"skill so far ({st.best.version}); its test evaluation is outside the budget"
        )

    @staticmethod
    def _out_of_time(st: RunState) -> bool:
        """The run stopped on its wall-clock or cost limit: no slow update after it."""
        return st.stopped_by is not None and st.stopped_by.kind in ("max_minutes", "budget")

    # ---- stages -------------------------------------------------------------------------
    async def _score_held(self, st: RunState) -> None:
        """The val scores of the skills a resumed run goes on from (current, best, the
        pool's): read from the cache, or scored again where the run was resumed with its
        target answering in another dtype (the cache keys on it)."""
        held = {v.version: v for v in (st.current, st.best) if v is not None}
        for version in st.pool:
            if version not in held:
                held[version] = self.versions.load(version)
        for skill in held.values():
            await self.scorer.val(skill)
            if self.scorer.pool_set:
                await self.scorer.pool(skill)

    async def _baseline(self, st: RunState, elapsed0: float, t0: float) -> None:
        skill = self.versions.save_step(0, self.initial_skill)
        self.progress.set_stage("baseline val")
        val = await self.scorer.val(skill)
        st.current = st.best = skill
        st.pool = [skill.version]
        if self.demos_on and self.config.demo_references:
            st.demo_pool.add(from_references(self.task, self.train_set), self.leak_check)
        atomic_write_text(self.run.path(f"best_{self.document}.md"), skill.text)
        atomic_write_text(self.run.path(f"current_{self.document}.md"), skill.text)
        self.store.write_baseline_diagnostics(skill, val)
        st.step = 0
        st.elapsed_s = elapsed0 + time.perf_counter() - t0
        row_val = self.scorer.val_summary(skill)  # from the cache: a resumed run writes the same
        row = BaselineRow(
            0,
            skill.version,
            skill.hash,
            row_val,
            self.ledger.to_dict(),
            round(st.elapsed_s, 2),
        )
        self._commit(st, row)
        self.progress.log(f"baseline {row_val.line()}")

    async def _step(self, st: RunState, step: int, elapsed0: float, t_run: float) -> None:
        """One optimization step; its row and state are committed only once it is complete."""
        assert st.current is not None and st.best is not None
        t0 = time.perf_counter()
        usage0 = self.ledger.to_dict()
        epoch, batch = self._batch(step)
        budget = self._edit_budget(st, step)
        rejected = [Edit(**e) for e in st.rejected]
        parent = self._pick_parent(st, step)
        self.progress.set_stage("rollout", step)
        rollouts = await self._train_rollouts(parent.text, batch, step)
        new_demos = self._harvest_demos(st, rollouts)
        taught, teacher_new = await self._teach(st, parent, rollouts, step)
        new_demos += teacher_new
        await self._ground(st, step)
        self.progress.set_stage("reflect", step)
        proposals = await self.proposer.propose(st, parent, rollouts, rejected, budget, step)
        candidates = self.builder.candidates(st, step, parent, proposals)
        verdict = await choose(
            self.config,
            self.scorer,
            st,
            step,
            parent,
            candidates,
            proposals,
            lambda stage: self.progress.set_stage(stage, step),
        )
        apply_verdict(self.config, self.run, self.document, st, candidates, verdict)
        outcome = StepOutcome(
            step, epoch, budget, rollouts, parent, proposals, candidates, verdict, new_demos, taught
        )
        outcome.curriculum = self._curriculum(epoch, batch)
        self.store.write_diagnostics(outcome)
        st.step = step
        st.without_accept = 0 if accepted(verdict.result.decision) else st.without_accept + 1
        if self.config.edit_schedule == "adaptive":  # the next step's, kept in the state
            cfg = self.config
            took = accepted(verdict.result.decision)
            st.edit_budget = adapted_budget(budget, took, cfg.edit_budget_max, cfg.edit_budget_min)
        if step < self.total_steps:  # recorded in the step's row: a resumed run keeps it
            st.stopped_by = self._due_stop(st.without_accept, "steps", f"after step {step}")
        st.elapsed_s = elapsed0 + time.perf_counter() - t_run
        row = self.store.history_row(st, outcome, usage0, time.perf_counter() - t0)
        self._commit(st, row)
        fates = edit_fates(candidates, verdict)
        reason = f"{verdict.result.decision}: {verdict.result.reason}"
        events = step_events(self.run_id, step, self.document, proposals, fates, reason)
        self.edit_ledger.append(events)
        self._log_step(st, row, outcome)

    async def _slow(self, st: RunState) -> None:
        """The slow update (`skill.slow`) once, at the run's end: a rewrite the gate passed
        becomes the current and the best skill. slow_update.json is written before the
        state, so a run killed between the two still ships the rewrite when resumed."""
        assert st.best is not None
        path = self.run.path("slow_update.json")
        if path.exists():
            self.slow_update = update = SlowUpdate.from_dict(read_json(path))
            if update.shipped and update.version and st.best.version != update.version:
                self._ship(st, self.versions.load(update.version))
            return
        consolidator = SlowConsolidator(
            self.config,
            self.doc,
            self.scorer,
            self.versions,
            self.analyst,
            self.edit_ledger,
            self.run_id,
        )
        update, version = await consolidator.run(
            st.best, st.step, lambda stage: self.progress.set_stage(stage, st.step)
        )
        atomic_write_json(path, update.to_dict())
        self.slow_update = update
        if version is not None:
            self._ship(st, version)
        verdict = "shipped" if update.shipped else (update.decision or "nothing")
        self.progress.log(
            f"slow update: {verdict} ({update.reason}); dropped {len(update.dropped)} rules, "
            f"merged {len(update.merged)}"
        )

    def _ship(self, st: RunState, version: SkillVersion) -> None:
        st.current = st.best = version
        atomic_write_text(self.run.path(f"best_{self.document}.md"), version.text)
        atomic_write_text(self.run.path(f"current_{self.document}.md"), version.text)
        self.store.save_state(st)

    def _log_step(self, st: RunState, row: StepRow, o: StepOutcome) -> None:
        assert st.best is not None
        best_val = self.scorer.val_summary(st.best)
        chosen, result = o.verdict.chosen, o.verdict.result
        batch = f"{row.batch.solved}/{row.batch.n}" if row.batch is not None else "-"
        self.progress.log(
            f"step {o.step}/{self.total_steps} · batch {batch} · edits {row.edits['proposed']}→"
            f"{len(o.primary.update.applied)} applied · {len(o.candidates)} candidates"
            f"{f' (chose {chosen.kind}: {chosen.why})' if chosen else ''} · "
            f"{result.decision} ({result.reason}) · best val "
            f"{best_val.hard:.3f}"
        )

    def _pick_parent(self, st: RunState, step: int) -> SkillVersion:
        """The skill this step builds on: a draw from the pool's Pareto front (the current
        skill when the pool is off or holds one member)."""
        assert st.current is not None
        if not self.config.pool or len(st.pool) < 2:
            return st.current
        rng = random.Random(self.config.seed * 1_000_003 + step)
        chosen = pick_parent(self.builder.members(st), rng)
        return self.versions.load(chosen.version)

    def _harvest_demos(self, st: RunState, rollouts: list[Rollout]) -> int:
        """The step's passing train replies join the demo candidates (leaks refused)."""
        if not self.demos_on:
            return 0
        return len(st.demo_pool.add(bootstrapped(rollouts, self.train_by_id), self.leak_check))

    async def _teach(
        self, st: RunState, parent: SkillVersion, rollouts: list[Rollout], step: int
    ) -> tuple[list[TeacherAttempt] | None, int]:
        """Teacher demos (`--teacher-demos`): the optimizer writes replies to failed train
        items while the pool is short of demos; the scorer keeps those it passes. None when
        the teacher is off (the step's row and diagnostics are then as before)."""
        if not self.demos_on or not self.config.teacher_demos:
            return None, 0
        self.progress.set_stage("teacher demos", step)
        rules = self.doc.parts(parent.text).rules
        attempts, new = await teach(
            self.teacher, st.demo_pool, rollouts, self.train_by_id, self.leak_check, rules
        )
        return attempts, new

    async def _ground(self, st: RunState, step: int) -> None:
        """`--grounded-proposals`: the train set's summary, asked once per run (kept in the run
        directory; a backend error leaves this step ungrounded and the next one asks again)."""
        if not self.config.grounded_proposals or not self.config.proposals:
            return
        if st.train_summary is not None and st.train_summary.status != "backend_error":
            return
        self.progress.set_stage("train summary", step)
        cfg = self.config
        items = summary_sample(self.train_set, self.leak_check, cfg.summary_items, cfg.seed)
        summarizer = Summarizer(
            self.optimizer,
            max_tokens=cfg.analyst_max_tokens,
            temperature=cfg.analyst_temperature,
            max_input_chars=cfg.max_input_chars,
            max_reply_chars=cfg.max_reply_chars,
            timeout_s=cfg.timeout_s,
        )
        st.train_summary = await summarizer.summarize(
            items, self.leak_check, self.task.instructions
        )
        self.store.save_train_summary(st.train_summary)
        if not st.train_summary.usable:
            self.progress.log(
                f"train summary: {st.train_summary.status} ({st.train_summary.error})"
            )

    async def _train_rollouts(self, text: str, batch: list[Example], step: int) -> list[Rollout]:
        """The step's attempts: one greedy rollout per example, or K sampled ones."""
        k = self.config.rollouts_k
        if k == 1:
            return await self.scorer.rollouts(text, batch, f"step {step} rollout")
        params = GenerationParams(
            max_tokens=self.config.max_tokens,
            temperature=self.config.rollout_temperature,
            seed=self.config.seed * 100_003 + step,
        )
        return await self.scorer.rollouts(
            text, batch, f"step {step} rollout x{k}", params=params, samples=k
        )

    def _edit_budget(self, st: RunState, step: int) -> int:
        """The step's edit budget: its schedule's, or the adaptive one the last step left."""
        cfg = self.config
        if cfg.edit_schedule == "adaptive" and st.edit_budget is not None:
            return st.edit_budget
        return edit_budget(
            step,
            self.total_steps,
            cfg.edit_budget_max,
            cfg.edit_budget_min,
            cfg.edit_schedule,
        )

    def _batch(self, step: int) -> tuple[int, list[Example]]:
        """(epoch index, the train examples of `step`): a seeded shuffle per epoch, the
        first epoch easier first under --curriculum; with `accumulate_steps` N, the N
        batches whose patches the step accumulates, in order."""
        epoch, idx = divmod(step - 1, self.steps_per_epoch)
        size = self.config.batch_size * self.config.accumulate_steps
        if epoch == 0 and self.first_epoch is not None:
            order = self.first_epoch
        else:
            order = epoch_order(self.train_set, self.config.seed, epoch)
        return epoch, order[idx * size : (idx + 1) * size]

    def _first_epoch_order(self) -> list[Example] | None:
        """--curriculum: the first epoch easier first (True: refused, up front, on a task
        without difficulties; None: only where the task gives them)."""
        wanted = self.config.curriculum
        if wanted is False or (wanted is None and not orderable(self.train_set)):
            return None
        return curriculum_order(self.train_set, self.config.seed, self.task.name)

    def _curriculum(self, epoch: int, batch: list[Example]) -> list[float] | None:
        """The difficulties of a batch the curriculum ordered (None: it ordered none)."""
        if epoch != 0 or self.first_epoch is None:
            return None
        return [level for ex in batch if (level := example_difficulty(ex)) is not None]

    async def _test(self, st: RunState) -> SkillTest | None:
        """The initial and the best skill on test (outside the budget), paired; skipped when
        the best skill was already tested."""
        if not self.test_set:
            return None
        path = self.run.path("test_results.json")
        if path.exists():
            done = SkillTest.from_dict(read_json(path))
            if st.best and done.best.skill_hash == st.best.hash:
                return done
        assert st.best is not None
        self.leak_check.assert_clean(split_skill(st.best.text).demos)  # fail closed, always
        self.progress.set_stage("test")
        initial = self.versions.load(0)
        score = self.scorer.score
        init = await score(initial.text, self.test_set, "test", "test: initial skill")
        if st.best.hash == initial.hash:
            best = init
        else:
            best = await score(st.best.text, self.test_set, "test", "test: best skill")
        paired = paired_comparison(best.metric_scores("hard"), init.metric_scores("hard"))
        versions = {"initial": initial.version, "best": st.best.version}
        result = SkillTest(init, best, versions, paired, best.hard - init.hard)
        write_jsonl(
            self.run.path("test_rollouts.jsonl"),
            [{"skill": "initial", **rollout_row(r)} for r in init.rollouts]
            + [{"skill": "best", **rollout_row(r)} for r in best.rollouts],
        )
        atomic_write_json(path, result.to_dict())
        self.progress.log(
            f"initial skill {init.line()} → best skill {best.line()} "
            f"(sign test p={paired.sign_test_p:.3f})"
        )
        return result

    # ---- helpers ------------------------------------------------------------------------
    def _power(self) -> GatePower | None:
        """The gate's power on val, or on val and the pooled val's pool (one look on both)."""
        if not self.say_power:
            return None
        pool = len(self.scorer.pool_set)
        items = "val + pool items" if pool else "val items"
        return gate_power(len(self.val_set) + pool, self.config.gate, items)

    def run_config(self) -> dict[str, Any]:
        return {
            **self.config.to_dict(),
            "task": self.task.name,
            "task_kind": self.task.kind,
            "split_sizes": dict(zip(("train", "val", "test"), self.split_sizes(), strict=True)),
            "model": self.target.name,
            "optimizer_model": self.optimizer.name,
            "document": self.document,
            "initial_hash": self.doc.hash(self.initial_skill),
            # what the prompts say, not where they are: a resume with other prompts is refused
            "prompts": PromptSet.read(self.config.prompts).digests(),
        }

    def _commit(self, st: RunState, row: BaselineRow | StepRow) -> None:
        self.store.commit(st, row)
        self._update_bar(st)
        self._step_events(row.to_dict())

    def _update_bar(self, st: RunState) -> None:
        if not self.progress.active or st.best is None or st.current is None:
            return
        best = self.scorer.val_summary(st.best).hard
        cur = self.scorer.val_summary(st.current).hard
        self.progress.update(max(st.step, 0), cur, best)
