"""The page of an `optimize` run (and of anything with its layout, like a sleep night):
learning curve with the gate's decisions, the decisions table, every candidate of every step
with its fate, the shipped skill's worked examples (and the leaks refused), edits with their
reasons, skill diffs (rules as text, demos added / removed), usage per role, failures with the
scorer's feedback, config."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from selftaught.report.candidate_sections import candidates_table, demo_changes, worked_examples
from selftaught.report.candidates import FATE_TEXT
from selftaught.report.html import (
    Html,
    badge,
    cards,
    config_table,
    details,
    diff_html,
    join,
    num,
    pre,
    section,
    table,
    tag,
)
from selftaught.report.parts import change, ci_text, estimate_cell, failure_groups, header, point
from selftaught.report.readers import SkillDiff, SkillRun, SkillStep
from selftaught.report.svg import COLORS, Chart, Mark, Series, render_chart

DECISION_TEXT = {
    "accept_new_best": "new best",
    "accept": "accept",
    "reject": "reject",
}
OUTCOME_TEXT = {
    "accepted_new_best": "accepted · new best",
    "accepted": "accepted · not shipped",
    "rejected": "rejected by the gate",
    "screened_out": "candidate screened out",
    "outscored": "candidate lost on full val",
    "dropped": "dropped before applying",
    "not_applied": "not applied",
    "invalid": "invalid",
}


def _skill_cards(run: SkillRun) -> Html:
    return cards(skill_card_items(run))


def skill_card_items(run: SkillRun) -> list[tuple[str, str, Any, str]]:
    """The summary cards (key, label, value, detail): val, test, steps, decisions, usage."""
    best = run.steps[-1].best_val if run.steps else run.baseline
    decisions = Counter(s.decision for s in run.steps if s.val is not None)
    empty = sum(1 for s in run.steps if s.val is None)
    calls = sum(int(u.get("calls") or 0) for u in run.usage.values())
    tokens = sum(
        int(u.get("prompt_tokens") or 0) + int(u.get("completion_tokens") or 0)
        for u in run.usage.values()
    )
    usd = [float(u["usd"]) for u in run.usage.values() if u.get("usd") is not None]
    paired = run.test_paired
    test_detail = ""
    if paired:
        test_detail = (
            f"{paired.get('wins', 0)} wins / {paired.get('losses', 0)} losses, sign test "
            f"p = {num(paired.get('sign_test_p'))}"
        )
    rate = run.analyst.get("parse_rate")
    total = f" of {run.total_steps}" if run.total_steps else ""
    return [
        (
            "val-initial",
            "val · initial skill",
            num(run.baseline and run.baseline.value),
            ci_text(run.baseline),
        ),
        (
            "val-best",
            f"val · best skill ({run.best_version or '–'})",
            num(best and best.value),
            ci_text(best),
        ),
        (
            "test",
            "test · initial → shipped",
            change(run.test_initial, run.test_best),
            test_detail,
        ),
        ("steps", "steps", f"{len(run.steps)}{total}", ""),
        (
            "decisions",
            "gate decisions",
            " · ".join(f"{decisions[k]} {DECISION_TEXT[k]}" for k in DECISION_TEXT),
            f"{len(run.steps)} steps; {empty} had no candidate (empty patch)",
        ),
        ("calls", "LLM calls", num(calls), "every role, gate evaluations included"),
        ("tokens", "tokens", num(tokens), "prompt + completion"),
        (
            "cost",
            "cost (USD)",
            f"{sum(usd):.4f}" if usd else "unknown",
            "" if usd else "no public price for these models",
        ),
        (
            "parse-rate",
            "analyst JSON parse rate",
            num(rate, 2) if rate is not None else "–",
            f"{run.analyst.get('calls', 0)} analyst calls",
        ),
        ("elapsed", "elapsed", f"{num(run.elapsed_s, 1)} s", ""),
    ]


def skill_chart(run: SkillRun) -> Html:
    steps = run.steps
    metric = run.metric
    x_end = steps[-1].step if steps else 1
    batch = Series(
        f"train batch ({metric}, current skill)",
        [point(s.step, s.batch, f"step {s.step} batch") for s in steps],
        COLORS["orange"],
        error_bars=True,
        dashed=True,
        x_offset=-0.12,
    )
    best = Series(
        "val · best skill so far",
        [point(0, run.baseline, "baseline val")]
        + [point(s.step, s.best_val, f"step {s.step} best val") for s in steps],
        COLORS["green"],
        step=True,
        band=True,
    )
    cand = Series(
        "val · candidate of the step",
        [point(s.step, s.val, f"step {s.step} candidate {s.candidate}") for s in steps],
        COLORS["blue"],
        line=False,
        error_bars=True,
    )
    series = [batch, best, cand]
    if run.test_initial or run.test_best:
        series.append(
            Series(
                "test · initial → shipped skill",
                [
                    point(0, run.test_initial, "test, initial skill"),
                    point(x_end, run.test_best, f"test, shipped skill {run.best_version}"),
                ],
                COLORS["purple"],
                line=False,
                error_bars=True,
                x_offset=0.12,
            )
        )
    marks = []
    for s in steps:
        kind = s.decision if s.val is not None else "none"
        anchor = s.val or s.current_val
        if anchor is None:
            continue
        tip = f"step {s.step}: {s.decision} — {s.reason}"
        marks.append(Mark(s.step, anchor.value, kind if kind in DECISION_TEXT else "none", tip))
    return Html(
        render_chart(
            Chart(
                "Accuracy per step: train batch, val (candidate and best) and test",
                "step (0 = baseline)",
                f"{metric} accuracy",
                series,
                marks,
                chart_id="learning-curve",
                caption="Bands and bars are 95% confidence intervals (Wilson for accuracy). The "
                "batch changes every step, so its points are noisy by design.",
            )
        )
    )


def step_cost(s: SkillStep) -> str:
    calls = sum(int(u.get("calls") or 0) for u in s.usage.values())
    tokens = sum(
        int(u.get("prompt_tokens") or 0) + int(u.get("completion_tokens") or 0)
        for u in s.usage.values()
    )
    seconds = f" · {s.time_s:.1f} s" if isinstance(s.time_s, (int, float)) else ""
    return f"{calls} / {num(tokens)}{seconds}"


def _candidate_cell(s: SkillStep) -> Html:
    text = Html(f"{s.parent} → {s.candidate}" if s.candidate else "–")
    if s.candidates:
        n = len(s.candidates)
        what = f"best of {n} candidates" if s.candidate else f"{n} candidates, none gated"
        text += tag("div", what, class_="d")
    return text


def _gate_table(steps: Sequence[SkillStep]) -> Html:
    rows = []
    for s in steps:
        e = s.edits
        chain = " → ".join(str(e.get(k, 0)) for k in ("proposed", "merged", "selected", "applied"))
        kind = s.decision if s.val is not None else "none"
        label = DECISION_TEXT.get(s.decision, s.decision) if s.val is not None else "no candidate"
        rows.append(
            [
                tag("b", s.step) + tag("div", f"epoch {s.epoch}", class_="d"),
                estimate_cell(s.batch)
                + (tag("div", f"{s.truncated} truncated", class_="d") if s.truncated else ""),
                chain + tag("div", f"budget {s.budget}", class_="d"),
                _candidate_cell(s),
                estimate_cell(s.val) + (" (cached)" if s.val_cached else ""),
                badge(label, kind) + tag("div", s.reason),
                f"{s.current} / {s.best}",
                step_cost(s),
            ]
        )
    return table(
        [
            "step",
            "train batch",
            "edits",
            "candidate",
            "val (candidate)",
            "gate: decision and reason",
            "current / best",
            "calls / tokens · time",
        ],
        rows,
        table_id="gate-table",
        empty="no step has finished yet",
    )


def _edit_table(run: SkillRun) -> Html:
    rows = []
    for e in run.edits:
        what = tag("code", e.content)
        if e.target:
            what = join(
                [
                    tag("div", "target: ", class_="d"),
                    tag("code", e.target),
                    tag("br"),
                    tag("div", "content: ", class_="d"),
                    tag("code", e.content),
                ]
            )
        rows.append(
            [
                e.step,
                e.op,
                what,
                badge(OUTCOME_TEXT.get(e.outcome, e.outcome), e.outcome),
                e.reason,
                e.rationale,
            ]
        )
    return table(
        ["step", "op", "edit", "outcome", "why", "analyst's rationale"],
        rows,
        table_id="edits-table",
        empty="no edit has been proposed yet",
    )


def _diff_body(d: SkillDiff) -> Html:
    """Rules as a line diff; demonstrations as the ones added and removed."""
    rules = diff_html(d.old_text, d.new_text)
    if d.demos_added or d.demos_removed:
        rules = tag("div", "rules:", class_="d") + rules
    moved = Html("")
    if d.placement:
        moved = tag("p", f"demos placement: {d.placement[0]} → {d.placement[1]}", class_="d")
    return join([rules, demo_changes(d.demos_added, d.demos_removed), moved])


def _diffs(run: SkillRun) -> Html:
    parts = []
    for d in run.diffs:
        label = FATE_TEXT.get(d.decision) or DECISION_TEXT.get(d.decision, d.decision)
        title = join(
            [
                f"step {d.step}: {d.old_version} → {d.new_version} ",
                badge(label, d.decision),
                tag("span", f" {d.kind}: {d.why}", class_="d") if d.kind else "",
            ]
        )
        new_best = d.decision in ("accept_new_best", "accepted_new_best")
        parts.append(details(title, _diff_body(d), open_=new_best))
    if run.best_skill is not None:
        shipped = pre(run.best_skill)
        if run.shipped_demos:  # the rules; the demos are tabled under Worked examples
            shipped = pre(run.shipped_rules) + tag(
                "p", f"… and {len(run.shipped_demos)} worked example(s) (see above).", class_="d"
            )
        parts.append(details(f"the shipped skill ({run.best_version})", shipped, open_=True))
    return join(parts) if parts else tag("p", "no candidate skill yet", class_="empty")


USAGE_COLUMNS = (
    "calls",
    "cached_calls",
    "prompt_tokens",
    "completion_tokens",
    "retries",
    "errors",
    "truncated",
    "latency_s",
    "usd",
)


def front_table(front: Sequence[dict[str, Any]]) -> Html:
    """Score against cost per val item, one row per skill scored on the whole val split."""
    rows = []
    for p in front:
        cost = p.get("cost") or {}
        tokens = (cost.get("prompt_tokens") or 0) + (cost.get("completion_tokens") or 0)
        marks = [m for m, on in (("front", p.get("on_front")), ("shipped", p.get("shipped"))) if on]
        usd = cost.get("usd")
        rows.append(
            [
                p.get("version", "?"),
                num(p.get("val"), 3),
                num(tokens, 0) if cost else "not measured",
                num(cost.get("latency_s"), 2) if cost else "–",
                f"{usd:.6f}" if usd is not None else "–",
                join(badge(m, "accepted_new_best" if m == "shipped" else "accept") for m in marks),
            ]
        )
    return table(
        ["version", "val", "tokens / item", "seconds / item", "usd / item", ""],
        rows,
        table_id="front-table",
        empty="no cost measured (summary.json holds no front yet)",
    )


def _usage_value(column: str, value: Any) -> str:
    if value is None:
        return "–"
    if column == "usd":
        return f"{value:.4f}"
    return num(value, 1)


def _usage_table(usage: dict[str, dict[str, Any]]) -> Html:
    rows = [
        [role] + [_usage_value(c, u.get(c)) for c in USAGE_COLUMNS] for role, u in usage.items()
    ]
    if len(usage) > 1:
        totals = []
        for c in USAGE_COLUMNS:
            values = [u[c] for u in usage.values() if u.get(c) is not None]
            totals.append(_usage_value(c, sum(values) if values else None))
        rows.append(["total", *totals])
    return table(
        ["role"] + [c.replace("_", " ") for c in USAGE_COLUMNS],
        rows,
        table_id="usage-table",
        empty="no usage recorded yet",
    )


def skill_page(run: SkillRun) -> tuple[str, Html]:
    task = str(run.config.get("task", run.root.name))
    models = (
        f"target {run.config.get('model', '?')}, analyst {run.config.get('optimizer_model', '?')}"
    )
    body = join(
        [
            header(run.kind, run, task),
            tag("p", models, class_="sub"),
            _skill_cards(run),
            section("Learning curve", skill_chart(run), "curve"),
            section(
                "Gate decisions",
                _gate_table(run.steps),
                "gate",
                "Each step's candidate skill is scored on val; the gate keeps it as the new "
                "best, keeps it as current without shipping it, or rejects it. Edits: proposed "
                "→ merged → selected under the budget → applied.",
            ),
            section(
                "Candidates",
                candidates_table(run),
                "candidates",
                "Every candidate of every step: new rules from the analyst, a demo set (add, "
                "swap, a fresh set, drop) or a merge of two pool members. All are scored on a "
                "val subset first (screen); the best go on to full val, and the best there "
                "meets the gate. A demonstration marked shipped is in the best skill.",
            ),
            section(
                "Worked examples",
                worked_examples(run),
                "demos",
                "The demonstrations the shipped skill carries, taken from train only: the "
                "target's own passing replies (bootstrap), the task's references, or the "
                "user's corrections.",
            ),
            section(
                "Edits over time",
                _edit_table(run),
                "edits",
                "Every edit the analyst proposed, what happened to it, and why.",
            ),
            section(
                "Skill versions",
                _diffs(run),
                "diffs",
                "Each candidate against the skill it was built from: the rules as a line "
                "diff, the demonstrations as the ones added (+) and removed (−).",
            ),
            section(
                "Score against cost",
                front_table(run.front),
                "front",
                "Every skill scored on the whole val split, with what it spent per val item "
                "(tokens, seconds, dollars where the price is known). On the front: no other "
                "skill scores as well for fewer tokens. A skill that grew its prompt pays for "
                "it here.",
            ),
            section("Usage per role", _usage_table(run.usage), "usage"),
            section(
                "Failures",
                failure_groups(run.failures),
                "failures",
                "Examples the skill got wrong, with the scorer's feedback.",
            ),
            section("Config", config_table(run.config), "config"),
        ]
    )
    return f"selftaught {run.kind} · {task}", body
