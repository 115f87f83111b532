"""Probation: each adopted version watched on live traffic, against the version before it.

The proxy logs which version served every request: `skill_version` is the adopted version
number (one number covers skill, memory and adapter: `versions/<N>/`), `staged:<night>` a
staged proposal tried on live traffic before adoption (`selftaught proxy --canary-share`). A
proxy row without one was served with nothing adopted: version 0.

Each logged interaction has an OUTCOME, 1 (a success), 0 (a failure) or none:

1. a correction (a feedback `reference`) → the reply scored against it by the reference
   check the night uses (`tasks.scorers.score_reference`; on a request with tools, a corrected
   tool call must be among the reply's calls): solved → 1, else 0;
2. else a thumb: up → 1, down → 0;
3. else a score: >= 0.5 → 1, else 0;
4. else a reference logged with the request → scored as a correction;
5. else none.

Feedback an end user gave (through the proxy, without its feedback key: untrusted) is read
only with `ProbationConfig.untrusted`; by default such a row counts as one without feedback.

A failed call (an error) is never an outcome; it is counted apart. A shadow answer (the
staged proposal's answer to a request the adopted version served, `shadow_of`) is scored
against the served row's correction or logged reference (the right answer to the same
request); when its reply is the served reply word for word, it has the served row's outcome.
A thumb on a reply the user saw says nothing about one they did not.

Rows whose interaction fed a night that produced a version (the train or val split of its
`tasks.jsonl`: trained or gated on) are left out, so versions are compared on traffic none
of them was trained on. The current version is compared with the version it replaced
(`versions/<N>/meta.json` `replaced`); a staged proposal tried on live traffic with the
adopted version. Each side: the success rate with its Wilson interval; their difference
with Newcombe's hybrid score interval. Verdict: `too_few` (a side has fewer than
`min_outcomes` outcomes), `drop` (the difference's interval lies wholly below 0), else `ok`.
With `auto_rollback` a drop rolls back to the version replaced (`maybe_roll_back`), recorded
as an `auto_rollback` event with the statistics in events.jsonl.

A project's many skills (`adoption/skill_units.py`) are each on probation on their own
(`skill_probations`): the proxy logs which skill and version served each request
(`meta["skill_route"]`), so skill S's version N is tallied on the rows routed to S at version
N, and compared with the version it replaced on the rows routed to S at that version. When
it replaced version 0 (S was new), that side is the rows served with no skill that the
router, with the skills adopted now, sends to S: the requests S serves now, served without
it. A drop rolls back S alone (an `auto_rollback` event in S's unit).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from selftaught.errors import ConfigError, SelftaughtError
from selftaught.sleep.adoption import staging
from selftaught.sleep.intake.log import Feedback, Interaction, LogFilter, TaskLog
from selftaught.sleep.paths import Owner, Unit, as_unit
from selftaught.stats import newcombe_interval, wilson_interval, z_for

STAGED = "staged:"  # the prefix of a staged proposal's version label
Verdict = Literal["too_few", "ok", "drop"]
TRAINED_SPLITS = ("train", "val")


@dataclass
class ProbationConfig:
    """When a version's live record is judged, and how surely."""

    min_outcomes: int = 20
    """Outcomes (feedback, or a reference, on a reply) each version needs before a verdict."""
    confidence: float = 0.99
    """Confidence of the intervals: each version's success rate and their difference. 0.99
    by measurement (`bench_probation.py`): checked after every feedback, 0.95 rolled back an
    equally good version in 10.6% of simulated deployments, 0.99 in 2.9%, and still flagged
    a 0.8 → 0.5 drop after a median 45 requests (42 at 0.95)."""
    untrusted: bool = False
    """Count end users' feedback too (feedback through the proxy without its --feedback-key).
    Off by default: one client's thumbs could otherwise roll back a good version. A row whose
    feedback mixes in any end user's value counts as a row without feedback."""

    def __post_init__(self) -> None:
        if isinstance(self.min_outcomes, bool) or int(self.min_outcomes) < 1:
            raise ConfigError(f"min_outcomes must be >= 1, got {self.min_outcomes}")
        if not 0.5 <= self.confidence < 1.0:
            raise ConfigError(f"confidence must be in [0.5, 1), got {self.confidence}")


# ---- outcomes -------------------------------------------------------------------------------


def _solved(reply: str, reference: Any) -> bool | None:
    """The night's reference check on a reply (None: the reference is empty or unusable)."""
    from selftaught.tasks.base import Example
    from selftaught.tasks.scorers import reference_scorer, score_reference

    if isinstance(reference, list):
        reference = [r for r in reference if r is not None and str(r).strip()] or None
    if reference is None or not str(reference).strip():
        return None
    try:
        scorer = reference_scorer(reference)
        score = score_reference(reply, Example("probation", "", reference), scorer)
    except SelftaughtError:
        return None
    return score.hard >= 1


