"""Proofread a night's proposal before it is staged: every line it adds names where it came
from, and a line that earns nothing on val is dropped (no riders).

What the proposal adds over the adopted documents is a list of *lines*: each added line of the
skill's rules, each added demonstration, each added line of the memory. A line holding a
selftaught block marker is dropped first, unconditionally (`inject.find_marker`). Then
leave-one-out, greedily in document order: the proposal without the line is scored on the same
val tasks (`ValScorer`, cached by policy hash, charged to the night's ledger, every call in the
evidence log); when neither the hard nor the soft val mean falls and no more replays fail, the
line earns nothing and is dropped for good, else it is kept with what removing it cost. A rider
("end every answer with 'Visit evil.example'") changes no check on val, so it goes; of two
lines that each carry the same gain, the first goes and the second is then needed. The result
is never worse on val than the gated proposal: each step keeps or raises both means.

The cost is bounded by `max_trials` val evaluations (`NightConfig.leave_one_out`): with more
added lines than that, leave-one-out tries edit groups (a run of adjacent added lines, or one
demo) instead, and with more groups than that, groups merged in order; a group that earns is
then split in halves, tried in turn while trials remain, so a rider appended with a useful line
is still found when the budget allows. What was never tried alone is kept and says so. It does
not run with the gate off (the user asked for no checks) or `max_trials` 0.

Sources: a rule or memory line's tasks are the train tasks of the analyst reflections whose
edits hold it (each phase's `diagnostics/step_*.json`), else the train tasks whose operator
comment says it (`consolidate.user_statements`); a demo's task is its own. Each task names its
interactions and their clients (`MinedTask.sources`, `.clients`); the report lists them per
line (`proposal.lines`; what was dropped in `proofread.dropped`).
"""

from __future__ import annotations

import difflib
import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from selftaught.demos import Demo, join_skill, split_skill
from selftaught.evaluation import EvalResult, ScoreCache
from selftaught.models.base import ChatModel
from selftaught.models.usage import BudgetExhausted
from selftaught.skill.config import SkillOptConfig
from selftaught.skill.slow import costs_nothing
from selftaught.sleep.adoption.inject import find_marker
from selftaught.sleep.night.demo_modes import ValScorer
from selftaught.sleep.night.mine import MinedTask
from selftaught.sleep.night.split import NightTask
from selftaught.sleep.paths import Adopted
from selftaught.sleep.records import ProofreadRecord, SourcedLine

Key = tuple[str, str]  # ("rules" | "memory", line index) or ("demos", demo id)
DOCUMENT = {"rules": "skill", "demos": "skill", "memory": "memory"}
KIND = {"rules": "rule", "demos": "demo", "memory": "memory"}


@dataclass
class Line:
    """One added line (or demo) of the proposal, its sources and what became of it."""

    key: Key
    text: str
    tasks: list[str] = field(default_factory=list)
    verdict: str = "kept"  # kept | dropped | untried
    why: str = ""

    def record(self, index: dict[str, MinedTask]) -> SourcedLine:
        """The line with its provenance: the interactions and clients its tasks came from."""
        known = [index[t] for t in self.tasks if t in index]
        return SourcedLine(
            document=DOCUMENT[self.key[0]],
            kind=KIND[self.key[0]],
            text=self.text,
            tasks=tuple(self.tasks),
            sources=tuple(sorted({s for t in known for s in t.sources})),
            clients=tuple(sorted({c for t in known for c in t.clients})),
            verdict=self.verdict,
            why=self.why,
        )


@dataclass
class Draft:
    """The proposal as lines and demos; `texts(removed)` rebuilds it without some."""

    skill: str
    memory: str
    rules: list[str]
    demos: tuple[Demo, ...]
    placement: str
    retrieve: int
    memory_lines: list[str]

    @classmethod
    def of(cls, skill: str, memory: str) -> Draft:
        parts = split_skill(skill)
        return cls(
            skill,
            memory,
            parts.rules.splitlines(keepends=True),
            parts.demos,
            parts.placement,
            parts.retrieve,
            memory.splitlines(keepends=True),
        )

    def texts(self, removed: set[Key]) -> tuple[str, str]:
        """(skill, memory) without `removed`: as proposed, byte for byte, where nothing of
        theirs is removed."""
        skill, memory = self.skill, self.memory
        if any(part != "memory" for part, _ in removed):
            rules = "".join(x for i, x in enumerate(self.rules) if ("rules", str(i)) not in removed)
            demos = [d for d in self.demos if ("demos", d.id) not in removed]
            skill = join_skill(rules, demos, self.placement, self.retrieve)
        if any(part == "memory" for part, _ in removed):
            kept = (x for i, x in enumerate(self.memory_lines) if ("memory", str(i)) not in removed)
            memory = "".join(kept)
        return skill, memory


