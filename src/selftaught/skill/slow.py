"""The slow update: once every N runs (or nights) that share an edit ledger, ONE rewrite of the
skill that keeps what earns its place and merges what kept helping, gated like any candidate.

1. **Due?** The ledger counts the runs of this document (`EditLedger.runs`); the update runs at
   the end of a run whose count is a multiple of `slow_every` (1: every run).
2. **Leave-one-out on val.** Each rule of the current skill (a non-blank line that is not a
   heading, with its indented continuation lines; protected regions untouched) is removed in
   turn, in document order, from what is left so far; when neither the hard nor the soft val
   mean falls and no more replays fail, the rule earns nothing and is dropped. At most
   `slow_max_trials` val evaluations (cached by skill hash); rules not tried are kept.
3. **Merge.** When two or more rules left are ones the ledger holds as accepted at least
   `slow_min_accepted` times, the analyst (`prompts/slow_merge.md`) merges the overlapping
   ones: replace and delete only, and the rules may only get shorter. The analyst reads the
   skill and the ledger's counts, never a val or test item: val is seen as scores only.
4. **Gate.** The rewrite meets the one gate (`selftaught.gate.gate`) against the current skill
   (as current and best). A consolidation removes and shortens, so it need not beat the skill
   by the margin: it ships when the gate does not reject it (no worse than the current skill
   on val; ties as `accept_ties` says) and is recorded either way (`SlowUpdate`, the ledger).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from selftaught.evaluation import EvalResult
from selftaught.gate import gate
from selftaught.models.usage import BudgetExhausted
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.document import Edit, apply_edits, normalize, protected_spans
from selftaught.skill.documents import TrainedDocument, VersionStore
from selftaught.skill.ledger import EditLedger, LedgerEvent
from selftaught.skill.reflect import Analyst
from selftaught.skill.result import RuleTrial, SlowUpdate
from selftaught.skill.scoring import SkillScorer
from selftaught.skill.state import SkillVersion
from selftaught.skill_package import file_spans

MERGE_OPS = ("replace", "delete")


def costs_nothing(without: EvalResult, with_it: EvalResult) -> bool:
    """Removing something costs nothing on val: no more failed replays, and neither the hard
    nor the soft mean falls (shared with the night's proofread)."""
    return (
        without.n_errors <= with_it.n_errors
        and without.hard >= with_it.hard
        and without.soft >= with_it.soft
    )


def rule_units(rules: str) -> list[tuple[int, int]]:
    """[start, end) line ranges of each rule of `rules`: a non-blank line that is not a heading,
    with the indented lines under it; rules touching a protected region or a package's file
    are left out."""
    lines = rules.splitlines(keepends=True)
    # a package's files are not rules: no line of them is taken out
    spans = protected_spans(rules) + [(s, e) for s, e, _ in file_spans(rules)]
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    units: list[tuple[int, int]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if line[0] in " \t" and units and units[-1][1] == i:
            units[-1] = (units[-1][0], i + 1)
        elif not line.lstrip().startswith("#"):
            units.append((i, i + 1))

    def free(u: tuple[int, int]) -> bool:
        a, b = starts[u[0]], starts[u[1]]
        return not any(a < e and s < b for s, e in spans)

    return [u for u in units if free(u)]


class SlowConsolidator:
    """The slow update of one run's document (module doc); `run` returns what it did and the
    rewrite when it ships."""

    def __init__(
        self,
        config: SkillOptConfig,
        doc: TrainedDocument,
        scorer: SkillScorer,
        versions: VersionStore,
        analyst: Analyst,
        ledger: EditLedger,
        run_id: str,
    ):
        self.config = config
        self.doc = doc
        self.scorer = scorer
        self.versions = versions
        self.analyst = analyst
        self.ledger = ledger
        self.run_id = run_id

    async def run(
        self, current: SkillVersion, step: int, set_stage: Callable[[str], None]
    ) -> tuple[SlowUpdate, SkillVersion | None]:
        every = self.config.slow_every
        runs = len(self.ledger.runs(self.doc.kind))
        if runs % every:
            why = f"not due: run {runs} of this {self.doc.kind} in the ledger, every {every}"
            return SlowUpdate(False, why, runs, every), None
        try:
            return await self._rewrite(current, step, runs, set_stage)
        except BudgetExhausted as err:
            why = f"stopped: the budget ran out ({err.reason}); nothing rewritten"
            return SlowUpdate(True, why, runs, every), None

    async def _rewrite(
        self, current: SkillVersion, step: int, runs: int, set_stage: Callable[[str], None]
    ) -> tuple[SlowUpdate, SkillVersion | None]:
        parts = self.doc.parts(current.text)
        set_stage("slow: leave-one-out")
        base = await self.scorer.val(current)
        rules, trials = await self._leave_one_out(parts.rules, parts.demos, base)
        set_stage("slow: merge")
        rules, merged = await self._merge(rules)
        text = self.doc.join(rules, parts.demos)
        common = functools.partial(
            SlowUpdate,
            runs=runs,
            every=self.config.slow_every,
            trials=tuple(trials),
            merged=tuple((e.op, e.target, e.content) for e in merged),
            val_before=base.hard,
            chars_before=len(current.text),
        )
        if self.doc.hash(text) == current.hash:
            why = "nothing to rewrite: every rule tried earns its place, none overlap"
            return common(True, why, chars_after=len(text)), None
        version = self.versions.save(f"v{step:04d}-slow", text)
        set_stage("slow: val")
        after = await self.scorer.val(version)
        metric = self.scorer.val_metric
        result = gate(
            metric(version.hash),
            metric(current.hash),
            metric(current.hash),
            self.config.gate,
            tags=self.scorer.val_tags,
        )
        shipped = result.decision != "reject"
        update = common(
            True,
            result.reason,
            decision=result.decision,
            val_after=after.hard,
            chars_after=len(text),
            version=version.version,
            shipped=shipped,
        )
        self._record(update, step)
        return update, version if shipped else None

    async def _leave_one_out(
        self, rules: str, demos: Any, base: EvalResult
    ) -> tuple[str, list[RuleTrial]]:
        """Drop, in order, each rule whose removal costs nothing on val (module doc)."""
        lines = rules.splitlines(keepends=True)
        units = rule_units(rules)
        removed: set[int] = set()

        def without(extra: tuple[int, int] | None) -> str:
            gone = removed | (set(range(*extra)) if extra else set())
            return "".join(x for i, x in enumerate(lines) if i not in gone)

        trials: list[RuleTrial] = []
        current = base
        for n, unit in enumerate(units):
            rule = "".join(lines[unit[0] : unit[1]]).strip()
            if n >= self.config.slow_max_trials:
                trials.append(RuleTrial(rule, "untried", "over slow_max_trials"))
                continue
            text = self.doc.join(without(unit), demos)
            trial = await self.scorer.val(SkillVersion("slow-trial", text, self.doc.hash(text)))
            change = f"val without it: hard {current.hard:.3f} → {trial.hard:.3f}"
            if costs_nothing(trial, current):
                removed |= set(range(*unit))
                current = trial
                trials.append(RuleTrial(rule, "dropped", f"earns nothing ({change})"))
            else:
                trials.append(RuleTrial(rule, "kept", f"earns its place ({change})"))
        return without(None), trials

    async def _merge(self, rules: str) -> tuple[str, list[Edit]]:
        """The analyst merges overlapping rules the ledger holds as accepted many times:
        replace / delete only, and never longer than before."""
        present = normalize(rules)
        helped = [
            e.edit()
            for e in self.ledger.kept_helping(
                self.doc.kind, min_accepted=self.config.slow_min_accepted
            )
            if e.op != "delete" and e.content and normalize(e.content) in present
        ]
        if len(helped) < 2:
            return rules, []
        budget = self.config.edit_budget_max
        call = await self.analyst.merge_overlaps(rules, helped, budget)
        edits = [e for e in call.edits if e.op in MERGE_OPS][:budget]
        text, reports = apply_edits(
            rules, edits, max_chars=self.config.max_skill_chars, fallback_append=False
        )
        if len(text) >= len(rules):
            return rules, []
        return text, [r.edit for r in reports if r.changed]

    def _record(self, update: SlowUpdate, step: int) -> None:
        """The rewrite in the ledger: one `slow` row and a `dropped` row per dropped rule."""
        doc, run = self.doc.kind, self.run_id
        outcome = f"{update.decision}: {update.reason}"
        rows = [
            LedgerEvent.of_edit(
                "dropped", run, step, Edit("delete", target=r), document=doc, reason=outcome
            )
            for r in update.dropped
        ]
        summary = (
            f"dropped {len(update.dropped)} rules, merged {len(update.merged)}; "
            f"{update.chars_before} → {update.chars_after} chars"
        )
        rows.append(
            LedgerEvent(
                "slow",
                run,
                step,
                doc,
                content=summary,
                reason=outcome,
                time=time.time(),
            )
        )
        self.ledger.append(rows)