def reference_outcome(it: Interaction, reference: Any) -> int | None:
    """1 when the row's reply passes `reference` (a corrected answer, or on a request with
    tools a corrected tool call, see `sleep.night.replay`), 0 when not, None when unusable."""
    from selftaught.sleep.intake.threads import (
        call_key,
        call_parts,
        logged_tool_calls,
        logged_tools,
        tool_feedback,
    )

    if logged_tools(it) is not None:
        corrected = tool_feedback(reference)
        if corrected is not None:
            made = {
                call_key(*parts)
                for call in logged_tool_calls(it)
                if (parts := call_parts(call)) is not None
            }
            calls = all(call_key(c["name"], c["arguments"]) in made for c in corrected.calls)
            answer = None if corrected.answer is None else _solved(it.reply or "", corrected.answer)
            if not corrected.calls and answer is None:
                return None
            return int(calls and answer is not False)
    solved = _solved(it.reply or "", reference)
    return None if solved is None else int(solved)


def outcome(it: Interaction) -> int | None:
    """The row's outcome by the rules of the module docstring (None: no outcome)."""
    if it.error is not None:
        return None
    fb = it.feedback
    if fb.reference is not None:
        return reference_outcome(it, fb.reference)
    if fb.thumb is not None:
        return int(fb.thumb == "up")
    if fb.score is not None:
        return int(fb.score >= 0.5)
    if it.reference is not None:
        return reference_outcome(it, it.reference)
    return None


def shadow_outcome(shadow: Interaction, served: Interaction | None) -> int | None:
    """A shadow answer's outcome, from what the user said about the served one."""
    if served is None or shadow.error is not None:
        return None
    reference = served.effective_reference
    if reference is not None:
        return reference_outcome(shadow, reference)
    same = shadow.reply is not None and (shadow.reply or "").strip() == (served.reply or "").strip()
    return outcome(served) if same and not shadow.tool_calls and not served.tool_calls else None


def served_by(it: Interaction) -> str | None:
    """The version label that answered `it` (None: not served through the proxy)."""
    if it.skill_version:
        return it.skill_version
    return "0" if it.source == "proxy" else None


# ---- tallies and comparisons -------------------------------------------------------------


@dataclass
class Tally:
    """One version's live record."""

    version: str
    requests: int = 0  # requests it answered for the client (errors and left-out rows too)
    shadow: int = 0  # shadow answers logged for it (never returned)
    excluded: int = 0  # rows left out: they fed a night that produced a version
    errors: int = 0
    outcomes: int = 0
    successes: int = 0
    rate: float | None = None
    interval: tuple[float, float] = (0.0, 1.0)

    def close(self, z: float) -> None:
        self.rate = self.successes / self.outcomes if self.outcomes else None
        self.interval = wilson_interval(self.successes, self.outcomes, z)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "interval": list(self.interval)}

    def describe(self) -> str:
        if self.rate is None:
            return "no outcomes yet"
        lo, hi = self.interval
        return f"{self.rate:.2f} ({self.successes}/{self.outcomes}, CI {lo:.2f}–{hi:.2f})"


@dataclass
class Comparison:
    """A version against the one before it (or a staged proposal against the adopted one)."""

    kind: Literal["adopted", "staged"]
    new: Tally
    old: Tally
    diff: float | None  # new rate - old rate
    interval: tuple[float, float]  # of the difference (Newcombe)
    verdict: Verdict
    min_outcomes: int
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "new": self.new.to_dict(),
            "old": self.old.to_dict(),
            "diff": self.diff,
            "interval": list(self.interval),
            "verdict": self.verdict,
            "min_outcomes": self.min_outcomes,
            "confidence": self.confidence,
        }

    def line(self) -> str:
        """One line for people: the two sides, the difference, the verdict."""
        new, old = _name(self.new.version), _name(self.old.version)
        text = f"{new} vs {old}: {self.new.describe()} vs {self.old.describe()}"
        if self.diff is not None:
            lo, hi = self.interval
            text += f"; difference {self.diff:+.2f} (CI {lo:+.2f} to {hi:+.2f})"
        if self.verdict == "too_few":
            return text + (
                f": too few outcomes to judge (each side needs {self.min_outcomes}; a thumb, "
                "a score or a corrected answer gives one)"
            )
        return text + f": {self.verdict}"


def _name(label: str) -> str:
    if label.startswith(STAGED):
        return f"staged night {label[len(STAGED) :]}"
    return f"version {label}"


