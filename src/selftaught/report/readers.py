"""Readers that turn a run directory into what the report shows, one small adapter per kind.

`load_run(path)` detects the kind from config.json and the files present, then reads:

- `optimize` (skill/trainer.py; a sleep night's staging folder, kind `sleep`, found by its
  report.json, has the same layout and reuses `load_skill_run` with another kind name),
- `rest` (weights/rest.py: ReST-EM and SFT, one history row per round, round 0 = base),
- `rl` (weights/rl.py: GRPO / GSPO, one history row per logged step).

A run in progress is read as far as it got: a missing file is a note, never a crash. History
rows are read as their typed rows (`skill.rows`, `weights.rows`); every accuracy summary goes
through the one decoder, `SplitScore.from_dict` (`results.py`), which reads `EvalResult.summary()`
and every older shape; `Estimate` is the value of one metric the pages show."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from selftaught.demos import Leak
from selftaught.errors import InputError
from selftaught.evaluation import EvalResult
from selftaught.report.candidates import (
    CandidateView,
    DemoView,
    read_candidates,
    read_demo_pool,
    rules_candidate,
    split_or_note,
)
from selftaught.results import SplitScore, SummaryError
from selftaught.runs import jsonl_rows
from selftaught.skill.rows import HistoryRow, StepRow, row_from_dict
from selftaught.stats import wilson_interval
from selftaught.stops import stop_text
from selftaught.weights.rows import RestRound, RLStepRow


class ReportError(InputError):
    """A run directory that cannot be reported on (the message is one sentence)."""


_In = TypeVar("_In")
_Row = TypeVar("_Row")


# ---- shared pieces ------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """An accuracy with its 95% interval (and counts when known)."""

    value: float
    lo: float | None = None
    hi: float | None = None
    n: int | None = None
    solved: int | None = None

    @classmethod
    def of(cls, score: SplitScore, metric: str = "hard") -> Estimate:
        """`metric` of a decoded summary: hard with its counts, or soft."""
        n = score.n or None
        if metric == "soft":
            lo, hi = score.soft_ci or (None, None)
            return cls(score.soft, lo, hi, n)
        return cls(score.hard, *score.hard_ci, n, score.solved if n else None)

    def text(self) -> str:
        counts = f" ({self.solved}/{self.n})" if self.solved is not None and self.n else ""
        ci = f", 95% CI {self.lo:.3f}–{self.hi:.3f}" if self.lo is not None else ""
        return f"{self.value:.3f}{counts}{ci}"


def read_estimate(d: Any, metric: str = "hard") -> Estimate | None:
    """The `metric` (`hard`: solved share, or `soft`: mean partial credit) of one stored
    accuracy summary, of any shape the one decoder reads (`SplitScore.read`). None when there is
    none (a step with no candidate, a run still going)."""
    try:
        score = SplitScore.read(d, metric)
    except SummaryError as err:
        raise ReportError(str(err)) from err
    return Estimate.of(score, metric) if score is not None else None


def _estimate(summary: EvalResult | None, metric: str) -> Estimate | None:
    """The `metric` of a typed row's summary (None: the row stored none)."""
    return Estimate.of(summary.score(), metric) if summary is not None else None


def _typed(rows: Sequence[_In], read: Callable[[_In], _Row]) -> list[_Row]:
    """History rows as their typed rows; a summary no shape explains is a ReportError."""
    out = []
    for i, row in enumerate(rows, 1):
        try:
            out.append(read(row))
        except SummaryError as err:
            raise ReportError(str(err)) from err
        except (TypeError, ValueError) as err:
            raise ReportError(f"history.jsonl row {i} cannot be read: {err}") from err
    return out


@dataclass
class RunStatus:
    finished: bool
    text: str
    error: str | None = None


