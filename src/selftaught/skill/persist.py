"""Persist: everything a skill run writes to its run directory and reads back on resume (the
layout is `RUN_LAYOUT`). State is committed before history, once a step is complete: a run
killed anywhere resumes from its last completed step."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftaught.demos import DemoDict, split_skill
from selftaught.evaluation import EvalResult, ScoreCache, error_rows, rollout_row
from selftaught.models.usage import RoleUsage, UsageLedger
from selftaught.rollout import Rollout
from selftaught.runs import RunDir, atomic_write_json, read_json, slug
from selftaught.skill.candidates import Candidate
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.demo_search import DemoPool
from selftaught.skill.documents import VersionStore
from selftaught.skill.gating import Verdict
from selftaught.skill.grounding import TrainSummary
from selftaught.skill.propose import NO_PROPOSAL, Proposal
from selftaught.skill.reflect import AnalystCall
from selftaught.skill.result import (
    FrontPoint,
    ParseStats,
    SkillRunResult,
    SkillTest,
    SlowUpdate,
    cost_front,
)
from selftaught.skill.rows import BaselineRow, StepRow
from selftaught.skill.scoring import SkillScorer
from selftaught.skill.state import RunState, SkillVersion
from selftaught.skill.teacher import TeacherAttempt
from selftaught.stops import StopReason, stop_dict

RUN_LAYOUT = """\
config.json            the settings; a re-run with the same settings resumes
state.json             last completed step, current / best skill, rejected buffer, usage
history.jsonl          one row per step: batch scores, edits proposed / applied / rejected and
                       why, gate decision and scores, tokens and time (step 0 = baseline)
skills/vNNNN[-J].md    the candidates of step NNNN (v0000 = the initial skill; -J for the
                       second and later candidates of a step: other proposals, demo sets,
                       merges); a run that trains the memory writes memorys/, best_memory.md
demo_pool.json         demonstration candidates found in train so far, and leaks refused
                       (with --teacher-demos: the train items the teacher was asked about)
train_summary.json     with --grounded-proposals: the analyst's summary of the train set and
                       the train items it was written from (written once; a resumed run reads it)
best_skill.md          the best skill so far (what ships), current_skill.md the current one
best_package/          a skill package's best (SKILL.md, scripts/, references/), written at
                       the end when the skill holds files (`optimize --skill DIR`)
diagnostics/step_NNNN.json  per val example: reply head, hard, soft, why it failed; the
                       analyst's raw replies; backend call errors
val_cache.json         val scores by skill hash (an unchanged skill is never re-evaluated);
                       pool_cache.json the same for the pooled val (--pooled-val);
                       val_cache_costs.json what each item's rollout spent (tokens, seconds)
test_results.json      initial vs best skill on the test split (EvalResult summaries, the
                       shape of every accuracy here) and their paired wins / losses / ties
summary.json           the final result (what SkillTrainer.train() returns, as JSON), with
                       `front`: every skill scored on val, its score against its cost
edit_ledger.jsonl      every edit proposed and its fate, across runs (unless --edit-ledger
                       names another file); slow_update.json: the slow update (--slow-every)