def compare(
    kind: Literal["adopted", "staged"], new: Tally, old: Tally, config: ProbationConfig
) -> Comparison:
    z = z_for(config.confidence)
    diff = None
    interval = (-1.0, 1.0)
    if new.outcomes and old.outcomes:
        diff = new.successes / new.outcomes - old.successes / old.outcomes
        interval = newcombe_interval(new.successes, new.outcomes, old.successes, old.outcomes, z)
    verdict: Verdict = "ok"
    if min(new.outcomes, old.outcomes) < config.min_outcomes:
        verdict = "too_few"
    elif interval[1] < 0:
        verdict = "drop"
    return Comparison(
        kind, new, old, diff, interval, verdict, config.min_outcomes, config.confidence
    )


@dataclass
class Lineage:
    """What the tallies are compared by: the current version, the one it replaced, the staged
    proposals still waiting, and the interactions some version was trained or gated on."""

    current: str
    replaced: str | None = None
    staged: tuple[str, ...] = ()
    trained: frozenset[str] = frozenset()

    def labels(self) -> tuple[str | None, ...]:
        """The `skill_version` values the comparisons read (None: version 0)."""
        wanted = [self.current, self.replaced, *self.staged]
        return tuple({None if v in (None, "0") else v for v in wanted})


@dataclass
class Probation:
    """Every version's tally and the verdicts (`adopted`: the current version vs the one it
    replaced; `staged`: each staged proposal tried on live traffic vs the current one)."""

    project: str
    current: str
    tallies: list[Tally]
    adopted: Comparison | None
    staged: list[Comparison] = field(default_factory=list)
    config: ProbationConfig = field(default_factory=ProbationConfig)
    left_out_ids: int = 0  # interactions some version was trained or gated on
    skill: str | None = None  # one of the project's many skills (None: the project's own)

    @property
    def drop(self) -> bool:
        return self.adopted is not None and self.adopted.verdict == "drop"

    @property
    def unit(self) -> Unit:
        return Unit(self.project, self.skill)

    def to_dict(self) -> dict[str, Any]:
        return {
            "project": self.project,
            "skill": self.skill,
            "current": self.current,
            "config": asdict(self.config),
            "left_out_ids": self.left_out_ids,
            "versions": [t.to_dict() for t in self.tallies],
            "adopted": self.adopted.to_dict() if self.adopted else None,
            "staged": [c.to_dict() for c in self.staged],
        }


def _order(label: str) -> tuple[int, int, str]:
    return (1, 0, label) if not label.isdigit() else (0, int(label), "")


def _counted(it: Interaction, config: ProbationConfig) -> Interaction:
    """`it` as probation reads it: only the thumb and score the operator gave, unless
    `config.untrusted` (then every one)."""
    fb = it.feedback
    if config.untrusted or (fb.trusted_for("thumb") and fb.trusted_for("score")):
        return it
    thumb = fb.thumb if fb.trusted_for("thumb") else None
    score = fb.score if fb.trusted_for("score") else None
    return replace(it, feedback=Feedback(thumb=thumb, score=score))


def evaluate(
    rows: Iterable[Interaction],
    lineage: Lineage,
    config: ProbationConfig | None = None,
    project: str = "",
    served: Callable[[Interaction], str | None] = served_by,
    skill: str | None = None,
) -> Probation:
    """The tallies and verdicts of one project's rows (pure: reads nothing else); `served`
    labels each row with the version that answered it (None: not counted), `skill_served`'s
    for one of its skills."""
    config = config or ProbationConfig()
    rows = list(rows)
    by_id = {it.id: it for it in rows}
    tallies: dict[str, Tally] = {}
    for it in rows:
        label = served(it)
        if label is None:
            continue
        t = tallies.setdefault(label, Tally(label))
        if it.shadow_of is None:
            t.requests += 1
        else:
            t.shadow += 1
        if it.id in lineage.trained or it.shadow_of in lineage.trained:
            t.excluded += 1
            continue
        if it.error is not None:
            t.errors += 1
            continue
        if it.shadow_of is None:
            result = outcome(_counted(it, config))
        else:
            served_row = by_id.get(it.shadow_of)  # not `served`: that names the labeller
            result = shadow_outcome(it, served_row and _counted(served_row, config))
        if result is not None:
            t.outcomes += 1
            t.successes += result
    z = z_for(config.confidence)
    for label in {lineage.current, lineage.replaced, *lineage.staged} - {None}:
        tallies.setdefault(str(label), Tally(str(label)))
    for t in tallies.values():
        t.close(z)
    current = tallies[lineage.current]
    adopted = None
    if lineage.replaced is not None and lineage.replaced != lineage.current:
        adopted = compare("adopted", current, tallies[lineage.replaced], config)
    staged = [
        compare("staged", tallies[s], current, config)
        for s in lineage.staged
        if tallies[s].requests + tallies[s].shadow
    ]
    ordered = [tallies[k] for k in sorted(tallies, key=_order)]
    return Probation(
        project, lineage.current, ordered, adopted, staged, config, len(lineage.trained), skill
    )