class RunReader:
    """Reads a run's files; a missing one is None (and a note when the caller says so), a
    malformed one is a ReportError naming the file (and the line, for JSONL). The live view
    (`report/live.py`) subclasses it to cache and redact what it reads."""

    def __init__(self, root: Path):
        self.root = root
        self.notes: list[str] = []

    def json(self, *parts: str) -> Any:
        path = self.root.joinpath(*parts)
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ReportError(f"{path}: malformed JSON ({err})") from err

    def jsonl(self, *parts: str) -> list[dict[str, Any]]:
        """Rows of a JSONL file. A torn last line (a kill mid-write; the trainers drop it on
        resume) is left out with a note; a malformed line before it is an error."""
        path = self.root.joinpath(*parts)
        if not path.is_file():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
        if last >= 0:
            try:
                json.loads(lines[last])
            except json.JSONDecodeError:
                self.note(f"The last line of {path.name} is incomplete and is left out.")
                lines = lines[:last]
        return [row for _, row in jsonl_rows(lines, path, ReportError)]

    def text(self, *parts: str) -> str | None:
        path = self.root.joinpath(*parts)
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


# ---- optimize (and sleep nights) ----------------------------------------------------------
@dataclass
class SkillStep:
    step: int
    epoch: int | None
    batch: Estimate | None  # the train batch, scored with the skill the step started from
    val: Estimate | None  # the candidate on val; None when the patch was empty
    decision: str
    reason: str
    parent: str  # the skill version the step's candidates were built from
    candidate: str | None
    current: str | None  # after the gate
    best: str | None
    current_val: Estimate | None  # val of the current / best skill after this step
    best_val: Estimate | None
    budget: int | None
    edits: dict[str, Any]
    usage: dict[str, dict[str, Any]]
    time_s: float | None
    val_cached: bool
    truncated: int
    candidates: list[CandidateView]  # [] in rows written before several candidates per step
    pool: list[str] | None  # versions that passed the gate so far (None: no pool recorded)
    demo_stats: dict[str, Any]  # {pool, new, leaks_refused, best}


@dataclass
class EditEvent:
    """What happened to one proposed edit, and why."""

    step: int
    op: str
    target: str
    content: str
    rationale: str
    # accepted_new_best | accepted | rejected | screened_out | outscored | dropped |
    # not_applied | invalid
    outcome: str
    reason: str


@dataclass
class Failure:
    where: str  # "test · shipped skill", "val · step 3", "train batch · step 2"
    step: int | None
    example_id: str
    reply: str
    feedback: str
    error: str | None = None
    truncated: bool = False
    trajectory: list[str] = field(default_factory=list)
    """An episode's calls with their arguments and results, then its final answer (one line
    each); empty for a one-step reply."""


def trajectory_of(value: Any) -> list[str]:
    """A row's trajectory as lines: diagnostics already hold lines; samples and rollout rows
    hold the messages (turned into lines as the analyst reads them)."""
    if not isinstance(value, list) or not value:
        return []
    if all(isinstance(v, str) for v in value):
        return list(value)
    from selftaught.rollout import Rollout, trajectory_lines

    messages = [m for m in value if isinstance(m, dict)]
    return trajectory_lines(Rollout("", [], trajectory=messages, stop="answer"), limit=400)


@dataclass
class SkillDiff:
    """A candidate against the skill it was built from: its rules as a line diff, its
    demonstrations as the ones added and removed (a JSON block diffs unreadably)."""

    step: int
    old_version: str
    new_version: str
    decision: str  # the gate's decision, or the candidate's fate (FATE_TEXT) when recorded
    old_text: str  # rules only
    new_text: str
    kind: str = ""
    why: str = ""
    demos_added: list[DemoView] = field(default_factory=list)
    demos_removed: list[DemoView] = field(default_factory=list)
    placement: tuple[str, str] | None = None  # (old, new) when the placement changed


