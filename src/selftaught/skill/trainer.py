"""SkillTrainer: SkillOpt in text space. The model stays frozen; the trainable state is a skill
document. One step = rollout a train batch → reflect on failed and solved minibatches →
aggregate the patches → select under the edit budget → apply → gate on val.

    trainer = SkillTrainer(SkillOptConfig(epochs=1), task, model, optimizer_model=analyst,
                           initial_skill=skill, output_dir="runs/x", callbacks=[...])
    result = trainer.train()   # a SkillRunResult (result.summary: the summary dict)

Everything lands in a run directory (see `docs` in the module below) and a killed run resumes
from its last completed step when started again with the same settings."""

from __future__ import annotations

import asyncio
import copy
import math
import random
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from selftaught.callbacks import CallbackList, RunInfo, TrainerCallback
from selftaught.demos import Demo, LeakCheck, SkillParts, join_skill, split_skill
from selftaught.errors import BudgetTooSmall, ConfigError, TaskError
from selftaught.evaluation import (
    EvalResult,
    ScoreCache,
    ascore,
    error_rows,
    metric_scores,
    rollout_row,
    summarize,
)
from selftaught.gate import GateResult, ValScores, gate, gate_tags, paired_comparison
from selftaught.models.base import ChatModel, GenerationParams
from selftaught.models.errors import FatalBackendError
from selftaught.models.usage import BudgetExhausted, RoleUsage, TrackedModel, UsageLedger
from selftaught.policy import Policy
from selftaught.results import Score
from selftaught.rollout import Rollout, RolloutConfig, arun_rollouts
from selftaught.runs import (
    RunDir,
    atomic_write_json,
    atomic_write_text,
    read_json,
    slug,
    write_jsonl,
)
from selftaught.skill.aggregate import Aggregation, aggregate
from selftaught.skill.budget_schedule import edit_budget
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.demo_search import DemoPool, bootstrapped, from_references, propose_sets
from selftaught.skill.document import Edit, EditReport, apply_edits
from selftaught.skill.guard import EditGuard
from selftaught.skill.pool import Member, merge_pair, pick_parent
from selftaught.skill.reflect import Analyst, AnalystCall, DocumentKind
from selftaught.skill.result import SkillRunResult
from selftaught.skill.rows import BaselineRow, StepRow
from selftaught.skill.select import Selection, select_edits
from selftaught.tasks.base import Example, Task, check_disjoint
from selftaught.tracking import with_tracker

RUN_LAYOUT = """\
config.json            the settings; a re-run with the same settings resumes
state.json             last completed step, current / best skill, rejected buffer, usage
history.jsonl          one row per step: batch scores, edits proposed / applied / rejected and
                       why, gate decision and scores, tokens and time (step 0 = baseline)
skills/vNNNN[-J].md    the candidates of step NNNN (v0000 = the initial skill; -J for the
                       second and later candidates of a step: other proposals, demo sets,
                       merges); a run that trains the memory writes memorys/, best_memory.md
demo_pool.json         demonstration candidates found in train so far, and leaks refused
best_skill.md          the best skill so far (what ships), current_skill.md the current one
diagnostics/step_NNNN.json  per val example: reply head, hard, soft, why it failed; the
                       analyst's raw replies; backend call errors
val_cache.json         val scores by skill hash (an unchanged skill is never re-evaluated)
test_results.json      initial vs best skill on the test split (EvalResult summaries, the
                       shape of every accuracy here) and their paired wins / losses / ties
summary.json           the final summary (SkillTrainer.train() returns it as result.summary)
error.json             why the run stopped, when a backend failed fatally
"""


def default_output_dir(task_name: str) -> Path:
    """Deterministic, so re-running the same command resumes: runs/optimize/<task-slug>."""
    return Path("runs") / "optimize" / slug(task_name)


def _demo_dicts(text: str) -> list[dict[str, Any]]:
    return [d.to_dict() for d in split_skill(text).demos]


@dataclass
class _Skill:
    version: str
    text: str
    hash: str


@dataclass
class _Parse:
    calls: int = 0
    ok: int = 0
    repaired: int = 0
    invalid_json: int = 0
    backend_error: int = 0

    def add(self, call: AnalystCall) -> None:
        self.calls += 1
        setattr(self, call.status, getattr(self, call.status) + 1)

    def rate(self) -> float | None:
        answered = self.calls - self.backend_error
        return (self.ok + self.repaired) / answered if answered else None

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "parse_rate": self.rate()}


@dataclass
class _Update:
    """Select + apply: the merged edits, what the budget kept, the new text and per-edit
    reports."""

    merged: list[Edit]
    selection: Selection
    text: str
    reports: list[EditReport]
    applied: list[Edit]


@dataclass
class _Proposal:
    """One analyst proposal: reflect → aggregate → select → apply on the parent's rules."""

    calls: list[AnalystCall]
    agg: Aggregation
    update: _Update


_NO_PROPOSAL = _Proposal([], Aggregation(), _Update([], Selection(), "", [], []))


@dataclass
class _Candidate:
    """A skill a step proposes: new rules, a new demo set, or a merge of two pool members."""

    skill: _Skill
    kind: str  # rules | demos | merge
    why: str
    proposal: _Proposal | None = None
    screen: float | None = None  # mean metric on the screening val items (None: not screened)
    full: bool = False  # scored on the whole val split
    rollouts: list[Rollout] = field(default_factory=list)
    cached: bool = True

    def to_dict(self) -> dict[str, Any]:
        demos = split_skill(self.skill.text).demos
        return {
            "version": self.skill.version,
            "hash": self.skill.hash,
            "kind": self.kind,
            "why": self.why,
            "demos": [f"{d.id} ({d.source})" for d in demos],
            "screen": None if self.screen is None else round(self.screen, 4),
            "full_val": self.full,
        }


@dataclass
class _Verdict:
    """The gate's decision on a step's chosen candidate (None when there was none)."""

    result: GateResult
    candidate: _Skill | None = None
    val_rollouts: list[Rollout] = field(default_factory=list)
    cached: bool = False
    chosen: _Candidate | None = None