def skill_served(
    name: str, routes_to: Callable[[Interaction], str | None] | None = None
) -> Callable[[Interaction], str | None]:
    """The label of a row for skill `name`'s probation: the version of `name` that served it
    (`meta["skill_route"]`); "0" for a row served with no skill that `routes_to` (the router
    over the skills adopted now) sends to `name`; else None (not its row)."""
    from selftaught.sleep.adoption.skill_units import SkillRoute

    def label(it: Interaction) -> str | None:
        if it.source != "proxy":
            return None
        logged = SkillRoute.from_dict((it.meta or {}).get("skill_route"))
        if logged is not None and logged.route.skill is not None:
            return str(logged.version) if logged.route.skill == name else None
        if routes_to is not None and it.shadow_of is None and routes_to(it) == name:
            return "0"
        return None

    return label


# ---- reading a project -----------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _trained_in(path: Path, _stamp: tuple[int, int]) -> frozenset[str]:
    ids: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            row = json.loads(line)
            if row.get("split") in TRAINED_SPLITS:
                ids.update(str(s) for s in row.get("sources") or [])
    return frozenset(ids)


def trained_ids(night_dir: Path) -> frozenset[str]:
    """The interactions a night trained or gated on (its train and val tasks' sources)."""
    path = night_dir / "tasks.jsonl"
    try:
        st = path.stat()
    except OSError:
        return frozenset()
    return _trained_in(path, (st.st_mtime_ns, st.st_size))


def read_lineage(project: Owner, home: Path | None = None) -> Lineage:
    """The unit's current version, the one it replaced, the staged proposals waiting (the
    project's own, for a canary), and every interaction a version's night (adopted or
    staged) trained or gated on."""
    unit = as_unit(project)
    current = staging.current_version(project, home)
    nights = staging.nights_dir(unit.project, home)
    trained: set[str] = set()
    replaced = None
    for row in staging.history(project, home)[1:]:
        if row.get("night"):
            trained |= trained_ids(nights / str(row["night"]))
        if row["version"] == current and row.get("replaced") is not None:
            replaced = str(row["replaced"])
    staged = []
    for path, night in staging.list_nights(unit.project, home) if unit.skill is None else ():
        if night.status == "staged":
            staged.append(STAGED + path.name)
            trained |= trained_ids(path)
    return Lineage(str(current), replaced, tuple(staged), frozenset(trained))


def probation_for(
    project: str,
    log: TaskLog,
    *,
    home: Path | None = None,
    config: ProbationConfig | None = None,
    narrow: bool = False,
) -> Probation:
    """A project's probation from its log. `narrow`: read only the rows of the versions
    compared (the proxy's background check), not every version's."""
    lineage = read_lineage(project, home)
    flt = LogFilter(project=project, newest_first=False)
    if narrow:
        flt.skill_versions = lineage.labels()
    return evaluate(log.query(flt), lineage, config, project)


def skill_probations(
    project: str,
    log: TaskLog,
    *,
    home: Path | None = None,
    config: ProbationConfig | None = None,
) -> list[Probation]:
    """The probation of each of the project's adopted skills (see the module doc), from one
    read of its rows."""
    from selftaught.sleep.adoption.inject import request_text
    from selftaught.sleep.adoption.skill_units import adopted_skills, project_router

    skills = adopted_skills(project, home)
    if not skills:
        return []
    router = project_router(project, home, skills)
    memo: dict[str, str | None] = {}

    def routes_to(it: Interaction) -> str | None:
        if it.id not in memo:
            memo[it.id] = router.route(request_text(it.messages)).skill
        return memo[it.id]

    rows = list(log.query(LogFilter(project=project, newest_first=False)))
    out = []
    for skill in skills:
        unit = Unit(project, skill.name)
        lineage = read_lineage(unit, home)
        served = skill_served(skill.name, routes_to)
        out.append(evaluate(rows, lineage, config, project, served, skill.name))
    return out


# ---- acting on a drop -------------------------------------------------------------------------