@dataclass
class SkillRun:
    root: Path
    kind: str
    config: dict[str, Any]
    status: RunStatus
    notes: list[str]
    metric: str
    baseline: Estimate | None
    steps: list[SkillStep]
    total_steps: int | None
    test_initial: Estimate | None
    test_best: Estimate | None
    test_paired: dict[str, Any]
    best_version: str | None
    best_skill: str | None
    usage: dict[str, dict[str, Any]]
    analyst: dict[str, Any]
    edits: list[EditEvent]
    diffs: list[SkillDiff]
    failures: list[Failure]
    elapsed_s: float | None
    shipped_rules: str = ""
    shipped_demos: list[DemoView] = field(default_factory=list)
    shipped_placement: str | None = None  # None: the shipped skill has no demos
    demo_pool: list[DemoView] = field(default_factory=list)
    leaks: list[Leak] = field(default_factory=list)
    front: list[dict[str, Any]] = field(default_factory=list)  # summary.json: score vs cost


_GATE_OUTCOME = {"accept_new_best": "accepted_new_best", "accept": "accepted"}


def _skill_steps(rows: list[HistoryRow], metric: str) -> list[SkillStep]:
    baseline = _estimate(rows[0].val, metric) if rows else None
    current_val = best_val = baseline
    parent = str(rows[0].skill_version or "v0000") if rows else "v0000"
    steps: list[SkillStep] = []
    for row in rows[1:]:
        assert isinstance(row, StepRow)  # only the first row is a baseline
        gate = row.gate
        decision = gate.decision if gate is not None else "unknown"
        val = _estimate(row.val, metric)
        if val is not None and decision in _GATE_OUTCOME:
            current_val = val
            if decision == "accept_new_best":
                best_val = val
        step = int(row.step) if row.step is not None else len(steps) + 1
        # with a pool the parent is drawn from its front and recorded; before, it was the
        # previous step's current skill
        parent = str(row.parent_version or parent)
        steps.append(
            SkillStep(
                step=step,
                epoch=row.epoch,
                batch=_estimate(row.batch, metric),
                val=val,
                decision=decision,
                reason=gate.reason if gate is not None else "",
                parent=parent,
                candidate=row.skill_version,
                current=row.current_version,
                best=row.best_version,
                current_val=current_val,
                best_val=best_val,
                budget=row.budget,
                edits=_dict(row.edits),
                usage=_dict(row.usage),
                time_s=row.step_time_s,
                val_cached=bool(row.val_cached),
                truncated=row.batch.truncated if row.batch is not None else 0,
                candidates=read_candidates(step, row.candidates, gate),
                # every run with a pool records its first member: none recorded, no pool
                pool=[str(v) for v in row.pool] if row.pool else None,
                demo_stats=_dict(row.demos),
            )
        )
        parent = str(row.current_version or parent)
    return steps


def _applied_outcome(step: SkillStep) -> tuple[str, str]:
    """What became of the applied edits: their rules candidate's fate (with candidates),
    else the gate's decision on the step's single candidate."""
    if not step.candidates:
        return _GATE_OUTCOME.get(step.decision, "rejected"), step.reason
    cand = rules_candidate(step.candidates)
    if cand is None:
        return "not_applied", "no candidate was built from these edits (the rules did not change)"
    return cand.fate, f"{cand.version}: {cand.reason}"


