"""A night's report.md and diagnostics.json, read from its staging folder.

diagnostics.json answers "why did this night learn nothing?" without rerunning it: per val
task the score before and after (hard, soft, reply head, why), every analyst reply as it came
back (raw), every backend call error, and the reason no edit was proposed or kept.
Everything in it went through redaction.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from selftaught.record import Record, plain
from selftaught.results import SplitScore
from selftaught.runs import RunDir, atomic_write_json, atomic_write_text
from selftaught.skill.rows import StepRow, row_from_dict
from selftaught.sleep.night.checks import describe_checks
from selftaught.sleep.night.dream import dream_lines
from selftaught.sleep.night.evidence import EvidenceLog, redact_tree
from selftaught.sleep.night.mine import NO_CHECK, MinedTask
from selftaught.sleep.night.weak import weak_lines
from selftaught.sleep.records import (
    BudgetRecord,
    DemoModesRecord,
    DemoShape,
    GateMode,
    KindRecord,
    LateDuplicate,
    MinerRecord,
    MiningRecord,
    NightPower,
    PhaseRecord,
    ProofreadRecord,
    RecallRecord,
    SkillRecord,
    Summary,
    ValPairRecord,
    WeightDataRecord,
    WeightsRecord,
    WindowRecord,
    given,
)
from selftaught.sleep.result import NightResult
from selftaught.stops import StopReason, StopRecord, stop_text

_R = TypeVar("_R", bound=Record)


def task_row(task: MinedTask) -> dict[str, Any]:
    """A mined task as tasks.jsonl shows it (already redacted by the miner)."""
    head = " ".join(task.prompt.split())
    return {
        "id": task.id,
        "split": task.split,
        "checks": describe_checks(task.state),
        "reference": task.reference,
        "negative_feedback": task.negative,
        "sources": task.sources,
        "origins": task.origins,
        "clients": task.clients,
        "no_demo": task.state.no_demo or None,  # why it may not be a demonstration
        "trust": task.state.trust,  # whose word its label is (`trust.py`); None: none
        "prompt_head": head[:200] + ("…" if len(head) > 200 else ""),
        "rubric": task.state.rubric,
        "notes": task.notes,
        "signals": [
            sig.only("kind", "source", "giver", "trusted", "words").to_dict()
            for sig in task.signals
        ],
        **{k: mark.to_dict() for k, mark in task.state.train_only().items() if given(mark)},
        "kind": task.kind,
    }


# ---- reading the phases' run directories ---------------------------------------------------


def _diag(run_dir: Path, step: int) -> dict[str, Any]:
    path = run_dir / "diagnostics" / f"step_{step:04d}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _steps(run_dir: Path) -> list[StepRow]:
    """The run's step rows (history.jsonl), typed."""
    rows = (row_from_dict(r) for r in RunDir(run_dir).history() if r.get("stage") == "step")
    return [r for r in rows if isinstance(r, StepRow)]


def _stop(record: StopRecord | None) -> StopReason | None:
    return record.reason if record is not None else None


def why_nothing(night_dir: Path, phases: Mapping[str, PhaseRecord]) -> str:
    """Why a night whose backend worked proposed nothing, in one paragraph."""
    parts = []
    for document, phase in phases.items():
        if not phase.ran:
            why = stop_text(_stop(phase.stopped_by)) or phase.error
            parts.append(f"{document}: did not run ({why})")
            continue
        run_dir = Path(str(phase.run_dir))
        steps = _steps(run_dir)
        calls = [c for r in steps for c in _diag(run_dir, r.step).get("analyst_calls", [])]
        statuses: dict[str, int] = {}
        for c in calls:
            key = c["status"] if c["status"] != "ok" or c["edits"] else "ok, no edit"
            statuses[key] = statuses.get(key, 0) + 1
        proposed = sum(r.edits["proposed"] for r in steps)
        applied = sum(r.edits["applied"] for r in steps)
        refused = sum(r.edits["refused"] for r in steps)
        calls_text = ", ".join(f"{n} {k}" for k, n in statuses.items()) or "none"
        n_calls = f"{len(calls)} call{'' if len(calls) == 1 else 's'}"
        if proposed == 0:
            text = f"{document}: the analyst proposed no edit ({n_calls}: {calls_text})"
        elif applied == 0:
            text = (
                f"{document}: {proposed} edits proposed, none applied ({refused} refused by the "
                f"edit guard; the rest invalid, dropped or not applicable; analyst calls: "
                f"{calls_text})"
            )
        else:
            verdicts = "; ".join(
                f"step {r.step} {r.gate.decision} ({r.gate.reason})"
                for r in steps
                if r.val is not None and r.gate is not None
            )
            text = f"{document}: the gate kept the adopted {document}: {verdicts}"
        modes = phase.demo_modes
        vs = modes.vs_adopted if modes is not None else None
        if modes is not None and modes.winner == "adopted" and given(vs):
            text += f"; demos: kept the adopted skill ({vs.mode} vs it: {vs.reason})"
        elif modes is not None and modes.candidates:
            text += f"; demos: {modes.winner} won of {', '.join(modes.candidates)}"
        if given(phase.stopped_by):
            text += f"; stopped early: {stop_text(_stop(phase.stopped_by))}"
        parts.append(text)
    return "nothing to propose: " + " | ".join(parts)