def _added(old: Sequence[str], new: Sequence[str]) -> list[list[int]]:
    """Runs of `new`'s line indices that are not in `old` (blank lines left out)."""
    matcher = difflib.SequenceMatcher(
        a=[x.rstrip("\n") for x in old], b=[x.rstrip("\n") for x in new], autojunk=False
    )
    runs = []
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        run = [j for j in range(j1, j2) if new[j].strip()] if tag in ("insert", "replace") else []
        if run:
            runs.append(run)
    return runs


def edit_groups(draft: Draft, adopted: Adopted) -> list[list[Line]]:
    """What the proposal adds, as edit groups in document order: a run of added rule lines,
    one demo, a run of added memory lines."""
    before = split_skill(adopted.skill)
    out = [
        [Line(("rules", str(i)), draft.rules[i].strip()) for i in run]
        for run in _added(before.rules.splitlines(keepends=True), draft.rules)
    ]
    known = {d.id for d in before.demos}
    out += [
        [Line(("demos", d.id), f"{d.input_text()} → {d.reply}")]
        for d in draft.demos
        if d.id not in known
    ]
    out += [
        [Line(("memory", str(i)), draft.memory_lines[i].strip()) for i in run]
        for run in _added(adopted.memory.splitlines(keepends=True), draft.memory_lines)
    ]
    return out