def _edit_events(step: SkillStep, diag: dict[str, Any] | None) -> list[EditEvent]:
    def event(edit: Any, outcome: str, reason: str) -> EditEvent:
        e = _dict(edit)
        return EditEvent(
            step.step,
            str(e.get("op", "?")),
            str(e.get("target", "")),
            str(e.get("content", "")) if e else json.dumps(edit, ensure_ascii=False),
            str(e.get("rationale", "")),
            outcome,
            reason,
        )

    applied_outcome, applied_reason = _applied_outcome(step)
    if diag is None:  # only the clipped applied edits of the history row are known
        edits = step.edits.get("applied_edits", [])
        return [event(e, applied_outcome, applied_reason) for e in edits]
    events = []
    for call in diag.get("analyst_calls", []):
        call = _dict(call)
        if call.get("status") == "invalid_json":
            reply = str(call.get("raw_reply") or "")
            why = f"{call.get('kind', 'analyst')} reply was not valid JSON: {call.get('error')}"
            events.append(event({"op": "reply", "content": reply}, "invalid", why))
        for bad in call.get("invalid_edits", []):
            bad = _dict(bad)
            events.append(event(bad.get("edit"), "invalid", str(bad.get("reason", ""))))
    for dropped in diag.get("dropped", []):
        dropped = _dict(dropped)
        events.append(event(dropped.get("edit"), "dropped", str(dropped.get("why", ""))))
    for report in diag.get("edit_reports", []):
        report = _dict(report)
        status = str(report.get("status", ""))
        if status in ("applied", "fallback_append"):
            outcome = applied_outcome
            reason = applied_reason + (
                " (appended: target not found)" if status != "applied" else ""
            )
        else:
            outcome, reason = "not_applied", f"{status}: {report.get('detail', '')}".rstrip(": ")
        events.append(event(report.get("edit"), outcome, reason))
    return events


def _step_failures(step: int, diag: dict[str, Any]) -> list[Failure]:
    out = []
    for where, key, why_key in (("train batch", "batch", "feedback"), ("val", "val", "why")):
        for r in diag.get(key, []):
            r = _dict(r)
            if r.get("hard") == 1.0 and not r.get("error"):
                continue
            out.append(
                Failure(
                    f"{where} · step {step}",
                    step,
                    str(r.get("id", "?")),
                    str(r.get("reply_head") or ""),
                    str(r.get(why_key) or r.get("feedback") or r.get("why") or ""),
                    r.get("error"),
                    bool(r.get("truncated")),
                    trajectory_of(r.get("trajectory")),
                )
            )
    return out


def _skill_status(rd: RunReader, state: dict[str, Any], summary: Any, n_steps: int) -> RunStatus:
    error = _dict(rd.json("error.json"))
    total = state.get("total_steps")
    if summary is not None:
        stop = stop_text(_dict(summary).get("stopped_by"))  # max-minutes, patience, budget
        early = f", stopped early by {stop} (the same command resumes)" if stop else ""
        return RunStatus(True, f"finished: {n_steps} steps{early}")
    if error:
        cause = error.get("cause") or "unknown cause"
        text = f"stopped at {error.get('stage', '?')} after step {error.get('after_step', '?')}"
        return RunStatus(False, text, f"{error.get('backend', 'backend')}: {cause}")
    if state:
        done = state.get("step", -1)
        of = f" of {total}" if total else ""
        return RunStatus(
            False,
            f"not finished: {max(done, 0)}{of} steps done (still running, or stopped; "
            "the same command resumes it)",
        )
    return RunStatus(False, "not started: the baseline has not been evaluated yet")


_Parts = tuple[str, list[DemoView], str]  # rules, demos, placement


class _Skills:
    """skills/VERSION.md split into rules and demos, read once each."""

    def __init__(self, rd: RunReader):
        self.rd = rd
        self.cache: dict[str, _Parts | None] = {}

    def get(self, version: str) -> _Parts | None:
        if version not in self.cache:
            text = self.rd.text("skills", f"{version}.md")
            name = f"skills/{version}.md"
            self.cache[version] = None if text is None else split_or_note(text, name, self.rd.notes)
        return self.cache[version]


def _diff(step: int, old_v: str, new_v: str, old: _Parts, new: _Parts, decision: str) -> SkillDiff:
    old_ids = {d.id for d in old[1]}
    new_ids = {d.id for d in new[1]}
    return SkillDiff(
        step,
        old_v,
        new_v,
        decision,
        old[0],
        new[0],
        demos_added=[d for d in new[1] if d.id not in old_ids],
        demos_removed=[d for d in old[1] if d.id not in new_ids],
        placement=(old[2], new[2]) if old[1] and new[1] and old[2] != new[2] else None,
    )