def _best_val_rows(phase: PhaseRecord) -> list[dict[str, Any]] | None:
    version = str(phase.best_version or "v0000")  # the run's skill version, "v0003"
    step = int(version[1:]) if version[1:].isdigit() else 0
    if step == 0:
        return None
    return _diag(Path(str(phase.run_dir)), step).get("val") or None


def val_rows(
    night: NightResult,
) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
    """The val rows (one per val task) before the night, and with its best candidate (None
    when no phase ran, or none found a new best)."""
    ran = [p for p in night.phases.values() if p.ran]
    if not ran:
        return None, None
    before = _diag(Path(str(ran[0].run_dir)), 0).get("val")
    for phase in reversed(ran):
        after = _best_val_rows(phase)
        if after is not None:
            return before, after
    return before, None


def write_diagnostics(night_dir: Path, night: NightResult, evidence: EvidenceLog) -> None:
    ran = {d: p for d, p in night.phases.items() if p.ran}
    steps: dict[str, list[dict[str, Any]]] = {}
    rollout_errors = []
    for document, phase in ran.items():
        run_dir = Path(str(phase.run_dir))
        rows = []
        for step in [0, *(r.step for r in _steps(run_dir))]:
            diag = _diag(run_dir, step)
            rollout_errors += [
                {"phase": document, "step": step, **e} for e in diag.get("backend_errors", [])
            ]
            if step:
                rows.append(
                    {
                        "step": step,
                        "gate": diag.get("gate"),
                        "analyst_calls": diag.get("analyst_calls", []),
                        "dropped": diag.get("dropped", []),
                        "edit_reports": diag.get("edit_reports", []),
                    }
                )
        steps[document] = rows
    before, after = val_rows(night)
    diagnostics = {
        "night": night.night,
        "project": night.project,
        "status": night.status,
        "reason": night.reason,
        "val_before": before,
        "val_after": after,
        "steps": steps,
        "backend_call_errors": evidence.errors,
        "rollout_errors": rollout_errors,
        "no_proposal_reason": night.reason if night.status == "no_proposal" else None,
    }
    atomic_write_json(night_dir / "diagnostics.json", redact_tree(diagnostics))


# ---- report.md --------------------------------------------------------------------------------

REPLAY = {
    "agent": "on the agent itself: each task's request run by the target agent in a fresh "
    "workspace, the skill tried written to its instruction file, its own tools run for real",
    "episode": "episodes: the logged tools offered, the recorded tool results as fixtures",
    "reply": "one reply per request",
}
AGENT_RUNS_SHOWN = 20  # val tasks whose agent runs report.md shows

NEXT_STEP = {
    "staged": "review the diff below, then `selftaught sleep adopt {night} --project {project}`",
    "adopted": "adopted as version {adopted_version}; `selftaught sleep rollback --project "
    "{project}` returns to the previous one",
    "no_proposal": "nothing to adopt; the adopted skill stays",
    "too_few_tasks": "nothing to adopt; the interactions are read again by the next night",
    "backend_failed": "fix the backend and run again: the interactions are read again",
    "failed": "nothing to adopt; see the reason",
}


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "?"


def _acc(summary: Summary | None) -> str:
    if not given(summary):
        return "—"
    s = summary.score  # the one decoder: a night's summary of an older shape reads too
    lo, hi = s.hard_ci
    return f"{s.hard:.3f} ({s.solved}/{s.n}, 95% CI {lo:.2f}–{hi:.2f})"


def _fence(text: str, lang: str = "") -> str:
    ticks = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _usage_lines(usage: Mapping[str, Any], budget: BudgetRecord | None) -> list[str]:
    lines = ["| role | calls | errors | tokens in | tokens out |", "|---|---:|---:|---:|---:|"]
    for role, u in usage.items():
        lines.append(
            f"| {role} | {u['calls']} | {u['errors']} | {u['prompt_tokens']} | "
            f"{u['completion_tokens']} |"
        )
    written = budget.to_dict() if budget is not None else {}  # the limits as the report has them
    limits = {k: v for k, v in written.items() if v is not None and k != "roles"}
    lines.append("")
    lines.append(f"Budget: {limits or 'none'} (every role counts, both phases share it).")
    return lines


def _phase_lines(document: str, phase: PhaseRecord) -> list[str]:
    if not phase.ran:
        why = stop_text(_stop(phase.stopped_by)) or phase.error
        return [f"- **{document}**: did not run ({why})"]
    decisions = ", ".join(f"{k} {v}" for k, v in phase.decisions.items()) or "none"
    line = (
        f"- **{document}**: {phase.steps} of {phase.total_steps} steps; val "
        f"{_acc(phase.val_initial)} → best {_acc(phase.val_best)}; gate decisions: "
        f"{decisions}; analyst parse rate {phase.analyst.parse_rate if phase.analyst else None}"
    )
    if given(phase.stopped_by):
        line += f"; **stopped early: {stop_text(_stop(phase.stopped_by))}**"
    return [line]