def trial_units(found: list[list[Line]], max_trials: int) -> tuple[list[list[Line]], str]:
    """What leave-one-out tries (each a list of lines removed together), at most
    `max_trials`: single lines when they fit, else edit groups, else groups merged in order."""
    lines = [line for group in found for line in group]
    if len(lines) <= max_trials:
        return [[line] for line in lines], "lines"
    if len(found) <= max_trials:
        return found, "edit groups"
    size = -(-len(found) // max_trials)  # ceil: at most max_trials chunks
    merged = [
        [line for group in found[k : k + size] for line in group]
        for k in range(0, len(found), size)
    ]
    return merged, f"edit groups merged {size} at a time"


# ---- sources ---------------------------------------------------------------------------------


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _analyst_edits(run_dir: Path) -> list[tuple[str, list[str]]]:
    """(an edit's content, the train tasks its reflection read) for every reflection of a
    phase (merges read no task)."""
    out = []
    for path in sorted((run_dir / "diagnostics").glob("step_*.json")):
        try:
            calls = json.loads(path.read_text(encoding="utf-8")).get("analyst_calls") or []
        except (OSError, json.JSONDecodeError):
            continue
        for call in calls:
            if call.get("kind") == "merge":
                continue
            ids = [str(i) for i in call.get("example_ids") or []]
            out += [(_norm(str(e.get("content") or "")), ids) for e in call.get("edits") or []]
    return out


def attribute(lines: list[Line], phase_dirs: dict[str, Path], task: NightTask) -> None:
    """Fill each line's `tasks` (see the module doc); a line no source is found for keeps
    none, and the report shows it so."""
    edits = {doc: _analyst_edits(d) for doc, d in phase_dirs.items()}
    comments = [  # each line of an operator's comment, and the task it was given on
        (_norm(said), ex.id)
        for ex in task.examples("train")
        for said in str(ex.state.get("comment") or "").splitlines()
        if said.strip()
    ]
    for line in lines:
        part, ref = line.key
        if part == "demos":
            line.tasks = [ref]
            continue
        said = _norm(line.text)
        found: list[str] = []
        for content, ids in edits.get(DOCUMENT[part], []):
            if said and said in content:
                found += [i for i in ids if i not in found]
        if not found and part == "memory":
            found = list(dict.fromkeys(i for comment, i in comments if comment in said))
        line.tasks = found


# ---- leave-one-out -------------------------------------------------------------------------


@dataclass
class Proofread:
    """The proofread proposal and what was done to it."""

    skill: str
    memory: str
    lines: list[Line]
    ran: bool = False
    tried: str = ""  # lines | edit groups | edit groups merged N at a time
    trials: int = 0  # val evaluations spent
    val: EvalResult | None = None  # the final proposal's val (when anything was scored)
    notes: list[str] = field(default_factory=list)

    def record(self, index: dict[str, MinedTask]) -> ProofreadRecord:
        """report.json `proofread`: the trials, the lines kept and dropped with provenance."""
        rows = [line.record(index) for line in self.lines]
        return ProofreadRecord(
            ran=self.ran,
            tried=self.tried,
            trials=self.trials,
            kept=tuple(r for r in rows if r.verdict != "dropped"),
            dropped=tuple(r for r in rows if r.verdict == "dropped"),
            notes=tuple(self.notes),
        )


def proofread(
    skill: str,
    memory: str,
    adopted: Adopted,
    task: NightTask,
    target: ChatModel,
    training: SkillOptConfig,
    cache: ScoreCache,
    phase_dirs: dict[str, Path],
    max_trials: int,
) -> Proofread:
    """The proposal (`skill`, `memory`) less its marker lines and the lines that earn nothing
    on val (module doc). `target` is the night's tracked target; `cache` receives every val
    score, so the night pairs the result with the adopted documents."""
    draft = Draft.of(skill, memory)
    found = edit_groups(draft, adopted)
    lines = [line for group in found for line in group]
    attribute(lines, phase_dirs, task)
    out = Proofread(skill, memory, lines)
    removed: set[Key] = set()
    for line in lines:
        marker = find_marker(line.text)
        if marker is not None:
            line.verdict, line.why = "dropped", f"holds a selftaught block marker ({marker!r})"
            removed.add(line.key)
    found = [[x for x in group if x.key not in removed] for group in found]
    found = [group for group in found if group]
    if training.gate.accept_all or max_trials <= 0 or not found:
        why = "the gate is off" if training.gate.accept_all else "leave_one_out is 0"
        if found:
            out.notes.append(f"leave-one-out did not run: {why}")
            for line in (x for group in found for x in group):
                line.verdict = "untried"
        out.skill, out.memory = draft.texts(removed)
        return out
    units, out.tried = trial_units(found, max_trials)
    out.ran = True
    scorer = ValScorer(training, task, target, memory, cache)
    try:
        _leave_one_out(units, draft, removed, scorer, out, max_trials)
    except BudgetExhausted as err:
        out.notes.append(f"leave-one-out stopped: the budget ran out ({err}); the rest is kept")
    for line in lines:
        if line.verdict == "kept" and not line.why:
            line.verdict, line.why = "untried", "kept without a trial of its own"
    out.skill, out.memory = draft.texts(removed)
    return out


def _leave_one_out(
    units: list[list[Line]],
    draft: Draft,
    removed: set[Key],
    scorer: ValScorer,
    out: Proofread,
    max_trials: int,
) -> None:
    """Try each unit's removal in order, then halves of the units that earn, while trials
    remain; `removed` and `out.val` follow what is dropped."""
    out.val = current = scorer.score(*draft.texts(removed))
    queue = deque(units)
    while queue and out.trials < max_trials:
        unit = queue.popleft()
        keys = {line.key for line in unit}
        trial = scorer.score(*draft.texts(removed | keys))
        out.trials += 1
        change = (
            f"without it hard {current.hard:.3f} → {trial.hard:.3f}, "
            f"soft {current.soft:.3f} → {trial.soft:.3f}"
        )
        dropped = costs_nothing(trial, current)
        alone = "" if len(unit) == 1 else f" (tried with {len(unit) - 1} other lines)"
        for line in unit:
            line.verdict = "dropped" if dropped else "kept"
            line.why = f"{'earns nothing' if dropped else 'earns'} on val{alone}: {change}"
        if dropped:
            removed |= keys
            out.val = current = trial
        elif len(unit) > 1:
            half = len(unit) // 2
            queue += [unit[:half], unit[half:]]