error.json             why the run stopped, when a backend failed fatally
"""


SUMMARY_FILE = "train_summary.json"


def default_output_dir(task_name: str) -> Path:
    """Deterministic, so re-running the same command resumes: runs/optimize/<task-slug>."""
    return Path("runs") / "optimize" / slug(task_name)


def demo_dicts(text: str) -> list[DemoDict]:
    return [d.to_dict() for d in split_skill(text).demos]


@dataclass
class StepOutcome:
    """Everything one step did, for its history row and its diagnostics."""

    step: int
    epoch: int
    budget: int
    rollouts: list[Rollout]
    parent: SkillVersion
    proposals: list[Proposal]
    candidates: list[Candidate]
    verdict: Verdict
    new_demos: int = 0
    teacher: list[TeacherAttempt] | None = None  # None: the teacher is off
    # the difficulties of a batch --curriculum ordered, in batch order (None: not ordered)
    curriculum: list[float] | None = None

    @property
    def primary(self) -> Proposal:
        """The chosen candidate's proposal when it was one, else the first proposal (an empty
        one when the analyst was not asked: `proposals=0`, demo search only)."""
        chosen = self.verdict.chosen
        if chosen is not None and chosen.proposal is not None:
            return chosen.proposal
        return self.proposals[0] if self.proposals else NO_PROPOSAL

    @property
    def calls(self) -> list[AnalystCall]:
        return [c for p in self.proposals for c in p.calls]

    @property
    def agg_calls(self) -> list[AnalystCall]:
        return [c for p in self.proposals for c in p.agg.calls]


class RunStore:
    """The run directory of one skill run: state, history, diagnostics and the summary."""

    def __init__(
        self,
        run: RunDir,
        config: SkillOptConfig,
        versions: VersionStore,
        scorer: SkillScorer,
        ledger: UsageLedger,
        *,
        total_steps: int,
        demos_on: bool,
    ):
        self.run = run
        self.config = config
        self.versions = versions
        self.scorer = scorer
        self.ledger = ledger
        self.total_steps = total_steps
        self.demos_on = demos_on

    # ---- state and history -------------------------------------------------------------
    def commit(self, st: RunState, row: BaselineRow | StepRow) -> None:
        """State first (it carries the row), then history: a kill in between is repaired on
        resume by re-appending the row; append_history never duplicates a step."""
        st.last_row = row.to_dict()
        self.save_state(st)
        self.run.append_history(st.last_row)

    def save_state(self, st: RunState) -> None:
        self.run.save_state(
            {
                "step": st.step,
                "total_steps": self.total_steps,
                "current_version": st.current.version if st.current else None,
                "best_version": st.best.version if st.best else None,
                "rejected": st.rejected,
                "parse": st.parse.to_dict(),
                "usage": self.ledger.to_dict(),
                "elapsed_s": round(st.elapsed_s, 3),
                "finished": st.finished,
                "stopped_by": stop_dict(st.stopped_by),
                "without_accept": st.without_accept,
                "edit_budget": st.edit_budget,
                "pool": st.pool,
                "last_row": st.last_row,
            }
        )
        if self.demos_on:
            atomic_write_json(self.run.path("demo_pool.json"), st.demo_pool.to_dict())

    def load_state(self) -> RunState:
        """The state a killed run saved (its val cache and usage too); a fresh state when
        there is none."""
        raw = self.run.load_state()
        if raw is None:
            return RunState()
        self.scorer.val_cache = ScoreCache.load(
            self.run.path("val_cache.json"), self.scorer.val_cache.dtype
        )
        st = RunState(
            step=raw["step"],
            rejected=raw.get("rejected", []),
            elapsed_s=raw.get("elapsed_s", 0.0),
            last_row=raw.get("last_row"),
            stopped_by=StopReason.read(raw.get("stopped_by")),
            without_accept=int(raw.get("without_accept") or 0),
            edit_budget=raw.get("edit_budget"),
            pool=raw.get("pool")
            or ([raw["current_version"]] if raw.get("current_version") else []),
        )
        st.train_summary = self.load_train_summary()
        demo_path = self.run.path("demo_pool.json")
        if demo_path.exists():
            st.demo_pool = DemoPool.from_dict(read_json(demo_path))
        p = raw.get("parse", {})
        st.parse = ParseStats(**{k: p.get(k, 0) for k in ParseStats().__dict__})
        for role, u in raw.get("usage", {}).items():
            self.ledger.roles[role] = RoleUsage(**u)
        if raw.get("current_version"):
            st.current = self.versions.load(raw["current_version"])
            st.best = self.versions.load(raw["best_version"])
        if st.last_row is not None:
            self.run.append_history(st.last_row)  # no-op unless the kill hit in between
        return st

    def save_train_summary(self, summary: TrainSummary) -> None:
        """Written as soon as the analyst answered: a run killed in its first step does not
        ask again."""
        atomic_write_json(self.run.path(SUMMARY_FILE), summary.to_dict())

    def load_train_summary(self) -> TrainSummary | None:
        path = self.run.path(SUMMARY_FILE)
        return TrainSummary.from_dict(read_json(path)) if path.exists() else None

    # ---- diagnostics ---------------------------------------------------------------------
    def write_baseline_diagnostics(self, skill: SkillVersion, val: EvalResult) -> None:
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

    def write_diagnostics(self, o: StepOutcome) -> None:
        all_calls = o.calls + o.agg_calls
        analyst_errors = [
            {"analyst": c.kind, "error": c.error} for c in all_calls if c.status == "backend_error"
        ]
        v = o.verdict
        extra: dict[str, Any] = {}
        if o.teacher is not None:  # --teacher-demos: each attempt
            extra["teacher"] = [a.to_dict() for a in o.teacher]
        if o.verdict.pooled is not None:  # --pooled-val: the pool's part and each one's power
            extra["pooled_val"] = o.verdict.pooled.to_dict()
        if o.curriculum is not None:  # --curriculum ordered this batch: each item's difficulty
            extra["curriculum"] = {"difficulty": [round(d, 4) for d in o.curriculum]}
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
                **extra,  # the teacher's attempts (--teacher-demos), the pooled val
            },
        )

    # ---- the step's history row ------------------------------------------------------------
    def history_row(
        self, st: RunState, o: StepOutcome, usage0: dict[str, Any], step_s: float
    ) -> StepRow:
        assert st.current is not None and st.best is not None
        batch = self.scorer.summarize(o.rollouts, "train", o.parent.hash)
        step_parse = ParseStats()
        for c in o.calls + o.agg_calls:
            step_parse.add(c)
        candidate = o.verdict.candidate
        return StepRow(
            step=o.step,
            epoch=o.epoch + 1,
            batch=batch,
            budget=o.budget,
            edits=self._edits(o),
            parent_version=o.parent.version,
            candidates=[
                {
                    **{k: c.to_dict()[k] for k in ("version", "kind", "why", "demos", "screen")},
                    "val": self.scorer.val_summary(c.skill).hard if c.full else None,
                    "cost": self._cost(c.skill) if c.full else None,  # per val item
                    "chosen": c is o.verdict.chosen,
                }
                for c in o.candidates
            ],
            demos={
                "pool": len(st.demo_pool.demos),
                "new": o.new_demos,
                "leaks_refused": len(st.demo_pool.leaks),
                "best": [d["id"] for d in (demo_dicts(st.best.text))],
                **self._teacher_counts(o),
            },
            analyst=step_parse.to_dict(),
            gate=o.verdict.result,
            val=self.scorer.val_summary(candidate) if candidate else None,
            val_cached=o.verdict.cached,
            skill_version=candidate.version if candidate else None,
            pool=list(st.pool),
            current_version=st.current.version,
            best_version=st.best.version,
            usage=self._step_usage(usage0),
            step_time_s=round(step_s, 2),
            time_s=round(st.elapsed_s, 2),
            stopped_by=st.stopped_by,
            curriculum=(
                [round(min(o.curriculum), 4), round(max(o.curriculum), 4)] if o.curriculum else None
            ),
        )

    def _cost(self, skill: SkillVersion) -> dict[str, Any] | None:
        cost = self.scorer.val_cost(skill.hash)
        return cost.to_dict() if cost else None

    def front(self, st: RunState) -> list[FrontPoint]:
        """Score against cost for the starting skill, every candidate scored on the whole val
        split and the shipped skill (`result.cost_front`)."""
        assert st.best is not None
        named = {"v0000"}
        for row in self.run.history():
            named |= {c["version"] for c in row.get("candidates") or [] if c.get("val") is not None}
        skills = {st.best.version: st.best}
        for version in named - skills.keys():
            if self.run.path(f"{self.versions.document.kind}s", f"{version}.md").is_file():
                skills[version] = self.versions.load(version)
        ids = [ex.id for ex in self.scorer.val_set]
        points = []
        for version, skill in skills.items():
            if not self.scorer.val_cache.complete(skill.hash, ids):
                continue
            scored = [v for v in self.scorer.val_metric(skill.hash).values() if v is not None]
            val = sum(scored) / len(scored) if scored else 0.0
            points.append((version, val, self.scorer.val_cost(skill.hash)))
        return cost_front(points, st.best.version)

    @staticmethod
    def _teacher_counts(o: StepOutcome) -> dict[str, Any]:
        """The step's teacher attempts by status (nothing when the teacher is off)."""
        if o.teacher is None:
            return {}
        return {"teacher": dict(Counter(a.status for a in o.teacher))}

    def _step_usage(self, usage0: dict[str, Any]) -> dict[str, Any]:
        """Calls and tokens of this step, per role (the ledger now minus at its start)."""
        return {
            role: {
                k: u[k] - usage0.get(role, {}).get(k, 0)
                for k in ("calls", "prompt_tokens", "completion_tokens", "errors")
            }
            for role, u in self.ledger.to_dict().items()
        }

    @staticmethod
    def _edits(o: StepOutcome) -> dict[str, Any]:
        update, chosen = o.primary.update, o.verdict.chosen
        statuses = Counter(r.status for r in update.reports)
        # the applied edits are the gated candidate's; a demo or merge candidate has none
        applied = update.applied if chosen is not None and chosen.kind == "rules" else []
        return {
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
                {"op": e.op, "target": e.target[:80], "content": e.content[:160]} for e in applied
            ],
        }

    # ---- the final result -------------------------------------------------------------------
    def result(
        self,
        st: RunState,
        test: SkillTest | None,
        *,
        task: str,
        document: str,
        test_ledger: UsageLedger,
        slow: SlowUpdate | None = None,
    ) -> SkillRunResult:
        """What the run shipped (summary.json holds its `to_dict()`); `slow`: the slow update
        at its end, when it made one."""
        assert st.best is not None
        rows = self.run.history()
        decisions = Counter(r["gate"]["decision"] for r in rows if r.get("stage") == "step")
        return SkillRunResult(
            run_dir=self.run.root,
            task=task,
            method=document,
            steps=st.step,
            total_steps=self.total_steps,
            best_version=st.best.version,
            best_skill=st.best.text,
            best_demos=demo_dicts(st.best.text),
            pool=list(st.pool),
            val_initial=self.scorer.val_summary(self.versions.load(0)),
            val_best=self.scorer.val_summary(st.best),
            decisions=dict(decisions),
            analyst=st.parse,
            test=test,
            usage=self.ledger.to_dict(),
            budget=self.config.budget,
            stopped_by=st.stopped_by,
            test_usage=test_ledger.to_dict(),
            seconds=round(st.elapsed_s, 2),
            front=self.front(st),
            slow=slow,
        )