def _summary_lines(night: NightResult) -> list[str]:
    """The bullet list under the status: what was read, the models, tasks, split, gate."""
    window = night.window
    capped = f" (capped at {window.capped})" if window is not None and window.capped else ""
    since, until = (window.since, window.until) if window is not None else (None, None)
    lines = [
        f"- read: {window.read if window is not None else 0} interactions from {_when(since)} "
        f"to {_when(until)}{capped}"
    ]
    if given(night.models):
        m = night.models
        lines.append(
            f"- models: target `{m.target}`, optimizer `{m.optimizer}`, judge "
            f"`{m.judge or 'none'}`, miner `{m.miner or 'none'}`"
        )
    if given(night.mining):
        lines += _mining_lines(night.mining)
    if given(night.splits):
        s = night.splits
        lines.append(f"- split: {s.train} train / {s.val} val / {s.test} test")
    lines += duplicate_lines(night.duplicates)
    lines += _recall_lines(night.recall)
    lines += weak_lines(night.weak) + dream_lines(night.dream)
    if night.replay in REPLAY:
        lines.append(f"- replay: {REPLAY[night.replay]}")
    lines += _gate_lines(night)
    if given(night.training):
        t = night.training
        lines.append(
            f"- training: {t.epochs} epoch(s), batch {t.batch_size}, rollouts-k {t.rollouts_k}, "
            f"{t.concurrency} workers, house rules {'given' if t.preferences else 'none'}"
        )
    return lines + [f"- note: {note}" for note in night.notes]


SHOWN_DUPLICATES = 10


def duplicate_lines(dropped: Sequence[LateDuplicate]) -> list[str]:
    """What the night dropped late as the same item as a held-out task (one line each)."""
    if not dropped:
        return []
    lines = [
        f"- dropped as duplicates of held-out tasks: {len(dropped)} (never learned from; "
        "the night went on)"
    ]
    lines += [f"  - {d.line()}" for d in dropped[:SHOWN_DUPLICATES]]
    if len(dropped) > SHOWN_DUPLICATES:
        lines.append(f"  - and {len(dropped) - SHOWN_DUPLICATES} more (report.json `duplicates`)")
    return lines


def _mining_lines(mining: MiningRecord) -> list[str]:
    dropped = "; ".join(f"{n} {why}" for why, n in mining.dropped.items()) or "none"
    checks = ", ".join(f"{n} {k}" for k, n in mining.by_check.items()) or "none"
    return [
        f"- tasks: {mining.tasks} mined ({checks}), {mining.merged} near-duplicates "
        f"merged, {mining.negative} from negative feedback; dropped: {dropped}",
        *_conversation_lines(mining),
        *miner_lines(mining.miner),
    ]


def _gate_lines(night: NightResult) -> list[str]:
    """The gate's settings, and the smallest gain it could accept on this val."""
    gate = night.gate
    if not given(gate):
        return []
    if gate.mode == "off" and gate.no_val:
        return ["- gate: **OFF, no val held out** (`--no-val`) — every candidate accepted"]
    if gate.mode == "off":
        return ["- gate: **OFF** — every candidate was accepted greedily, unchecked"]
    paired = f", paired test at {gate.confidence}" if gate.confidence else ""
    lines = [
        f"- gate: on ({gate.metric}, a new best needs > {gate.margin:g} val items{paired})"
        + _veto_text(gate)
    ]
    smallest = gate.smallest_gain
    if given(smallest) and gate.mode == "on":
        if smallest.items is None:
            lines.append(f"- smallest gain the gate could accept: none — {smallest.why}")
        else:
            share = smallest.share or 0.0
            lines.append(
                f"- smallest gain the gate could accept: {smallest.items} net val items of "
                f"{smallest.n_val} ({share:.0%}); a smaller true gain cannot be "
                "told from noise at this val size"
            )
    if given(gate.power) and gate.mode == "on" and given(smallest):
        lines.append(_power_line(gate.power, smallest.n_val))
    return lines


def _veto_text(gate: GateMode) -> str:
    """The per-tag veto's rule, as the gate line says it (nothing when off)."""
    rules = []
    if gate.tag_alpha is not None:
        rules.append(f"at one-sided p ≤ {gate.tag_alpha:g}")
    if gate.tag_margin is not None:
        rules.append(f"by more than {gate.tag_margin:g} items")
    if not rules:
        return ""
    return "; per-kind veto: a candidate is refused when one kind's val items are lost " + (
        " or ".join(rules)
    )


def _power_line(power: NightPower, n_val: int) -> str:
    """How far tonight's val is from the gain the night looks for, in tasks of the traffic."""
    gain, need = f"{power.target_gain:.0%}", power.needed_val
    if need is None or n_val >= need:
        return (
            f"- a gain of {gain} is within reach of this val (it needs at least {need} val tasks)"
        )
    more = (
        f"about {power.more_tasks} more checked tasks of your traffic (val takes "
        f"{power.val_fraction:.0%} of them)"
        if power.more_tasks is not None
        else "no number of tasks (val takes none of them)"
    )
    return (
        f"- to accept a gain of {gain}: at least {need} val tasks, {need - n_val} more than "
        f"tonight's {n_val}: {more}"
    )