@dataclass
class _StepOutcome:
    step: int
    epoch: int
    budget: int
    rollouts: list[Rollout]
    parent: _Skill
    proposals: list[_Proposal]
    candidates: list[_Candidate]
    verdict: _Verdict
    new_demos: int = 0

    @property
    def primary(self) -> _Proposal:
        """The chosen candidate's proposal when it was one, else the first proposal (an empty
        one when the analyst was not asked: `proposals=0`, demo search only)."""
        chosen = self.verdict.chosen
        if chosen is not None and chosen.proposal is not None:
            return chosen.proposal
        return self.proposals[0] if self.proposals else _NO_PROPOSAL

    @property
    def calls(self) -> list[AnalystCall]:
        return [c for p in self.proposals for c in p.calls]

    @property
    def agg_calls(self) -> list[AnalystCall]:
        return [c for p in self.proposals for c in p.agg.calls]


@dataclass
class _State:
    step: int = -1  # last completed step; -1: not even the baseline
    current: _Skill | None = None
    best: _Skill | None = None
    rejected: list[dict[str, Any]] = field(default_factory=list)
    parse: _Parse = field(default_factory=_Parse)
    elapsed_s: float = 0.0
    last_row: dict[str, Any] | None = None
    finished: bool = False
    stopped_by: str | None = None  # why the run ended before its last step (the budget)
    pool: list[str] = field(default_factory=list)  # versions that passed the gate
    demo_pool: DemoPool = field(default_factory=DemoPool)


def _not_below(scores: ValScores, parent: ValScores, ids: Iterable[str]) -> bool:
    """The candidate solves at least as much as its parent on `ids` (the screening rule)."""
    ids = list(ids)
    return sum(scores.get(i) or 0.0 for i in ids) >= sum(parent.get(i) or 0.0 for i in ids) - 1e-9