def _step_diffs(skills: _Skills, step: SkillStep) -> list[SkillDiff]:
    """Each candidate of the step against its parent (the gated one alone in old rows)."""
    if step.candidates:
        wanted = [(c.version, c.fate, c.kind, c.why) for c in step.candidates]
    elif step.candidate:
        wanted = [(step.candidate, step.decision, "", "")]
    else:
        return []
    old = skills.get(step.parent)
    out = []
    for version, decision, kind, why in wanted:
        new = skills.get(version)
        if old is None or new is None:
            skills.rd.note(f"skills/{step.parent}.md or skills/{version}.md is missing.")
            continue
        d = _diff(step.step, step.parent, version, old, new, decision)
        d.kind, d.why = kind, why
        out.append(d)
    return out


def _step_details(
    rd: RunReader, steps: list[SkillStep]
) -> tuple[list[EditEvent], list[SkillDiff], list[Failure]]:
    """Per step, from diagnostics/ and skills/: what happened to each edit, the candidate's
    diff against the skill it was built from, and the failed examples."""
    edits: list[EditEvent] = []
    diffs: list[SkillDiff] = []
    failures: list[Failure] = []
    skills = _Skills(rd)
    missing = []
    for step in steps:
        diag = rd.json("diagnostics", f"step_{step.step:04d}.json")
        if diag is None:
            missing.append(str(step.step))
        edits += _edit_events(step, _dict(diag) if diag is not None else None)
        failures += _step_failures(step.step, _dict(diag))
        diffs += _step_diffs(skills, step)
    if missing:
        rd.note(f"No diagnostics for step(s) {', '.join(missing)}: edits and failures are partial.")
    return edits, diffs, failures


def _test_failures(rd: RunReader) -> list[Failure]:
    """The shipped skill's failures on test (test_rollouts.jsonl, written after the last step)."""
    return [
        Failure(
            "test · shipped skill",
            None,
            str(r.get("id", "?")),
            str(r.get("reply_head") or ""),
            str(r.get("why") or ""),
            r.get("error"),
            bool(r.get("truncated")),
            trajectory_of(r.get("trajectory")),
        )
        for r in rd.jsonl("test_rollouts.jsonl")
        if r.get("skill") == "best" and (r.get("hard") != 1.0 or r.get("error"))
    ]


def load_skill_run(root: Path, kind: str = "optimize") -> SkillRun:
    """An `optimize` run directory (or anything with its layout: a sleep night's staging)."""
    rd = RunReader(root)
    return skill_run_from(rd, rd.jsonl("history.jsonl"), kind)