def _conversation_lines(mining: MiningRecord) -> list[str]:
    """What the threads held, and what would have checked the rows dropped for want of one."""
    conv = mining.conversation
    lines = []
    if conv is not None and conv.threads:
        signals = ", ".join(f"{n} {k}" for k, n in conv.signals.items()) or "none"
        rejected = conv.rejected_by_operator
        lines.append(
            f"- conversations: {conv.threads} threads ({conv.linked_threads} of two or "
            f"more replies, {conv.turns} replies); read from the users' next turns and "
            f"re-asks: {signals} ({conv.trusted} the operator's words, {conv.untrusted} "
            f"an end user's evidence"
            + (f"; {rejected} rejected by the operator" if rejected else "")
            + ")"
        )
    model = conv.model if conv is not None else None
    if model is not None and model.candidates:
        outcomes = ", ".join(f"{n} {k}" for k, n in model.outcomes.items()) or "none"
        skipped = "; ".join(f"{n} {why}" for why, n in model.skipped.items())
        rate = "n/a" if model.parse_rate is None else f"{model.parse_rate:.2f}"
        lines.append(
            f"- next turns read by the miner `{model.model}`: {model.candidates} the rules read "
            f"nothing or a bare rejection in, {model.asked} asked, parse rate {rate} "
            f"({model.repaired} repaired, {model.parse_failures} unreadable, "
            f"{model.backend_errors} backend errors); read: {outcomes}"
            + (f"; not asked: {skipped}" if skipped else "")
        )
    unchecked = sum(n for why, n in mining.dropped.items() if why.startswith(NO_CHECK))
    if unchecked:
        lines.append(
            f"- {unchecked} rows had no check: a correction in the user's next turn, "
            "`sleep feedback ID --reference`, a rule the request states, or a --judge-model "
            "(rubric) would make them tasks"
        )
    return lines


def miner_lines(miner: MinerRecord | None) -> list[str]:
    """What the miner wrote (`records.MinerRecord`): asked, parsed, kept, refused and why."""
    if not given(miner):
        return []
    rate = miner.parse_rate
    refused = "; ".join(f"{n} {why}" for why, n in miner.refused.items()) or "none"
    skipped = "; ".join(f"{n} {why}" for why, n in miner.skipped.items()) or "none"
    return [
        f"- miner `{miner.miner}`: {miner.candidates} rows without a strong check, "
        f"{miner.asked} shown, parse rate {'n/a' if rate is None else f'{rate:.2f}'} "
        f"({miner.repaired} repaired, {miner.parse_failures} unreadable, "
        f"{miner.backend_errors} backend errors), {miner.cannot_check} cannot check; "
        f"checks kept {miner.kept}, refused: {refused}; not shown: {skipped}"
    ]


def _recall_lines(rec: RecallRecord | None) -> list[str]:
    if not given(rec):
        return []
    if not rec.max:
        return ["- recall: off"]
    used = rec.recalled
    by_split = " / ".join(f"{used.get(s, 0)} {s}" for s in ("train", "val", "test"))
    line = (
        f"- recall: {sum(used.values())} past tasks ({by_split}) from a pool of {rec.pool} "
        f"(cap {rec.max}); {rec.mined_again} asked again tonight kept their split"
    )
    if rec.pinned_train:
        line += f"; {rec.pinned_train} pinned to train (an adopted demo came from them)"
    if rec.withheld_private:
        line += f"; {rec.withheld_private} private ones kept from a remote model"
    return [line]


def _ci(summary: Summary) -> str:
    s = summary.score  # the one decoder: a night's summary of an older shape reads too
    lo, hi = s.hard_ci
    return f"{s.hard:.3f} ({s.solved}/{s.n}) | {lo:.2f}–{hi:.2f}"