class SkillTrainer:
    """Skill optimization (SkillOpt, text space) over `task` with a frozen target `model`; the
    `optimizer_model` (default: the target) is the analyst. Every call of both is counted.
    Built as every trainer is (`SkillTrainer(config, task, model, *, output_dir, callbacks,
    progress, console)`); `train()` returns a `SkillRunResult`."""

    def __init__(
        self,
        config: SkillOptConfig,
        task: Task,
        model: ChatModel,
        optimizer_model: ChatModel | None = None,
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
    ):
        self.config = config
        self.task = task
        # the tracker (report_to) is built here, so a missing package fails before any call
        self.callbacks = CallbackList(with_tracker(config.report_to, callbacks))
        self.ledger = ledger or UsageLedger()
        self.target = TrackedModel(model, self.ledger, "target")
        # the final test evaluation is reported apart, outside any budget (as GEPA's harness)
        self.test_ledger = UsageLedger()
        self.test_target = TrackedModel(model, self.test_ledger, "target")
        self.optimizer = TrackedModel(optimizer_model or model, self.ledger, "optimizer")
        self.initial_skill = initial_skill
        # what is trained (the skill, or the memory) and the other document, held fixed
        self.document = document
        self.other_document = other_document
        # edits proposed from outside the analyst (e.g. what the user stated): they join the
        # first step's merged edits and meet the same budget, guard-free apply and gate
        self.proposals = [replace(e, source="user") for e in proposals]
        self.run = RunDir(output_dir or default_output_dir(task.name))
        self.info = RunInfo(document, task.name, self.run.root, config.to_dict())
        self.show_progress = progress
        self.console = console or Console(stderr=True, quiet=not progress)
        self.gate_cfg = config.gate
        self.analyst = Analyst(
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
        )
        self.guard: EditGuard | None = None  # built once the splits are known (_prepare)
        self.params = GenerationParams(max_tokens=config.max_tokens, temperature=config.temperature)
        self.val_cache = ScoreCache(self.run.path("val_cache.json"))
        self._progress: Progress | None = None
        self._bar: Any = None
        self._stage = ""

    # ---- public -------------------------------------------------------------------------
    def train(self) -> SkillRunResult:
        """Run (or resume) the optimization; returns the result (its summary also in
        summary.json)."""
        from selftaught.models.base import run_sync

        return run_sync(self.atrain())

    async def atrain(self) -> SkillRunResult:
        self._prepare()
        resumed = self.run.check_or_write_config(
            self._run_config(),
            ignore={
                "epochs",
                "max_steps",
                "concurrency",
                "timeout_s",
                "evaluate_test",
                "budget",
                "report_to",
            },
        )
        self.callbacks.start(self.info)
        atomic_write_text(self.run.path("README.txt"), RUN_LAYOUT)
        st = self._load_state() if resumed else _State()
        if resumed:
            self._log(f"resuming {self.run.root} after step {st.step}")
        t_start = time.perf_counter()
        elapsed0 = st.elapsed_s
        stage = "baseline"
        try:
            with self._progress_bar(st):
                try:
                    if st.step < 0:
                        await self._baseline(st, elapsed0, t_start)
                    st.stopped_by = None
                    for step in range(st.step + 1, self.total_steps + 1):
                        stage = f"step {step}"
                        await self._step(st, step, elapsed0, t_start)
                except BudgetExhausted as err:
                    self._stop_for_budget(st, stage, err)
                stage = "test"
                test = await self._test(st)
                self._test_events(st, test)
        except FatalBackendError as err:
            atomic_write_json(
                self.run.path("error.json"),
                {
                    "stage": stage,
                    "after_step": st.step,
                    "backend": err.backend,
                    "cause": err.cause,
                    "status": err.status,
                },
            )
            raise
        st.elapsed_s = elapsed0 + time.perf_counter() - t_start
        st.finished = True
        self._save_state(st)
        self.run.path("error.json").unlink(missing_ok=True)  # a resumed run got past it
        summary = self._summary(st, test)
        atomic_write_json(self.run.path("summary.json"), summary)
        result = SkillRunResult(summary=summary)
        self.callbacks.end(self.info, result)
        return result

    # ---- callback events ------------------------------------------------------------------
    def _step_events(self, row: dict[str, Any]) -> None:
        """A committed history row as events: the candidate's val, the gate, the step."""
        step = int(row["step"])
        if row.get("val"):
            label = "base" if step == 0 else "candidate"
            scores = Score.from_summary(row["val"], "val")
            self.callbacks.evaluate(self.info, step=step, split="val", scores=scores, label=label)
        if row.get("gate"):
            g = row["gate"]
            self.callbacks.gate(
                self.info, step=step, decision=g["decision"], reason=g["reason"], details=g
            )
        skip = ("val", "gate", "step", "candidates", "pool", "demos")
        self.callbacks.step(
            self.info, step=step, metrics={k: v for k, v in row.items() if k not in skip}
        )

    def _test_events(self, st: _State, test: dict[str, Any] | None) -> None:
        for label in ("initial", "best") if test else ():
            scores = Score.from_summary(test[label], "test")  # type: ignore[index]
            self.callbacks.evaluate(
                self.info, step=max(st.step, 0), split="test", scores=scores, label=label
            )

    def _prepare(self) -> None:
        """Splits, schedule and budget checks, before anything is written or called."""
        check_disjoint(self.task)  # validation that overlaps training fails closed
        self.train_set = self.task.examples("train")
        self.val_set = self.task.examples("val")
        self.val_tags = gate_tags(self.val_set, self.gate_cfg)  # the per-tag veto's tags
        self.test_set = self.task.examples("test") if self.config.evaluate_test else []
        if not self.train_set:
            raise TaskError(f"task {self.task.name!r} has an empty train split")
        if not self.val_set:
            raise TaskError(f"task {self.task.name!r} has an empty val split; the gate needs one")
        self.steps_per_epoch = math.ceil(len(self.train_set) / self.config.batch_size)
        self.total_steps = self.config.epochs * self.steps_per_epoch
        if self.config.max_steps is not None:
            self.total_steps = min(self.total_steps, self.config.max_steps)
        budget = self.config.budget
        budget.check_priced([self.target.name, self.optimizer.name])
        counts_target = budget.roles is None or "target" in budget.roles
        if budget.calls is not None and counts_target and budget.calls < len(self.val_set):
            raise ConfigError(
                f"--budget-calls {budget.calls} cannot cover even the baseline evaluation "
                f"({len(self.val_set)} val examples); raise it or shrink --val-size"
            )
        self.ledger.budget = budget
        if self.config.guard_edits:
            inputs = [ex.prompt_text() for ex in self.train_set + self.val_set]
            self.analyst.guard = EditGuard(self.analyst.templates(), inputs)
        self.train_by_id = {ex.id: ex for ex in self.train_set}
        # demos are the skill's: a run that trains the memory keeps the skill's as they are
        self.demos_on = self.document == "skill" and self.config.demos_max > 0
        self.leak_check = LeakCheck(
            (split, ex.id, ex.prompt_text())
            for split in ("val", "test")
            for ex in self.task.examples(split)  # type: ignore[arg-type]
        )
        # nothing held out may be in a demo, not even in the skill the user started from
        self.leak_check.assert_clean(split_skill(self.initial_skill).demos)

    def _stop_for_budget(self, st: _State, stage: str, err: BudgetExhausted) -> None:
        """End the run cleanly: the partial step is dropped, the best skill so far ships."""
        if st.best is None:
            raise BudgetTooSmall(
                f"the budget ran out during the baseline evaluation ({err.reason}); "
                "nothing was learned: raise the budget"
            ) from err
        st.stopped_by = f"budget ({err.reason}) during {stage}"
        self._log(
            f"[bold yellow]budget exhausted[/] ({err.reason}) during {stage}: shipping the best "
            f"skill so far ({st.best.version}); its test evaluation is outside the budget"
        )

    # ---- stages -------------------------------------------------------------------------
    async def _baseline(self, st: _State, elapsed0: float, t0: float) -> None:
        skill = self._save_skill(0, self.initial_skill)
        self._set_stage("baseline val", st)
        val = await self._val(skill)
        st.current = st.best = skill
        st.pool = [skill.version]
        if self.demos_on and self.config.demo_references:
            st.demo_pool.add(from_references(self.task, self.train_set), self.leak_check)
        atomic_write_text(self.run.path(f"best_{self.document}.md"), skill.text)
        atomic_write_text(self.run.path(f"current_{self.document}.md"), skill.text)
        atomic_write_json(
            self.run.path("diagnostics", "step_0000.json"),
            {
                "step": 0,
                "skill_hash": skill.hash,
                "val_cached": val.all_cached,
                "val": [rollout_row(r) for r in val.rollouts],
                "backend_errors": error_rows(val.rollouts),
            },
        )
        st.step = 0
        st.elapsed_s = elapsed0 + time.perf_counter() - t0
        row_val = self._val_summary(skill)  # from the cache: a resumed run writes the same row
        row = BaselineRow(
            0,
            skill.version,
            skill.hash,
            row_val.summary(),
            self.ledger.to_dict(),
            round(st.elapsed_s, 2),
        )
        self._commit(st, row)
        self._log(f"baseline {row_val.line()}")

    async def _step(self, st: _State, step: int, elapsed0: float, t_run: float) -> None:
        """One optimization step; its row and state are committed only once it is complete."""
        assert st.current is not None and st.best is not None
        t0 = time.perf_counter()
        usage0 = self.ledger.to_dict()
        epoch, batch = self._batch(step)
        budget = edit_budget(
            step,
            self.total_steps,
            self.config.edit_budget_max,
            self.config.edit_budget_min,
            self.config.edit_schedule,  # type: ignore[arg-type]
        )
        rejected = [Edit(**e) for e in st.rejected]
        parent = self._pick_parent(st, step)
        self._set_stage("rollout", st, step)
        rollouts = await self._train_rollouts(parent.text, batch, step)
        new_demos = self._harvest_demos(st, rollouts)
        self._set_stage("reflect", st, step)
        proposals = await self._propose(st, parent, rollouts, rejected, budget, step)
        candidates = self._candidates(st, step, parent, proposals)
        verdict = await self._choose(st, step, parent, candidates, proposals)
        self._apply_verdict(st, candidates, verdict)
        outcome = _StepOutcome(
            step, epoch, budget, rollouts, parent, proposals, candidates, verdict, new_demos
        )
        self._write_diagnostics(outcome)
        st.step = step
        st.elapsed_s = elapsed0 + time.perf_counter() - t_run
        row = self._history_row(st, outcome, usage0, time.perf_counter() - t0)
        self._commit(st, row)
        best_val = self._val_summary(st.best)
        chosen = verdict.chosen
        self._log(
            f"step {step}/{self.total_steps} · batch {row.batch['solved']}/"
            f"{row.batch['n']} · edits {row.edits['proposed']}→"
            f"{len(outcome.primary.update.applied)} applied · {len(candidates)} candidates"
            f"{f' (chose {chosen.kind}: {chosen.why})' if chosen else ''} · "
            f"{verdict.result.decision} ({verdict.result.reason}) · best val "
            f"{best_val.hard:.3f}"
        )

    def _pick_parent(self, st: _State, step: int) -> _Skill:
        """The skill this step builds on: a draw from the pool's Pareto front (the current
        skill when the pool is off or holds one member)."""
        assert st.current is not None
        if not self.config.pool or len(st.pool) < 2:
            return st.current
        rng = random.Random(self.config.seed * 1_000_003 + step)
        chosen = pick_parent(self._members(st), rng)
        return self._skill_from_file(chosen.version)

    def _members(self, st: _State) -> list[Member]:
        members = []
        for version in st.pool:
            skill = self._skill_from_file(version)
            members.append(Member(version, self._metric(self.val_cache[skill.hash])))
        return members

    def _harvest_demos(self, st: _State, rollouts: list[Rollout]) -> int:
        """The step's passing train replies join the demo candidates (leaks refused)."""
        if not self.demos_on:
            return 0
        return len(st.demo_pool.add(bootstrapped(rollouts, self.train_by_id), self.leak_check))

    async def _propose(
        self,
        st: _State,
        parent: _Skill,
        rollouts: list[Rollout],
        rejected: list[Edit],
        budget: int,
        step: int,
    ) -> list[_Proposal]:
        """N analyst proposals on the parent's rules; the first at the analyst's temperature,
        the others sampled (seeded) so that they differ."""
        rules = self._parts(parent.text).rules
        out = []
        if not self.config.proposals and step == 1 and self.proposals:
            # no analyst, but edits proposed from outside still meet the budget and the gate
            agg = Aggregation(edits=list(self.proposals))
            return [_Proposal([], agg, self._update(rules, agg.edits, rejected, budget))]
        for i in range(self.config.proposals):
            analyst = self.analyst
            if i:
                analyst = copy.copy(self.analyst)
                analyst.params = replace(
                    self.analyst.params,
                    temperature=self.config.proposal_temperature,
                    seed=self.config.seed * 100_003 + step * 101 + i,
                )
            calls = await self._reflect(analyst, rules, rollouts, rejected, budget)
            agg = await aggregate(
                analyst if self.config.llm_merge else None,
                rules,
                [c.edits for c in calls if c.kind in ("failure", "contrast") and c.edits],
                [c.edits for c in calls if c.kind == "success" and c.edits],
                merge_batch_size=self.config.merge_batch_size,
                max_edits=2 * budget,
            )
            for c in calls + agg.calls:
                st.parse.add(c)
            self._buffer_refused(st, calls + agg.calls)
            if step == 1 and i == 0 and self.proposals:
                agg.edits = [*self.proposals, *agg.edits]
            out.append(_Proposal(calls, agg, self._update(rules, agg.edits, rejected, budget)))
        return out

    def _parts(self, text: str) -> SkillParts:
        """Rules and demos of a trained document (a memory has no demos)."""
        return SkillParts(text) if self.document == "memory" else split_skill(text)

    def _candidates(
        self, st: _State, step: int, parent: _Skill, proposals: list[_Proposal]
    ) -> list[_Candidate]:
        """The step's candidates: each proposal's new rules (with the parent's demos), demo
        sets around the parent's, and a merge of two pool members; duplicates are skipped, and so
        are demo sets and merges already scored on the whole val split (a rule candidate that
        was is gated again from the cache, for free)."""
        parts = self._parts(parent.text)
        drafts: list[tuple[str, str, str, _Proposal | None]] = []
        for i, p in enumerate(proposals, 1):
            if p.update.applied and p.update.text != parts.rules:
                text = self._join(p.update.text, parts.demos)
                drafts.append((text, "rules", f"proposal {i}: {len(p.update.applied)} edits", p))
        if self.demos_on:
            rng = random.Random(self.config.seed * 7_919 + step)
            n, pool = self.config.demo_sets_per_step, list(st.demo_pool.demos.values())
            moves = propose_sets(parts.demos, pool, self.config.demos_max, 4 * n, rng, set())
            fresh = [(self._join(parts.rules, d), "demos", why, None) for d, why in moves]
            drafts += [d for d in fresh if self._worth_scoring(d[0], parent)][:n]
        if self.config.merge and self.config.pool and self.demos_on:
            drafts += [d for d in self._merges(st) if self._worth_scoring(d[0], parent)]
        seen = {parent.hash}
        out: list[_Candidate] = []
        for text, kind, why, proposal in drafts:
            h = self._policy(text).skill_hash()
            if h in seen:
                continue
            seen.add(h)
            version = f"v{step:04d}" + (f"-{len(out)}" if out else "")
            out.append(_Candidate(self._save_version(version, text), kind, why, proposal))
        return out

    def _merges(self, st: _State) -> list[tuple[str, str, str, None]]:
        """Rules of one pool member with the demos of another, for the two front members
        that win on different val items."""
        pair = merge_pair(self._members(st)) if len(st.pool) > 1 else None
        if pair is None:
            return []
        a, b = (self._parts(self._skill_from_file(m.version).text) for m in pair)
        va, vb = pair[0].version, pair[1].version
        return [
            (self._join(a.rules, b.demos), "merge", f"rules of {va} + demos of {vb}", None),
            (self._join(b.rules, a.demos), "merge", f"rules of {vb} + demos of {va}", None),
        ]

    def _join(self, rules: str, demos: Sequence[Demo]) -> str:
        if self.document == "memory":
            return rules
        return join_skill(rules, demos, self.config.demo_placement)

    def _worth_scoring(self, text: str, parent: _Skill) -> bool:
        """Not yet scored on the whole val split, and not already below `parent` on the val
        items it was screened on in an earlier step: as DSPy's random search, a demo set or
        merge is scored once, and the budget goes to sets not seen yet."""
        h = self._policy(text).skill_hash()
        if self.val_cache.complete(h, (ex.id for ex in self.val_set)):
            return False
        seen = self._metric(self.val_cache.get(h))
        return not seen or _not_below(seen, self._metric(self.val_cache[parent.hash]), seen)

    async def _choose(
        self,
        st: _State,
        step: int,
        parent: _Skill,
        candidates: list[_Candidate],
        proposals: list[_Proposal],
    ) -> _Verdict:
        """Successive halving, then the gate: with more candidates than `screen_keep`, all
        are scored on a seeded val subset first and the best go on to full val (a candidate
        below its parent there goes no further); the best on full val meets the gate
        against the parent (as current) and the best skill."""
        assert st.best is not None
        if not candidates:
            empty = GateResult("reject", f"empty patch: {self._why_empty(proposals)}", *[0.0] * 5)
            return _Verdict(empty)
        finalists = candidates
        cfg = self.config
        if len(candidates) > cfg.screen_keep and 0 < cfg.screen_size < len(self.val_set):
            finalists = await self._screen(st, step, parent, candidates)
            if not finalists:
                top = max(c.screen or 0.0 for c in candidates)
                return _Verdict(
                    GateResult(
                        "reject",
                        f"screening: none of {len(candidates)} candidates matched its parent "
                        f"on {cfg.screen_size} val items (best {top:.2f})",
                        *[0.0] * 5,
                    ),
                )
        self._set_stage("val", st, step)
        for c in finalists:
            val = await self._val(c.skill)
            c.rollouts += val.rollouts
            c.cached = c.cached and val.all_cached
            c.full = True
        chosen = max(finalists, key=lambda c: sum(v or 0 for v in self._val_metric(c).values()))
        result = gate(
            self._val_metric(chosen),
            self._metric(self.val_cache[parent.hash]),
            self._metric(self.val_cache[st.best.hash]),
            self.gate_cfg,
            tags=self.val_tags,
        )
        return _Verdict(result, chosen.skill, chosen.rollouts, chosen.cached, chosen)

    def _val_metric(self, c: _Candidate) -> ValScores:
        return self._metric(self.val_cache[c.skill.hash])

    async def _screen(
        self, st: _State, step: int, parent: _Skill, candidates: list[_Candidate]
    ) -> list[_Candidate]:
        """Score every candidate on the same seeded val subset; keep the best `screen_keep`
        that are not below the parent there."""
        self._set_stage(f"screen {len(candidates)}", st, step)
        ids = {
            ex.id
            for ex in random.Random(self.config.seed * 31 + step).sample(
                self.val_set, self.config.screen_size
            )
        }
        parent_scores = self._metric(self.val_cache[parent.hash])
        kept = set()
        for c in candidates:
            val = await self._val(c.skill, ids)
            c.rollouts += val.rollouts
            c.cached = val.all_cached
            scores = self._metric(val.items)
            c.screen = sum(v or 0.0 for v in scores.values()) / len(ids)
            if _not_below(scores, parent_scores, ids):
                kept.add(c.skill.hash)
        ranked = sorted(candidates, key=lambda c: -(c.screen or 0.0))  # stable: order breaks ties
        return [c for c in ranked if c.skill.hash in kept][: self.config.screen_keep]

    @staticmethod
    def _why_empty(proposals: list[_Proposal]) -> str:
        if not proposals:
            return "no demo set left to try and no analyst proposal asked for"
        update = proposals[0].update
        if not update.merged:
            return "no edit proposed"
        if not update.selection.kept:
            return "every proposed edit was rejected before"
        return "no selected edit could be applied"

    async def _train_rollouts(self, text: str, batch: list[Example], step: int) -> list[Rollout]:
        """The step's attempts: one greedy rollout per example, or K sampled ones."""
        k = self.config.rollouts_k
        if k == 1:
            return await self._rollouts(text, batch, f"step {step} rollout")
        params = GenerationParams(
            max_tokens=self.config.max_tokens,
            temperature=self.config.rollout_temperature,
            seed=self.config.seed * 100_003 + step,
        )
        return await self._rollouts(
            text, batch, f"step {step} rollout x{k}", params=params, samples=k
        )

    def _batch(self, step: int) -> tuple[int, list[Example]]:
        """(epoch index, the train examples of `step`): a seeded shuffle per epoch."""
        epoch, idx = divmod(step - 1, self.steps_per_epoch)
        size = self.config.batch_size
        return epoch, self._epoch_order(epoch)[idx * size : (idx + 1) * size]

    async def _reflect(
        self,
        analyst: Analyst,
        text: str,
        rollouts: list[Rollout],
        rejected: list[Edit],
        budget: int,
    ) -> list[AnalystCall]:
        """Reflect (≈ the gradient) on bounded minibatches: failures, successes, and, when
        each task was attempted K > 1 times, the contrast between a solved and a failed
        attempt at the same task."""
        cfg = self.config
        failed, solved, pairs = self._attempt_groups(rollouts)
        mb, most = cfg.minibatch_size, cfg.max_minibatches

        def chunks(items: list[Any]) -> list[list[Any]]:
            return [items[i : i + mb] for i in range(0, len(items), mb)][:most]

        sem = asyncio.Semaphore(cfg.concurrency)

        async def limited(job: Any) -> AnalystCall:
            async with sem:
                return await job

        jobs = [analyst.reflect("failure", text, c, rejected, budget) for c in chunks(failed)]
        jobs += [analyst.reflect_contrast(text, c, rejected, budget) for c in chunks(pairs)]
        if cfg.reflect_on_successes:
            jobs += [analyst.reflect("success", text, c, rejected, budget) for c in chunks(solved)]
        return list(await asyncio.gather(*(limited(j) for j in jobs)))

    def _attempt_groups(
        self, rollouts: list[Rollout]
    ) -> tuple[list[Rollout], list[Rollout], list[tuple[Rollout, Rollout]]]:
        """(tasks every attempt failed, tasks every attempt solved, (solved, failed) pairs
        of tasks with both), one representative attempt each, in batch order."""
        by_example: dict[str, list[Rollout]] = {}
        for r in rollouts:
            if r.ok:
                by_example.setdefault(r.example_id, []).append(r)
        failed, solved, pairs = [], [], []
        for attempts in by_example.values():
            bad = [r for r in attempts if self._is_failure(r)]
            good = [r for r in attempts if not self._is_failure(r)]
            if bad and good:
                pairs.append((good[0], bad[0]))
            elif bad:
                failed.append(bad[0])
            else:
                solved.append(good[0])
        return failed, solved, pairs

    def _update(self, rules: str, merged: list[Edit], rejected: list[Edit], budget: int) -> _Update:
        """Select under the edit budget (≈ the learning rate), then apply with a report."""
        selection = select_edits(merged, budget, rejected)
        text, reports = apply_edits(
            rules,
            selection.kept,
            max_chars=self.config.max_skill_chars,
            fallback_append=self.config.fallback_append,
        )
        applied = [r.edit for r in reports if r.changed]
        return _Update(merged, selection, text, reports, applied)

    def _buffer_refused(self, st: _State, calls: list[AnalystCall]) -> None:
        """Edits the guard refused join the rejected buffer, reason and all, so the analyst
        is told not to propose them again."""
        refused = [
            {**r["edit"], "rationale": f"refused: {r['reason']}"} for c in calls for r in c.refused
        ]
        size = self.config.rejected_buffer_size
        st.rejected = (st.rejected + refused)[-size:] if size else []

    def _apply_verdict(self, st: _State, candidates: list[_Candidate], verdict: _Verdict) -> None:
        """Move current / best; edits of rule candidates that did not pass go to the rejected
        buffer (the analyst sees them next time); what passed joins the pool."""
        candidate, decision = verdict.candidate, verdict.result.decision
        passed = candidate is not None and decision != "reject"
        lost = [
            e.to_dict()
            for c in candidates
            if c.proposal is not None and not (passed and c.skill is candidate)
            for e in c.proposal.update.applied
        ]
        size = self.config.rejected_buffer_size
        st.rejected = (st.rejected + lost)[-size:] if size else []
        if not passed:
            return
        assert candidate is not None
        st.current = candidate
        st.pool.append(candidate.version)
        atomic_write_text(self.run.path(f"current_{self.document}.md"), candidate.text)
        if decision == "accept_new_best":
            st.best = candidate
            atomic_write_text(self.run.path(f"best_{self.document}.md"), candidate.text)

    def _write_diagnostics(self, o: _StepOutcome) -> None:
        all_calls = o.calls + o.agg_calls
        analyst_errors = [
            {"analyst": c.kind, "error": c.error} for c in all_calls if c.status == "backend_error"
        ]
        v = o.verdict
        atomic_write_json(
            self.run.path("diagnostics", f"step_{o.step:04d}.json"),
            {
                "step": o.step,
                "epoch": o.epoch + 1,
                "budget": o.budget,
                "batch": [rollout_row(r) for r in o.rollouts],
                "parent": o.parent.version,
                "analyst_calls": [c.to_dict() for c in all_calls],
                "merge_fallbacks": o.primary.agg.fallbacks,
                "merged_edits": [e.to_dict() for e in o.primary.agg.edits],
                "selected": [e.to_dict() for e in o.primary.update.selection.kept],
                "dropped": [
                    {"edit": e.to_dict(), "why": why}
                    for e, why in o.primary.update.selection.dropped
                ],
                "edit_reports": [r.to_dict() for r in o.primary.update.reports],
                "candidates": [c.to_dict() for c in o.candidates],
                "chosen": v.chosen.skill.version if v.chosen else None,
                "candidate_hash": v.candidate.hash if v.candidate else None,
                "gate": v.result.to_dict(),
                "val_cached": v.cached,
                "val": [rollout_row(r) for r in v.val_rollouts],
                "backend_errors": error_rows(o.rollouts)
                + error_rows(v.val_rollouts)
                + analyst_errors,
            },
        )

    def _history_row(
        self, st: _State, o: _StepOutcome, usage0: dict[str, Any], step_s: float
    ) -> StepRow:
        assert st.current is not None and st.best is not None
        usage1 = self.ledger.to_dict()
        step_usage = {
            role: {
                k: u[k] - usage0.get(role, {}).get(k, 0)
                for k in ("calls", "prompt_tokens", "completion_tokens", "errors")
            }
            for role, u in usage1.items()
        }
        batch = self._summarize(o.rollouts, "train", o.parent.hash).summary()
        step_parse = _Parse()
        for c in o.calls + o.agg_calls:
            step_parse.add(c)
        update, chosen = o.primary.update, o.verdict.chosen
        statuses = Counter(r.status for r in update.reports)
        candidate = o.verdict.candidate
        # the applied edits are the gated candidate's; a demo or merge candidate has none
        applied = update.applied if chosen is not None and chosen.kind == "rules" else []
        return StepRow(
            step=o.step,
            epoch=o.epoch + 1,
            batch=batch,
            budget=o.budget,
            edits={
                "proposed": sum(len(c.edits) for c in o.calls),
                "invalid": sum(len(c.invalid) for c in o.calls),
                "refused": sum(len(c.refused) for c in o.calls + o.agg_calls),
                "merged": len(o.primary.agg.edits),
                "selected": len(update.selection.kept),
                "applied": len(applied),
                "dropped": dict(Counter(why.split(" (")[0] for _, why in update.selection.dropped)),
                "not_applied": {
                    k: v for k, v in statuses.items() if k not in ("applied", "fallback_append")
                },
                "fallback_append": statuses.get("fallback_append", 0),
                # what changed (clipped; the full edits are in diagnostics)
                "applied_edits": [
                    {"op": e.op, "target": e.target[:80], "content": e.content[:160]}
                    for e in applied
                ],
            },
            parent_version=o.parent.version,
            candidates=[
                {
                    **{k: c.to_dict()[k] for k in ("version", "kind", "why", "demos", "screen")},
                    "val": self._val_summary(c.skill).hard if c.full else None,
                    "chosen": c is chosen,
                }
                for c in o.candidates
            ],
            demos={
                "pool": len(st.demo_pool.demos),
                "new": o.new_demos,
                "leaks_refused": len(st.demo_pool.leaks),
                "best": [d["id"] for d in (_demo_dicts(st.best.text))],
            },
            analyst=step_parse.to_dict(),
            gate=o.verdict.result.to_dict(),
            val=self._val_summary(candidate).summary() if candidate else None,
            val_cached=o.verdict.cached,
            skill_version=candidate.version if candidate else None,
            pool=list(st.pool),
            current_version=st.current.version,
            best_version=st.best.version,
            usage=step_usage,
            step_time_s=round(step_s, 2),
            time_s=round(st.elapsed_s, 2),
        )

    async def _test(self, st: _State) -> dict[str, Any] | None:
        if not self.test_set:
            return None
        path = self.run.path("test_results.json")
        if path.exists():
            done = read_json(path)
            if st.best and done.get("best", {}).get("skill_hash") == st.best.hash:
                return done
        assert st.best is not None
        self.leak_check.assert_clean(split_skill(st.best.text).demos)  # fail closed, always
        self._set_stage("test", st)
        initial = self._skill_from_file(0)
        init = await self._score(initial.text, self.test_set, "test", "test: initial skill")
        if st.best.hash == initial.hash:
            best = init
        else:
            best = await self._score(st.best.text, self.test_set, "test", "test: best skill")
        paired = paired_comparison(best.metric_scores("hard"), init.metric_scores("hard"))
        result = {
            "initial": init.summary(),
            "best": best.summary(),
            "versions": {"initial": initial.version, "best": st.best.version},
            "paired": paired.to_dict(),
            "gain": best.hard - init.hard,
        }
        write_jsonl(
            self.run.path("test_rollouts.jsonl"),
            [{"skill": "initial", **rollout_row(r)} for r in init.rollouts]
            + [{"skill": "best", **rollout_row(r)} for r in best.rollouts],
        )
        atomic_write_json(path, result)
        self._log(
            f"initial skill {init.line()} → best skill {best.line()} "
            f"(sign test p={paired.sign_test_p:.3f})"
        )
        return result

    # ---- helpers ------------------------------------------------------------------------
    def _run_config(self) -> dict[str, Any]:
        return {
            **self.config.to_dict(),
            "task": self.task.name,
            "task_kind": self.task.kind,
            "split_sizes": {s: len(self.task.examples(s)) for s in ("train", "val", "test")},
            "model": self.target.name,
            "optimizer_model": self.optimizer.name,
            "document": self.document,
            "initial_hash": self._policy(self.initial_skill).skill_hash(),
        }

    def _epoch_order(self, epoch: int) -> list[Example]:
        order = list(self.train_set)
        random.Random(self.config.seed * 100_003 + epoch).shuffle(order)
        return order

    def _is_failure(self, r: Rollout) -> bool:
        assert r.score is not None
        return r.score.soft < 1.0 if self.gate_cfg.metric == "soft" else not r.score.hard

    def _metric(self, scores: dict[str, list[float] | None]) -> ValScores:
        return metric_scores(scores, self.gate_cfg.metric, self.gate_cfg.mixed_weight)

    async def _rollouts(
        self,
        skill: str,
        examples: list[Example],
        desc: str,
        *,
        params: GenerationParams | None = None,
        samples: int = 1,
    ) -> list[Rollout]:
        cfg = self._rollout_cfg(desc, params or self.params, samples)
        return await arun_rollouts(self.target, self._policy(skill), self.task, examples, cfg)

    def _rollout_cfg(self, desc: str, params: GenerationParams, samples: int) -> RolloutConfig:
        return RolloutConfig(
            concurrency=self.config.concurrency,
            timeout_s=self.config.timeout_s,
            params=params,
            samples=samples,
            progress=False,
            description=desc,
        )

    def _policy(self, text: str) -> Policy:
        """The policy reading `text` as the trained document, the other one fixed."""
        if self.document == "memory":
            return Policy(skill=self.other_document, memory=text)
        return Policy(skill=text, memory=self.other_document)

    async def _val(self, skill: _Skill, ids: set[str] | None = None) -> EvalResult:
        """`skill` on `ids` (default: the whole val split), cached per item by skill hash: an
        item already scored for an unchanged skill is never scored again."""
        want = [ex for ex in self.val_set if ids is None or ex.id in ids]
        return await self._score(skill.text, want, "val", "val", cache=self.val_cache)

    async def _score(
        self,
        text: str,
        examples: list[Example],
        split: str,
        desc: str,
        cache: ScoreCache | None = None,
    ) -> EvalResult:
        """Score through `selftaught.evaluation` (test: on its own ledger, outside the budget)."""
        cfg = self._rollout_cfg(desc, self.params, 1)
        model = self.target if split != "test" else self.test_target
        policy = self._policy(text)
        return await ascore(
            self.task, model, policy, examples, split=split, rollout=cfg, cache=cache
        )

    def _val_summary(self, skill: _Skill) -> EvalResult:
        """The whole-val summary of `skill`, read from the cache (so the same on resume; the
        tokens spent are in the row's usage)."""
        items = {ex.id: self.val_cache[skill.hash][ex.id] for ex in self.val_set}
        return self._summarize([], "val", skill.hash, items)

    def _summarize(
        self,
        rollouts: list[Rollout],
        split: str,
        skill_hash: str,
        items: dict[str, list[float] | None] | None = None,
    ) -> EvalResult:
        return summarize(
            rollouts,
            task=self.task.name,
            model=self.target.name,
            split=split,
            wall_s=0.0,
            skill_hash=skill_hash,
            items=items,
        )

    def _save_skill(self, step: int, text: str) -> _Skill:
        return self._save_version(f"v{step:04d}", text)

    def _save_version(self, version: str, text: str) -> _Skill:
        atomic_write_text(self.run.path(f"{self.document}s", f"{version}.md"), text)
        return _Skill(version, text, self._policy(text).skill_hash())

    def _skill_from_file(self, step_or_version: int | str) -> _Skill:
        version = step_or_version if isinstance(step_or_version, str) else f"v{step_or_version:04d}"
        text = self.run.path(f"{self.document}s", f"{version}.md").read_text(encoding="utf-8")
        return _Skill(version, text, self._policy(text).skill_hash())

    def _commit(self, st: _State, row: BaselineRow | StepRow) -> None:
        # state first (it carries the row), then history: a kill in between is repaired on
        # resume by re-appending the row; append_history never duplicates a step
        st.last_row = row.to_dict()
        self._save_state(st)
        self.run.append_history(st.last_row)
        self._update_bar(st)
        self._step_events(st.last_row)

    def _save_state(self, st: _State) -> None:
        self.run.save_state(
            {
                "step": st.step,
                "total_steps": getattr(self, "total_steps", None),
                "current_version": st.current.version if st.current else None,
                "best_version": st.best.version if st.best else None,
                "rejected": st.rejected,
                "parse": st.parse.to_dict(),
                "usage": self.ledger.to_dict(),
                "elapsed_s": round(st.elapsed_s, 3),
                "finished": st.finished,
                "stopped_by": st.stopped_by,
                "pool": st.pool,
                "last_row": st.last_row,
            }
        )
        if self.demos_on:
            atomic_write_json(self.run.path("demo_pool.json"), st.demo_pool.to_dict())

    def _load_state(self) -> _State:
        raw = self.run.load_state()
        if raw is None:
            return _State()
        self.val_cache = ScoreCache.load(self.run.path("val_cache.json"))
        st = _State(
            step=raw["step"],
            rejected=raw.get("rejected", []),
            elapsed_s=raw.get("elapsed_s", 0.0),
            last_row=raw.get("last_row"),
            stopped_by=raw.get("stopped_by"),
            pool=raw.get("pool")
            or ([raw["current_version"]] if raw.get("current_version") else []),
        )
        demo_path = self.run.path("demo_pool.json")
        if demo_path.exists():
            st.demo_pool = DemoPool.from_dict(read_json(demo_path))
        p = raw.get("parse", {})
        st.parse = _Parse(**{k: p.get(k, 0) for k in _Parse().__dict__})
        for role, u in raw.get("usage", {}).items():
            self.ledger.roles[role] = RoleUsage(**u)
        if raw.get("current_version"):
            st.current = self._skill_from_file(raw["current_version"])
            st.best = self._skill_from_file(raw["best_version"])
        if st.last_row is not None:
            self.run.append_history(st.last_row)  # no-op unless the kill hit in between
        return st

    def _summary(self, st: _State, test: dict[str, Any] | None) -> dict[str, Any]:
        assert st.best is not None
        rows = self.run.history()
        decisions = Counter(r["gate"]["decision"] for r in rows if r.get("stage") == "step")
        return {
            "run_dir": str(self.run.root),
            "task": self.task.name,
            "document": self.document,
            "steps": st.step,
            "total_steps": self.total_steps,
            "best_version": st.best.version,
            "best_skill": st.best.text,
            "best_demos": _demo_dicts(st.best.text),
            "pool": list(st.pool),
            "val_initial": self._val_summary(self._skill_from_file(0)).summary(),
            "val_best": self._val_summary(st.best).summary(),
            "decisions": dict(decisions),
            "analyst": st.parse.to_dict(),
            "test": test,
            "usage": self.ledger.to_dict(),
            "llm_calls": self.ledger.total_calls(),
            "tokens": self.ledger.total_tokens(),
            "budget": asdict(self.config.budget),
            "stopped_by": st.stopped_by,
            "test_usage": self.test_ledger.to_dict(),
            "elapsed_s": round(st.elapsed_s, 2),
        }

    # ---- progress ---------------------------------------------------------------------
    def _log(self, msg: str) -> None:
        (self._progress.console if self._progress else self.console).print(msg, highlight=False)

    def _progress_bar(self, st: _State) -> Progress:
        self._progress = Progress(
            TextColumn("[bold]optimize"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stage]}"),
            TextColumn("{task.fields[scores]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.show_progress,
            transient=True,
        )
        self._bar = self._progress.add_task(
            "optimize", total=self.total_steps, completed=max(st.step, 0), stage="", scores=""
        )
        return self._progress

    def _set_stage(self, stage: str, st: _State, step: int | None = None) -> None:
        self._stage = f"step {step} · {stage}" if step else stage
        if self._progress is not None:
            self._progress.update(self._bar, stage=self._stage)

    def _update_bar(self, st: _State) -> None:
        if self._progress is None or st.best is None or st.current is None:
            return
        best = self._val_summary(st.best).hard
        cur = self._val_summary(st.current).hard
        self._progress.update(
            self._bar, completed=max(st.step, 0), scores=f"val current {cur:.3f} best {best:.3f}"
        )