def skill_run_from(
    rd: RunReader, rows: list[dict[str, Any]], kind: str = "optimize", *, details: bool = True
) -> SkillRun:
    """A skill run from its history `rows` and the small files `rd` reads. Without
    `details`, no per-step file (diagnostics/, skills/, test rollouts, demo pool) is read:
    what the live view needs (steps, curve, status, usage) at the cost of a few small files."""
    config = _dict(rd.json("config.json"))
    state = _dict(rd.json("state.json"))
    summary = rd.json("summary.json")
    test = _dict(rd.json("test_results.json"))
    gate_metric = _dict(config.get("gate")).get("metric") or config.get("gate_metric")
    metric = "soft" if gate_metric == "soft" else "hard"
    if gate_metric == "mixed":
        rd.note("The gate used the mixed metric; the curves show hard accuracy.")
    if not config:
        rd.note("config.json is missing: the run's settings are unknown.")
    if not rows:
        rd.note("No step has finished yet (history.jsonl is missing or empty).")
    typed = _typed(rows, row_from_dict)
    steps = _skill_steps(typed, metric)
    status = _skill_status(rd, state, summary, len(steps))
    if not test:
        if status.finished and config.get("evaluate_test") is False:
            rd.note("The test split was not evaluated (evaluate_test is off).")
        else:
            rd.note("No test results yet: the test split is evaluated after the last step.")

    edits, diffs, failures = _step_details(rd, steps) if details else ([], [], [])
    failures = (_test_failures(rd) if details else []) + failures
    best_version = state.get("best_version") or (steps[-1].best if steps else None)
    summary_d = _dict(summary)
    best_skill = rd.text("best_skill.md") if details else None
    shipped: _Parts = ("", [], "turns")
    if best_skill is not None:
        shipped = split_or_note(best_skill, "best_skill.md", rd.notes)
    pool, leaks = read_demo_pool(rd.json("demo_pool.json") if details else None, rd.notes)
    return SkillRun(
        root=rd.root,
        kind=kind,
        config=config,
        status=status,
        notes=rd.notes,
        metric=metric,
        baseline=_estimate(typed[0].val, metric) if typed else None,
        steps=steps,
        total_steps=state.get("total_steps"),
        test_initial=read_estimate(test.get("initial"), metric),
        test_best=read_estimate(test.get("best"), metric),
        test_paired=_dict(test.get("paired")),
        best_version=best_version,
        best_skill=best_skill,
        usage=_dict(summary_d.get("usage") or state.get("usage")),
        analyst=_dict(summary_d.get("analyst") or state.get("parse")),
        edits=edits,
        diffs=diffs,
        failures=failures,
        elapsed_s=summary_d.get("elapsed_s", state.get("elapsed_s")),
        shipped_rules=shipped[0],
        shipped_demos=shipped[1],
        shipped_placement=shipped[2] if shipped[1] else None,
        demo_pool=pool,
        leaks=leaks,
        front=[p for p in summary_d.get("front") or [] if isinstance(p, dict)],
    )


def load_sleep_night(root: Path) -> SkillRun:
    """A sleep night's staging folder: its skill phase is an `optimize` run directory at the
    folder's root; the night's status, reason, memory phase and notes come first as notes."""
    run = load_skill_run(root, kind="sleep")
    run.notes[:0] = night_notes(RunReader(root))
    return run


def night_notes(rd: RunReader) -> list[str]:
    """What a night's report.json says beyond its skill phase: status, reason, memory phase
    and the night's own notes."""
    night = _dict(rd.json("report.json"))
    notes = [
        f"Night {night.get('night')} of project {night.get('project')}: "
        f"{night.get('status')} — {night.get('reason') or 'no reason recorded'}."
    ]
    memory = _dict(_dict(night.get("phases")).get("memory"))
    if memory.get("ran"):
        before = read_estimate(memory.get("val_initial"))
        after = read_estimate(memory.get("val_best"))
        notes.append(
            f"Memory phase (memory/): val {before.text() if before else '?'} → best "
            f"{after.text() if after else '?'}; decisions {memory.get('decisions') or {}}."
        )
    elif memory:
        why = stop_text(memory.get("stopped_by")) or memory.get("error")
        notes.append(f"Memory phase did not run: {why}.")
    notes += [str(n) for n in night.get("notes") or []]
    return notes


# ---- train: ReST-EM / SFT -------------------------------------------------------------------
@dataclass
class Round:
    round: int
    label: str
    trained: bool
    reason: str
    samples: int | None
    sample_solved: Estimate | None  # share of the round's samples the task scored solved
    sample_truncated: float | None
    elite: dict[str, Any]
    train: dict[str, Any]
    val: Estimate | None
    test: Estimate | None
    best_round: int
    new_best: bool
    seconds: float | None


@dataclass
class RestRun:
    root: Path
    method: str
    config: dict[str, Any]
    status: RunStatus
    notes: list[str]
    metric: str
    rounds: list[Round]
    total_rounds: int | None
    best_round: int | None
    base_test: Estimate | None
    shipped_test: Estimate | None
    shipped: str | None
    failures: list[Failure] = field(default_factory=list)
    """The last sampled round's unsolved episodes (tool tasks), with their trajectories."""


