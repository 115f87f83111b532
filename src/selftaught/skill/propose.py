"""Propose: the step's analyst proposals. Reflect (≈ the gradient) on bounded minibatches of
the step's attempts → aggregate the patches → select under the edit budget (≈ the learning
rate) → apply to the parent's rules. With `proposals > 1`, the second and later proposals are
sampled (seeded) so that they differ."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from selftaught.rollout import Rollout
from selftaught.skill.agent_edit import AgentEditor, agent_of
from selftaught.skill.aggregate import Aggregation, aggregate
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.document import Edit, EditReport, apply_edits
from selftaught.skill.documents import TrainedDocument
from selftaught.skill.reflect import Analyst, AnalystCall
from selftaught.skill.scoring import SkillScorer
from selftaught.skill.select import Selection, select_edits
from selftaught.skill.state import RunState, SkillVersion
from selftaught.skill_package import keep_flags


@dataclass
class Update:
    """Select + apply: the merged edits, what the budget kept, the new text and per-edit
    reports."""

    merged: list[Edit]
    selection: Selection
    text: str
    reports: list[EditReport]
    applied: list[Edit]


@dataclass
class Proposal:
    """One analyst proposal: reflect → aggregate → select → apply on the parent's rules."""

    calls: list[AnalystCall]
    agg: Aggregation
    update: Update


# reflection kinds whose patches are merged with the failure-driven ones
FAILURE_DRIVEN = ("failure", "contrast", "grounded")

NO_PROPOSAL = Proposal([], Aggregation(), Update([], Selection(), "", [], []))


def why_empty(proposals: list[Proposal]) -> str:
    """Why a step has no candidate, in the words of its first proposal."""
    if not proposals:
        return "no demo set left to try and no analyst proposal asked for"
    update = proposals[0].update
    if not update.merged:
        return "no edit proposed"
    if not update.selection.kept:
        return "every proposed edit was rejected before"
    return "no selected edit could be applied"