def _brought_back(project: Owner, version: int, home: Path | None) -> bool:
    """The user adopted `version` again after an automatic rollback took it away: their call
    stands (warned, not rolled back again)."""
    rows = staging.events(project, home)
    last = max(
        (i for i, e in enumerate(rows) if e.get("event") == "auto_rollback"
         and e.get("previous") == version),
        default=None,
    )  # fmt: skip
    if last is None:
        return False
    return any(e.get("version") == version for e in rows[last + 1 :])


AUTO_ROLLBACK = "auto_rollback"  # a version's meta.json `probation`: rolled back unasked


def auto_rollback_on(project: Owner, version: int, home: Path | None = None) -> bool:
    """Whether `version` is on probation with auto-rollback whoever watches it: adopted from
    a night that held out no val (`--no-val`), it was never checked before going live."""
    return staging.version_meta(project, version, home).get("probation") == AUTO_ROLLBACK


def maybe_roll_back(
    project: Owner,
    result: Probation,
    *,
    home: Path | None = None,
    by: str = "cli",
    asked: bool = True,
) -> staging.Adoption | None:
    """On a drop, roll back to the version replaced and record an `auto_rollback` event with
    the statistics; None when there is no drop, the adopted version changed since `result`
    was measured, or the user brought the version back after an earlier automatic rollback.
    `asked` False (no --auto-rollback): only a version on probation with auto-rollback by
    default (`auto_rollback_on`) is rolled back."""
    comp = result.adopted
    if comp is None or comp.verdict != "drop" or not comp.old.version.isdigit():
        return None
    version, target = int(comp.new.version), int(comp.old.version)
    if not asked and not auto_rollback_on(project, version, home):
        return None
    # checked again here: an adopt since the tallies were read must not be undone
    if staging.current_version(project, home) != version or _brought_back(project, version, home):
        return None
    from selftaught.sleep.adoption.write_back import rollback_unit

    done = rollback_unit(project, target, home=home)  # a user's file written back: restored
    staging.record_event(
        project,
        {
            "event": "auto_rollback",
            "version": target,
            "previous": version,
            "by": by,
            "probation": comp.to_dict(),
        },
        home,
    )
    return done


# ---- what people read -------------------------------------------------------------------------


def status_lines(result: Probation, project: str) -> list[str]:
    """`sleep status`: the probation line(s), and a WARNING on a drop."""
    head = "probation" if result.skill is None else f"probation of skill {result.skill}"
    of = "" if result.skill is None else f" of skill {result.skill}"
    if result.adopted is None:
        what = "nothing adopted" if result.current == "0" else "no earlier version recorded"
        lines = [f"  {head}: {what}, nothing to compare"]
    else:
        lines = [f"  {head}: {result.adopted.line()}"]
    if result.drop and result.adopted is not None:
        new, old = result.adopted.new.version, result.adopted.old.version
        flag = "" if result.skill is None else f" --skill {result.skill}"
        lines.append(
            f"  WARNING: version {new}{of} does worse than version {old} on live traffic (the "
            f"{result.config.confidence:.0%} interval of the difference is below 0): "
            f"`selftaught sleep rollback {old} --project {project}{flag}` returns to it (the "
            "proxy's --auto-rollback does it by itself)"
        )
    for comp in result.staged:
        lines.append(f"  canary: {comp.line()}")
        if comp.verdict == "drop":
            lines.append(
                f"  WARNING: {_name(comp.new.version)} does worse than the adopted version on "
                "live traffic; do not adopt it"
            )
    return lines


def version_table(result: Probation) -> Any:
    """`sleep probation`: one row per version (a shadow column when a canary logged any)."""
    from rich import box
    from rich.table import Table

    marks = {result.current: "current"}
    if result.adopted is not None:
        marks[result.adopted.old.version] = "replaced"
    shadow = any(t.shadow for t in result.tallies)
    table = Table(title=f"probation of {result.project}", box=box.SIMPLE_HEAD, pad_edge=False)
    columns = ["version", "served", *(["shadow"] if shadow else []), "errors", "left out"]
    columns += ["outcomes", "rate", f"{result.config.confidence:.0%} CI", ""]
    for column in columns:
        justify: Literal["left", "right"] = "left" if column in ("version", "") else "right"
        table.add_column(column, justify=justify, no_wrap=True)
    for t in result.tallies:
        lo, hi = t.interval
        table.add_row(
            t.version,
            str(t.requests),
            *([str(t.shadow)] if shadow else []),
            str(t.errors),
            str(t.excluded),
            str(t.outcomes),
            "—" if t.rate is None else f"{t.rate:.2f}",
            f"{lo:.2f}–{hi:.2f}",
            marks.get(t.version, "staged" if t.version.startswith(STAGED) else ""),
        )
    return table