def _rest_failures(rd: RunReader, rounds: list[Round]) -> list[Failure]:
    """Unsolved sampled episodes of the last round that sampled (one-step samples: none,
    their replies are in samples.jsonl)."""
    sampled = [r.round for r in rounds if r.samples]
    if not sampled:
        return []
    last = sampled[-1]
    return [
        Failure(
            f"samples · round {last}",
            last,
            str(row.get("example_id", "?")),
            str(row.get("completion") or ""),
            str(row.get("feedback") or ""),
            None,
            bool(row.get("truncated")),
            trajectory_of(row.get("trajectory")),
        )
        for row in rd.jsonl("rounds", str(last), "samples.jsonl")
        if row.get("trajectory") and row.get("hard") != 1.0
    ]


def _rest_round(row: RestRound, metric: str, best_before: int) -> Round:
    r, samples, share = row.round, row.samples, row.sample_solved
    solved = None
    if samples and share is not None:
        k = round(share * samples)
        lo, hi = wilson_interval(k, samples)
        solved = Estimate(share, lo, hi, samples, k)
    best_round = row.best_round if row.best_round is not None else (best_before if r else 0)
    return Round(
        round=r,
        label=str(row.model or ("base" if r == 0 else f"round {r}")),
        trained=row.trained,
        reason=str(row.reason or ""),
        samples=samples,
        sample_solved=solved,
        sample_truncated=row.sample_truncated,
        elite=dict(row.elite or {}),
        train=row.train.to_dict() if row.train is not None else {},
        val=_estimate(row.val, metric),
        test=_estimate(row.test, metric),
        best_round=best_round,
        new_best=r > 0 and best_round == r,
        seconds=row.seconds,
    )


def load_rest_run(root: Path) -> RestRun:
    rd = RunReader(root)
    return rest_run_from(rd, rd.jsonl("history.jsonl"))


def rest_run_from(rd: RunReader, rows: list[dict[str, Any]], *, details: bool = True) -> RestRun:
    """A ReST / SFT run from its history `rows` and small files (`details`: the last round's
    unsolved samples too)."""
    config = _dict(rd.json("config.json"))
    rest = _dict(config.get("rest"))
    backend = _dict(rest.get("backend")).get("backend")
    metric = (
        "soft"
        if str(config.get("task", "")).startswith("game:") or backend == "scratch"
        else "hard"
    )
    state = _dict(rd.json("state.json"))
    result = _dict(rd.json("result.json"))
    if not rows:
        rd.note("No round has finished yet (history.jsonl is missing or empty).")
    rounds: list[Round] = []
    best = 0
    for row in _typed(rows, RestRound.from_dict):
        rounds.append(_rest_round(row, metric, best))
        best = rounds[-1].best_round
    total = rest.get("rounds")
    if result:
        status = RunStatus(
            True, f"finished: {len(rounds) - 1} rounds, shipped {result.get('shipped')}"
        )
    else:
        done = state.get("completed_round")
        status = RunStatus(
            False,
            f"not finished: {done if done is not None else 'no'} of {total or '?'} rounds done "
            "(still running, or stopped; the same command resumes it)",
        )
        rd.note("No result.json yet: the shipped model's test accuracy comes at the end.")
    return RestRun(
        root=rd.root,
        method=str(config.get("method") or "rest"),
        config=config,
        status=status,
        notes=rd.notes,
        metric=metric,
        rounds=rounds,
        total_rounds=total,
        best_round=result.get("best_round", state.get("best_round")),
        base_test=read_estimate(result.get("base_test") or state.get("base_test"), metric),
        shipped_test=read_estimate(result.get("shipped_test"), metric),
        shipped=result.get("shipped"),
        failures=_rest_failures(rd, rounds) if details else [],
    )


# ---- train: GRPO / GSPO ---------------------------------------------------------------------
@dataclass
class RLStep:
    step: int
    values: dict[str, float]  # reward, reward_std, kl, completion_length, truncated, ...
    all_rewards_equal: bool
    warnings: list[str]