def demo_mode_lines(modes: DemoModesRecord | None) -> list[str]:
    """The three-way demo gate: the pool, each mode's val with its 95% interval, the winner."""
    if not given(modes):
        return []
    sources = ", ".join(f"{n} {k}" for k, n in sorted(modes.sources.items()))
    lines = [
        "",
        "## Demonstrations",
        "",
        f"Pool: {modes.pool} clean train demos ({sources or 'none'}); "
        f"{modes.leaks_refused} refused as near-copies of val / test inputs.",
    ]
    if modes.candidates:
        lines += [
            "",
            "| mode | val | 95% CI | demos | net items vs incumbent | gate |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for mode, summary in modes.candidates.items():
            g = modes.gates.get(mode)
            if mode == modes.incumbent:
                net, verdict = "—", "incumbent (the skill phase's choice)"
            elif mode == "adopted":
                vs = modes.vs_adopted
                mode_vs, why_vs = (vs.mode, vs.reason) if vs is not None else (None, None)
                net, verdict = "—", f"the adopted skill; {mode_vs} vs it: {why_vs}"
            else:
                net = f"{g.result.gain_vs_best:+g}" if g else "—"
                verdict = g.reason if g else ""
            # before shapes were kept apart, each mode's summary held its own
            shape = modes.shapes.get(mode) or DemoShape.from_dict(summary.extra)
            shown = f"{shape.demos}" + (f" (retrieve {shape.retrieve})" if shape.retrieve else "")
            lines.append(f"| {mode} | {_ci(summary)} | {shown} | {net} | {verdict} |")
        won = modes.winner
        lines += ["", f"Winner: **{won}**" + (" (kept)" if won == modes.incumbent else "") + "."]
    lines += [f"- note: {n}" for n in modes.notes]
    return lines


def weight_lines(weights: WeightsRecord | None) -> list[str]:
    """A weight night's candidates (text, adapters, both) with val, 95% CI and the gate."""
    if not given(weights):
        return []
    data = weights.data or WeightDataRecord()
    lines = [
        "",
        "## Text or weights",
        "",
        f"Adapter data (train tasks only): {data.corrections} corrections, "
        f"{data.elite} elite replays, {data.preference_pairs} preference pairs.",
    ]
    for method, t in weights.trained.items():
        loss = [f"{x:.3f}" if isinstance(x, float) else "—" for x in (t.loss_first, t.loss_last)]
        stop = _stop(t.stopped_by)
        lines.append(
            f"- {method}: {t.steps} steps in {t.seconds} s, loss {loss[0]} → {loss[1]}"
            + (f" (stopped by {stop_text(stop)})" if stop else "")
        )
    lines += [
        "",
        "| candidate | val | 95% CI | net items vs adopted | gate |",
        "|---|---:|---:|---:|---|",
    ]
    for name, summary in weights.candidates.items():
        g = weights.gates.get(name)
        net = f"{g.result.gain_vs_best:+g}" if g else "—"
        verdict = g.reason if g else "the adopted version (incumbent)"
        lines.append(f"| {name} | {_ci(summary)} | {net} | {verdict} |")
    lines += ["", f"Winner: **{weights.winner}**: {weights.why}."]
    lines += [f"- note: {n}" for n in weights.notes]
    return lines


def _proposal_lines(night_dir: Path, night: NightResult) -> list[str]:
    proposal = night.proposal
    if not given(proposal):
        return []
    paired = proposal.paired  # an older night's proposal has no paired comparison
    per_task = (
        f"; per task {paired.wins} better, {paired.losses} worse "
        f"(sign test p={paired.sign_test_p:.3f})"
        if given(paired)
        else ""
    )
    lines = [
        "",
        "## Proposal",
        "",
        f"Val with the adopted version {night.base_version}: "
        f"{_acc(proposal.val_before)}; with the proposal: {_acc(proposal.val_after)}{per_task}.",
    ]
    changed = {"skill": proposal.skill_changed, "memory": proposal.memory_changed}
    for name in ("skill", "memory"):
        diff = night_dir / "proposal" / f"{name}.diff"
        if changed[name] and diff.exists():
            lines += ["", f"### {name}.md", "", _fence(diff.read_text(encoding="utf-8"), "diff")]
    adapter = proposal.adapter
    if given(adapter):
        lines += [
            "",
            f"### adapter ({adapter.method})",
            "",
            f"`{adapter.dir}/` in this folder: a LoRA adapter on {adapter.base_model}, "
            f"trained on {len(adapter.train_items)} train tasks.",
        ]
    return lines


def _run_line(row: dict[str, Any]) -> str:
    """One val rollout of an agent: solved or not, then what it did (its tool calls with their
    results, the files it changed, its answer), clipped."""
    if row.get("error"):
        return f"error: {_clip(str(row['error']), 200)}"
    mark = "solved" if row.get("hard") else "failed"
    steps = row.get("trajectory") or [f"answer: {row.get('reply_head', '')}"]
    files = (row.get("agent") or {}).get("files_changed") or []
    if files and not any(str(s).startswith("files changed:") for s in steps):
        steps = [f"files changed: {', '.join(files)}", *steps]
    return f"{mark} · " + " · ".join(_clip(str(s), 160) for s in steps)


def agent_run_lines(night: NightResult) -> list[str]:
    """What the agent did on each val task, before the night and with its best candidate
    (a night replayed on the agent only)."""
    if night.replay != "agent":
        return []
    before, after = (redact_tree(rows) for rows in val_rows(night))  # as diagnostics.json
    if not before:
        return []
    target = night.models.target if night.models is not None else None
    with_best = {r["id"]: r for r in after or []}
    lines = [
        "",
        "## Agent runs on val",
        "",
        f"What `{target}` did on each val task with the adopted skill"
        + (" and with the night's best candidate" if with_best else "")
        + " (tool calls with their results, files changed, answer):",
        "",
    ]
    for row in before[:AGENT_RUNS_SHOWN]:
        lines.append(f"- `{row['id']}` adopted: {_run_line(row)}")
        if row["id"] in with_best:
            lines.append(f"  - candidate: {_run_line(with_best[row['id']])}")
    if len(before) > AGENT_RUNS_SHOWN:
        lines.append(f"- … {len(before) - AGENT_RUNS_SHOWN} more in `diagnostics.json`")
    return lines


def shown_stop(night: NightResult) -> StopReason | None:
    """The stop report.json holds: a failed night's is its reason, not written again unless
    the report it was read from had one."""
    if night.failed and "stopped_by" not in (night.report_keys or ()):
        return None
    return night.stopped_by


NO_VAL_BANNER = (
    "**NO VALIDATION — the user opted out of a held-out val set (`--no-val`, the daily-use "
    "design): every task trained, none measured what was learned, the gate was OFF and "
    "accepted every candidate unchecked. A version adopted from this night is on probation "
    "with auto-rollback: a drop on live traffic rolls it back (`sleep probation`).**"
)


def no_val_banner(night: NightResult) -> list[str]:
    """The first thing a no-val night's report says (nothing else is a check)."""
    gate = night.gate
    return [NO_VAL_BANNER, ""] if given(gate) and gate.no_val else []


def render_markdown(night_dir: Path, night: NightResult) -> str:
    status = night.status or "?"
    next_step = NEXT_STEP.get(status, "").format(
        night=night.night, project=night.project, adopted_version=night.adopted_version
    )
    stop = shown_stop(night)
    skill = night.phases.get("skill")
    lines = [
        f"# Night {night.night} · project {night.project}",
        "",
        *no_val_banner(night),
        f"**Status: {status}** — {night.reason or ''}",
        "",
        f"**Stopped by {stop_text(stop)}**" if stop is not None else "",
        "",
        f"Next: {next_step}" if next_step else "",
        "",
        *_summary_lines(night),
        *kind_lines(night),
        *_proposal_lines(night_dir, night),
        *agent_run_lines(night),
        *source_lines(night.proofread, night.window),
        *demo_mode_lines(skill.demo_modes if skill is not None else None),
        *weight_lines(night.weights),
    ]
    if night.phases:
        lines += ["", "## Phases", ""]
        for document, phase in night.phases.items():
            lines += _phase_lines(document, phase)
    lines += time_lines(night)
    if night.usage:
        lines += ["", "## Usage", "", *_usage_lines(night.usage, night.budget)]
    lines += [
        "",
        "Details: `diagnostics.json` (per val task, analyst replies, backend errors), "
        "`evidence.jsonl` (every call), `tasks.jsonl` (the mined tasks); "
        f"`selftaught report {night_dir}` renders the skill phase as HTML.",
    ]
    return "\n".join(lines) + "\n"


def kind_lines(night: NightResult) -> list[str]:
    """report.md's table of the kinds of request the night measured (`kinds.py`)."""
    if not night.kinds:
        return []
    adopted = {e.name: e for e in night.skills}
    out = [
        "",
        "## Kinds of request",
        "",
        "| kind | about | traffic | signals (operator / end user) | tasks | val before → after "
        "| its recalled val | skill |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k in night.kinds:
        name = f"{k.id} (new)" if k.new else k.id
        traffic = f"{k.traffic} rows" if not k.quiet else "quiet tonight"
        signals = ", ".join(
            f"{n} {sig} ({by.get('trusted', 0)} / {by.get('untrusted', 0)})"
            for sig, n, by in ((sig, sum(by.values()), by) for sig, by in k.signals.items())
        )
        splits = " / ".join(f"{k.splits[s]} {s}" for s in ("train", "val", "test") if s in k.splits)
        tasks = f"{k.mined} mined, {sum(k.recalled.values())} recalled ({splits})"
        out.append(
            f"| {name} | {', '.join(k.terms)} | {traffic} | {signals or '—'} | {tasks} | "
            f"{_pair_text(k.val)} | {_pair_text(k.recalled_val)} | {_kind_skill(k, adopted)} |"
        )
    out += [
        "",
        "A quiet kind's skill is not trained or gated again; its recalled val tasks still veto "
        "a candidate that loses them (docs/sleep-mixed-traffic.md).",
    ]
    return out


def _pair_text(pair: ValPairRecord | None) -> str:
    return "—" if pair is None else f"{pair.before:.2f} → {pair.after:.2f} ({pair.n})"


def _kind_skill(kind: KindRecord, entries: Mapping[str, SkillRecord]) -> str:
    """Who serves the kind, and what became of its skill tonight."""
    if kind.skill_status == "shared":
        return "the project's skill"
    if kind.skill is None:
        return f"none yet ({_clip(kind.reason or '', 60)})"
    entry = entries.get(kind.skill)
    status = kind.skill_status
    if entry is not None and entry.adopted_version is not None:
        status = f"adopted as version {entry.adopted_version}"
    if entry is not None and status != "rejected":  # what it staged besides its text
        parts = [entry.candidate or ""] if entry.adapter is not None else []
        parts += ["memory"] if entry.memory_changed else []
        status += f" ({', '.join(parts)})" if parts else ""
    return f"{kind.skill}: {status}"


def time_lines(night: NightResult) -> list[str]:
    """Where the night's wall time went, phase by phase (the weight phase in its parts)."""
    seconds = night.phase_seconds
    if not seconds:
        return []
    parts = []
    for phase, s in seconds.items():
        part = f"{phase} {s:.0f} s"
        if phase == "text":
            docs = [
                f"{d} {p.seconds:.0f} s" for d, p in night.phases.items() if p.seconds is not None
            ]
            part += f" ({', '.join(docs)})" if docs else ""
        if phase == "weights":
            inner = night.weights.seconds if night.weights is not None else {}
            part += f" ({', '.join(f'{k} {v:.0f} s' for k, v in inner.items())})" if inner else ""
        parts.append(part)
    return ["", "## Time", "", f"- {'; '.join(parts)}; total {sum(seconds.values()):.0f} s"]


def _clip(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def source_lines(proofread: ProofreadRecord | None, window: WindowRecord | None) -> list[str]:
    """Where each proposed line came from (tasks, interactions, clients), what leave-one-out
    dropped and why, and each client's share of the night."""
    out: list[str] = []
    if proofread is not None and (proofread.kept or proofread.dropped):
        out += ["", "## Proposed lines and their sources", ""]
        out += ["| | line | tasks | interactions | clients | why |", "|---|---|---|---|---|---|"]
        for row in [*proofread.kept, *proofread.dropped]:
            mark = "dropped" if row.verdict == "dropped" else row.kind
            who = ", ".join(row.clients) or "—"
            out.append(
                f"| {mark} | {_clip(row.text).replace('|', '/')} | {len(row.tasks)} | "
                f"{len(row.sources)} | {who} | {row.why} |"
            )
        tried = proofread.tried or "not run"
        out += ["", f"Leave-one-out: {proofread.trials} val evaluations ({tried})."]
    clients = window.clients if window is not None else {}
    if len(clients) > 1 and window is not None:
        share = window.share if window.share is not None else 1.0
        out += ["", f"Clients (each held to {share:.0%} of the night):", ""]
        out += [
            f"- {c}: {n.read} read of {n.window}"
            + (f", {n.left_out} left out over its share" if n.left_out else "")
            for c, n in clients.items()
        ]
    return out


def write_markdown(night_dir: Path, night: NightResult) -> None:
    atomic_write_text(night_dir / "report.md", render_markdown(night_dir, night))


# ---- the CLI's views -----------------------------------------------------------------------


def probation_lines(project: str, home: Path, log_path: str | Path | None) -> list[str]:
    """`sleep status`'s probation line (and a WARNING on a drop); nothing without a log."""
    from selftaught.errors import SelftaughtError
    from selftaught.sleep.intake.log import TaskLog
    from selftaught.sleep.intake.probation import probation_for, status_lines
    from selftaught.sleep.paths import default_log_path

    path = log_path or default_log_path()
    if isinstance(path, Path) and not path.exists():  # a postgresql:// URL is a str
        return []
    try:
        with TaskLog(path) as log:
            result = probation_for(project, log, home=home, narrow=True)  # the versions compared
            return status_lines(result, project)
    except SelftaughtError as err:
        return [f"  probation: unknown ({err})"]


def print_outcomes(outcomes: list[Any], out: Any, *, dry_run: bool = False) -> None:
    """One line per project (the report's path); a dry run prints each report and deletes
    its temporary folder."""
    import shutil

    if not outcomes:
        out.print("no project has interactions since its last night; nothing to do")
    for o in outcomes:
        if dry_run and o.night_dir is not None:
            out.print(render_markdown(o.night_dir, o), markup=False)
            shutil.rmtree(o.night_dir.parent, ignore_errors=True)
            continue
        out.print(f"{o.project}: {o.status} — {o.reason}", markup=False)
        if o.stopped_by is not None and not o.failed:
            out.print(f"  stopped by {o.stopped_by}", markup=False)
        if o.night_dir is not None:
            out.print(f"  report: {o.night_dir / 'report.md'}", markup=False)


def _score(d: Summary | Mapping[str, Any] | None) -> str:
    """A val summary in short: a night's or a version's meta.json (as written), read by the
    one decoder (`SplitScore.from_dict`)."""
    if isinstance(d, Summary):
        d = d.extra if given(d) else None
    if not d:
        return "—"
    s = SplitScore.from_dict(d)
    return f"{s.hard:.3f}" + (f" ({s.solved}/{s.n})" if s.n else "")


def adapter_cell(adapter: dict[str, Any] | None) -> str:
    """What a version serves: the base model, or whose adapter (method and night)."""
    if not adapter:
        return "base"
    carried = f", kept from v{adapter['carried_from']}" if adapter.get("carried_from") else ""
    return f"{adapter.get('method') or '?'} adapter of {adapter.get('night') or '?'}{carried}"


def history_tables(project: str, home: Path | None = None) -> list[Any]:
    """Rich tables: the adopted versions (with val before → after), then the nights."""
    from rich.table import Table

    from selftaught.sleep.adoption import staging

    versions = Table(title=f"adopted versions of {project}")
    for column in ("version", "night", "adopted", "val before", "val after", "weights", ""):
        versions.add_column(column)
    for row in staging.history(project, home):
        versions.add_row(
            str(row["version"]),
            row.get("night") or ("(nothing adopted)" if row["version"] == 0 else ""),
            _when(row.get("adopted_at")) if row.get("adopted_at") else "",
            _score(row.get("val_before")),
            _score(row.get("val_after")),
            adapter_cell(row.get("adapter")),
            "current" if row["current"] else "",
        )
    nights = Table(title=f"nights of {project}")
    for column in ("night", "status", "val before → after"):
        nights.add_column(column, no_wrap=True)
    nights.add_column("why", no_wrap=True, overflow="ellipsis", ratio=1)
    for _, night in staging.list_nights(project, home):
        proposal = night.proposal
        scores = (
            f"{_score(proposal.val_before)} → {_score(proposal.val_after)}"
            if given(proposal)
            else ""
        )
        nights.add_row(night.night, night.status, scores, str(night.reason or ""))
    return [versions, nights]


def history_rows(project: str, home: Path | None = None) -> list[dict[str, Any]]:
    """What `sleep history --json` prints: each adopted version, then each night's report
    summary, one JSON-ready object each (`kind`: version | night)."""
    from selftaught.sleep.adoption import staging

    rows: list[dict[str, Any]] = [
        {"kind": "version", **row} for row in staging.history(project, home)
    ]
    for _, night in staging.list_nights(project, home):
        proposal = night.proposal
        rows.append(
            {
                "kind": "night",
                "night": night.night,
                "status": night.status,
                "val_before": plain(proposal.val_before) if proposal is not None else None,
                "val_after": plain(proposal.val_after) if proposal is not None else None,
                "reason": night.reason,
            }
        )
    return rows


def skill_lines(project: str, home: Path, log_path: str | Path | None) -> list[str]:
    """`sleep status`'s lines of the project's many skills: each one's version and probation,
    the ones staged and waiting."""
    from selftaught.errors import SelftaughtError
    from selftaught.sleep.adoption.skill_units import skill_status_lines
    from selftaught.sleep.intake.log import TaskLog
    from selftaught.sleep.intake.probation import skill_probations, status_lines
    from selftaught.sleep.paths import default_log_path

    path = log_path or default_log_path()
    probation: list[str] = []
    if not (isinstance(path, Path) and not path.exists()):  # a postgresql:// URL is a str
        try:
            with TaskLog(path) as log:
                results = skill_probations(project, log, home=home)
            probation = [line for r in results for line in status_lines(r, project)]
        except SelftaughtError as err:
            probation = [f"  probation of skills: unknown ({err})"]
    return skill_status_lines(project, home, probation)


TREND_NIGHTS = 5  # `sleep status` shows each kind over this many last nights


def kind_status_lines(
    project: str, home: Path, nights: Sequence[tuple[Path, NightResult]]
) -> list[str]:
    """`sleep status`'s lines of the project's kinds of request: each one's skill (its own
    and its version, or the project's) and its val over the last nights that measured kinds,
    oldest first (quiet: no traffic of it that night)."""
    from selftaught.sleep.adoption import staging
    from selftaught.sleep.adoption.skill_units import skill_names
    from selftaught.sleep.kinds_file import load_kinds
    from selftaught.sleep.paths import Unit

    kinds = load_kinds(project, home)
    if not kinds:
        return []
    recent = [n for _, n in nights if n.kinds][-TREND_NIGHTS:]
    own = set(skill_names(project, home))
    lines = [f"  kinds of request: {len(kinds)} (val over the last {len(recent)} nights)"]
    for kind in kinds:
        if kind.id in own:
            skill = (
                f"skill {kind.id} version {staging.current_version(Unit(project, kind.id), home)}"
            )
        else:
            skill = "the project's skill"
        trend = ", ".join(_trend_cell(n, kind.id) for n in recent) or "not measured yet"
        lines.append(f"  kind {kind.id} ({', '.join(kind.terms)}): {skill}; {trend}")
    return lines


def _trend_cell(night: NightResult, kind: str) -> str:
    record = next((k for k in night.kinds if k.id == kind), None)
    if record is None:
        return f"{night.night} —"
    pair = record.val or record.recalled_val
    val = f"{pair.before:.2f}→{pair.after:.2f}" if pair is not None else "no val"
    return f"{night.night} {val}" + (" (quiet)" if record.quiet else "")


def status_lines(
    project: str | None, home: Path | None = None, log_path: str | Path | None = None
) -> list[str]:
    """What `sleep status` prints: per project the last night, a proposal waiting, the
    adopted version and its probation; then a running night and the schedule."""
    from selftaught.sleep import cron, pause
    from selftaught.sleep.adoption import staging
    from selftaught.sleep.lock import read_holder
    from selftaught.sleep.paths import sleep_home

    home = home or sleep_home()
    holder = read_holder(home)
    lines = []
    for name in [project] if project else staging.projects(home):
        nights = staging.list_nights(name, home)
        version = staging.current_version(name, home)
        consistent = staging.adopted_consistent(name, home)
        serving = staging.version_meta(name, version, home).get("adapter")
        lines.append(
            f"{name}: adopted version {version}, serving {adapter_cell(serving)}"
            + (
                ""
                if consistent
                else " (the adopted files do not match it: edited by hand or an "
                "adopt was interrupted; `sleep adopt` or `sleep rollback` sets them right)"
            )
        )
        if nights:
            last = nights[-1][1]
            status, reason = last.status, last.reason
            if status == "running" and (holder or {}).get("night") != last.night:
                status, reason = "interrupted", "it stopped before it finished (killed or crashed)"
            lines.append(f"  last night {last.night}: {status} — {reason}")
            if (stop := shown_stop(last)) is not None:
                lines.append(f"  stopped by {stop_text(stop)}")
        staged = [n for _, n in nights if n.status == "staged" and staging.own_proposal(n)]
        if staged:
            lines.append(
                f"  waiting to be adopted: night {staged[-1].night} "
                f"(`selftaught sleep adopt {staged[-1].night} --project {name}`)"
            )
        patience = pause.status_line(name, home)
        lines += [patience] if patience else []
        lines += probation_lines(name, home, log_path)
        lines += skill_lines(name, home, log_path)  # many skills (nightskills)
        lines += kind_status_lines(name, home, nights)
    if holder is not None:
        lines.append(
            f"running now: {holder.get('what', 'night')} {holder.get('night')} ("
            + (f"host {holder['host']}, " if holder.get("host") else "")
            + f"pid {holder.get('pid')}, since {_when(holder.get('started'))})"
        )
    try:
        planned = cron.entries()
    except cron.ScheduleError as err:
        lines.append(f"schedule: unknown ({err})")
    else:
        for entry in planned:
            lines.append(
                f"next scheduled night: {entry.next_run():%Y-%m-%d %H:%M} "
                f"(project {entry.project}, every day at {entry.hour:02d}:{entry.minute:02d})"
            )
        if not planned:
            lines.append("no night is scheduled (`selftaught sleep schedule --at 03:00`)")
    return lines or ["no project has been through a night yet"]