class Proposer:
    """The analyst's proposals for one step. `user_edits` (e.g. what the user stated) join the
    first step's merged edits and meet the same budget, guard-free apply and gate. When the
    analyst's model is a coding agent it edits the skill itself (`skill.agent_edit`), and
    may add files to it when the skill is a `package`."""

    def __init__(
        self,
        config: SkillOptConfig,
        analyst: Analyst,
        document: TrainedDocument,
        scorer: SkillScorer,
        user_edits: Sequence[Edit] = (),
        *,
        package: bool = False,
    ):
        self.config = config
        self.analyst = analyst
        self.document = document
        self.scorer = scorer
        self.user_edits = list(user_edits)
        agent = agent_of(analyst.model)  # a coding agent edits the document itself
        editor = AgentEditor(analyst, agent, package=package) if agent is not None else None
        self.editor = editor

    async def propose(
        self,
        st: RunState,
        parent: SkillVersion,
        rollouts: list[Rollout],
        rejected: list[Edit],
        budget: int,
        step: int,
    ) -> list[Proposal]:
        """N analyst proposals on the parent's rules; the first at the analyst's temperature,
        the others sampled (seeded) so that they differ."""
        rules = self.document.parts(parent.text).rules
        out = []
        if not self.config.proposals and step == 1 and self.user_edits:
            # no analyst, but edits proposed from outside still meet the budget and the gate
            agg = Aggregation(edits=list(self.user_edits))
            return [Proposal([], agg, self.update(rules, agg.edits, rejected, budget))]
        if self.editor is not None:
            return await self.agent_proposals(st, rules, rollouts, rejected, budget, step)
        for i in range(self.config.proposals):
            analyst = self.analyst
            if i:
                analyst = copy.copy(self.analyst)
                analyst.params = replace(
                    self.analyst.params,
                    temperature=self.config.proposal_temperature,
                    seed=self.config.seed * 100_003 + step * 101 + i,
                )
            summary = st.train_summary.text if st.train_summary is not None else ""
            calls = await self.reflect(analyst, rules, rollouts, rejected, budget, summary)
            agg = await aggregate(
                analyst if self.config.llm_merge else None,
                rules,
                [c.edits for c in calls if c.kind in FAILURE_DRIVEN and c.edits],
                [c.edits for c in calls if c.kind == "success" and c.edits],
                merge_batch_size=self.config.merge_batch_size,
                max_edits=2 * budget,
            )
            for c in calls + agg.calls:
                st.parse.add(c)
            self.buffer_refused(st, calls + agg.calls)
            if step == 1 and i == 0 and self.user_edits:
                agg.edits = [*self.user_edits, *agg.edits]
            out.append(Proposal(calls, agg, self.update(rules, agg.edits, rejected, budget)))
        return out

    def micro_batches(self, rollouts: list[Rollout]) -> list[list[Rollout]]:
        """The step's attempts by the batch their example belongs to (batch_size examples
        each, in batch order); one group without accumulation."""
        if self.config.accumulate_steps == 1:
            return [rollouts]
        position: dict[str, int] = {}
        for r in rollouts:
            position.setdefault(r.example_id, len(position))
        groups: dict[int, list[Rollout]] = {}
        for r in rollouts:
            groups.setdefault(position[r.example_id] // self.config.batch_size, []).append(r)
        return [groups[i] for i in sorted(groups)]

    async def agent_proposals(
        self,
        st: RunState,
        rules: str,
        rollouts: list[Rollout],
        rejected: list[Edit],
        budget: int,
        step: int,
    ) -> list[Proposal]:
        """N runs of the optimizer agent on the parent's package (`skill.agent_edit`): the
        step's failed and passed attempts as files, its change read back as one edit per
        hunk, then the same select, apply and gate as an analyst's edits."""
        assert self.editor is not None
        failed, passed = self.agent_rollouts(rollouts)
        runs = [
            self.editor.edit(rules, failed, passed, rejected, budget)
            for _ in range(self.config.proposals)
        ]
        out = []
        for i, (call, base) in enumerate(await asyncio.gather(*runs)):
            st.parse.add(call)
            self.buffer_refused(st, [call])
            edits = [*self.user_edits, *call.edits] if step == 1 and i == 0 else call.edits
            agg = Aggregation(edits=list(edits))
            out.append(Proposal([call], agg, self.update(base, agg.edits, rejected, budget)))
        return out

    def agent_rollouts(self, rollouts: list[Rollout]) -> tuple[list[Rollout], list[Rollout]]:
        """(failed, passed) attempts for the agent's files, every sample of each, at most
        as many of each as the analyst's minibatches would read (of every accumulated
        batch)."""
        cfg = self.config
        most = cfg.minibatch_size * cfg.max_minibatches * cfg.accumulate_steps
        done = [r for r in rollouts if r.ok]
        failed = [r for r in done if self.scorer.is_failure(r)]
        passed = [r for r in done if not self.scorer.is_failure(r)]
        return failed[:most], passed[:most]

    async def reflect(
        self,
        analyst: Analyst,
        text: str,
        rollouts: list[Rollout],
        rejected: list[Edit],
        budget: int,
        summary: str = "",
    ) -> list[AnalystCall]:
        """Reflect on bounded minibatches: failures, successes, and, when each task was
        attempted K > 1 times, the contrast between a solved and a failed attempt at the same
        task. With `grounded_proposals` and a train summary, one more call proposes
        instructions grounded in the summary and the step's failed attempts. With
        `accumulate_steps` N the step's batch is N batches, each reflected on as a step would
        (its own minibatches, under `max_minibatches`); their patches go on to one merge. The
        grounded call is asked once, with the first batch."""
        cfg = self.config
        mb, most = cfg.minibatch_size, cfg.max_minibatches

        def chunks(items: list[Any]) -> list[list[Any]]:
            return [items[i : i + mb] for i in range(0, len(items), mb)][:most]

        async def one_batch(group: list[Rollout], said: str) -> list[AnalystCall]:
            failed, solved, pairs = self.attempt_groups(group)
            sem = asyncio.Semaphore(cfg.concurrency)

            async def limited(job: Awaitable[AnalystCall]) -> AnalystCall:
                async with sem:
                    return await job

            jobs = [analyst.reflect("failure", text, c, rejected, budget) for c in chunks(failed)]
            jobs += [analyst.reflect_contrast(text, c, rejected, budget) for c in chunks(pairs)]
            if cfg.reflect_on_successes:
                jobs += [
                    analyst.reflect("success", text, c, rejected, budget) for c in chunks(solved)
                ]
            if cfg.grounded_proposals and said:
                shown = (failed + [bad for _, bad in pairs])[:mb]
                jobs.append(analyst.reflect_grounded(text, said, shown, rejected, budget))
            return list(await asyncio.gather(*(limited(j) for j in jobs)))

        groups = self.micro_batches(rollouts)
        done = await asyncio.gather(
            *(one_batch(group, summary if not i else "") for i, group in enumerate(groups))
        )
        return [call for calls in done for call in calls]

    def attempt_groups(
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
            bad = [r for r in attempts if self.scorer.is_failure(r)]
            good = [r for r in attempts if not self.scorer.is_failure(r)]
            if bad and good:
                pairs.append((good[0], bad[0]))
            elif bad:
                failed.append(bad[0])
            else:
                solved.append(good[0])
        return failed, solved, pairs

    def update(self, rules: str, merged: list[Edit], rejected: list[Edit], budget: int) -> Update:
        """Select under the edit budget (≈ the learning rate), then apply with a report; what
        the gate refused before, in this run or (the ledger's tried and failed) in earlier
        ones, is not applied again."""
        selection = select_edits(
            merged, budget, [*rejected, *self.analyst.tried_failed], self.config.edit_ops
        )
        # an agent's hunks quote the parent's text above them: applied last first, none moves
        # another's; those added at the end first, in their order
        agent = [e for e in selection.kept if e.source == "agent"]
        kept = [e for e in selection.kept if e.source != "agent"]
        kept += [e for e in agent if e.op == "append"] + [e for e in agent if e.op != "append"][
            ::-1
        ]
        text, reports = apply_edits(
            rules,
            kept,
            max_chars=self.config.max_skill_chars,
            fallback_append=self.config.fallback_append,
        )
        text = keep_flags(text, rules)  # only the user's own package makes a file executable
        applied = [r.edit for r in reports if r.changed]
        return Update(merged, selection, text, reports, applied)

    def buffer_refused(self, st: RunState, calls: list[AnalystCall]) -> None:
        """Edits the guard refused join the rejected buffer, reason and all, so the analyst
        is told not to propose them again."""
        refused = [
            {**r["edit"], "rationale": f"refused: {r['reason']}"} for c in calls for r in c.refused
        ]
        size = self.config.rejected_buffer_size
        st.rejected = (st.rejected + refused)[-size:] if size else []