@dataclass
class RLRun:
    root: Path
    method: str
    config: dict[str, Any]
    status: RunStatus
    notes: list[str]
    steps: list[RLStep]
    total_steps: int | None
    base_val: Estimate | None
    trained_val: Estimate | None
    base_test: Estimate | None
    shipped_test: Estimate | None
    shipped: str | None
    step_seconds: float | None


def load_rl_run(root: Path) -> RLRun:
    rd = RunReader(root)
    return rl_run_from(rd, rd.jsonl("history.jsonl"))


def rl_run_from(rd: RunReader, rows: list[dict[str, Any]]) -> RLRun:
    """A GRPO / GSPO run from its history `rows` (one per logged step) and small files."""
    config = _dict(rd.json("config.json"))
    rl = _dict(config.get("rl"))
    state = _dict(rd.json("state.json"))
    result = _dict(rd.json("result.json"))
    typed = _typed(list(enumerate(rows)), lambda ir: RLStepRow.from_dict(ir[1], ir[0]))
    steps = [RLStep(s.step, dict(s.metrics), s.all_rewards_equal, list(s.warnings)) for s in typed]
    if not steps:
        rd.note("No training step has been logged yet (history.jsonl is missing or empty).")
    total = rl.get("steps")
    if result:
        status = RunStatus(
            True, f"finished: {len(steps)} steps, shipped the {result.get('shipped')} model"
        )
    else:
        status = RunStatus(
            False,
            f"not finished: {len(steps)} of {total or '?'} steps logged (still running, or "
            "stopped; the same command resumes it)",
        )
        rd.note("No result.json yet: the trained model is evaluated on val and test at the end.")

    def est(key: str) -> Estimate | None:
        return read_estimate(result.get(key) or state.get(key))

    return RLRun(
        root=rd.root,
        method=str(config.get("method") or rl.get("method") or "grpo"),
        config=config,
        status=status,
        notes=rd.notes,
        steps=steps,
        total_steps=total,
        base_val=est("base_val"),
        trained_val=est("trained_val"),
        base_test=est("base_test"),
        shipped_test=read_estimate(result.get("shipped_test")),
        shipped=result.get("shipped"),
        step_seconds=result.get("step_seconds", state.get("step_seconds")),
    )


# ---- detection ------------------------------------------------------------------------------
Run = SkillRun | RestRun | RLRun

ADAPTERS: dict[str, Callable[[Path], Run]] = {
    "optimize": load_skill_run,
    "sleep": load_sleep_night,
    "rest": load_rest_run,
    "rl": load_rl_run,
}


def _first_row(root: Path) -> dict[str, Any]:
    rows = RunReader(root).jsonl("history.jsonl")
    return rows[0] if rows else {}


def detect_kind(root: Path) -> str:
    """The adapter for `root`: from config.json when it says, else from the files present."""
    if not root.exists():
        raise ReportError(f"run directory {root} does not exist")
    if not root.is_dir():
        raise ReportError(f"{root} is not a directory; give the run directory")
    if _dict(RunReader(root).json("report.json")).get("kind") == "sleep-night":
        return "sleep"
    config = _dict(RunReader(root).json("config.json"))
    method = config.get("method")
    if method in ("rest", "sft") or "rest" in config:
        return "rest"
    if method in ("grpo", "gspo") or "rl" in config:
        return "rl"
    if "optimizer_model" in config or "gate_metric" in config or "gate" in config:
        return "optimize"
    if (root / "skills").is_dir() or (root / "best_skill.md").is_file():
        return "optimize"
    if (root / "rounds").is_dir():
        return "rest"
    row = _first_row(root)
    if "stage" in row:
        return "optimize"
    if "round" in row:
        return "rest"
    if "reward" in row:
        return "rl"
    raise ReportError(
        f"{root} is not a run directory of optimize or train (no config.json, history.jsonl "
        "or skills/ of a known kind)"
    )


def load_run(root: str | Path) -> Run:
    root = Path(root)
    return ADAPTERS[detect_kind(root)](root)
