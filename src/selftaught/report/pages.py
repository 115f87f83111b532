"""One page per run kind, built from the adapters' data (runs.py) with the HTML blocks
(html.py) and charts (svg.py)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from selftaught.report.html import (
    Html,
    badge,
    cards,
    config_table,
    details,
    diff_html,
    esc,
    join,
    num,
    pre,
    section,
    table,
    tag,
)
from selftaught.report.runs import (
    Estimate,
    Failure,
    RestRun,
    RLRun,
    Run,
    RunStatus,
    SkillRun,
    SkillStep,
)
from selftaught.report.svg import COLORS, Chart, Mark, Point, Series, render_chart

MAX_FAILURES = 60  # per group: a long run's failures stay readable (the rest are counted)

DECISION_TEXT = {
    "accept_new_best": "new best",
    "accept": "accept",
    "reject": "reject",
}
OUTCOME_TEXT = {
    "accepted_new_best": "accepted · new best",
    "accepted": "accepted · not shipped",
    "rejected": "rejected by the gate",
    "dropped": "dropped before applying",
    "not_applied": "not applied",
    "invalid": "invalid",
}


def _pt(x: float, e: Estimate | None, what: str) -> Point:
    if e is None:
        return Point(x, math.nan)
    return Point(x, e.value, e.lo, e.hi, f"{what}: {e.text()}")


def _header(kind: str, run: Any, task: str) -> Html:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    status: RunStatus = run.status
    cls = "error" if status.error else ("finished" if status.finished else "unfinished")
    text = status.text + (f" — {status.error}" if status.error else "")
    notes = join(tag("li", n) for n in run.notes)
    return join(
        [
            tag("h1", f"selftaught {kind} · {task}"),
            tag("p", f"{run.root.resolve()} · report generated {stamp}", class_="sub"),
            tag("div", text, class_=f"status {cls}", id="status"),
            tag("ul", notes, class_="notes", id="notes") if run.notes else Html(""),
        ]
    )


def _change(a: Estimate | None, b: Estimate | None) -> str:
    if a is None and b is None:
        return "–"
    if b is None:
        return f"{a.value:.3f} → …"  # type: ignore[union-attr]
    if a is None:
        return f"… → {b.value:.3f}"
    return f"{a.value:.3f} → {b.value:.3f}"


def _ci(e: Estimate | None) -> str:
    return e.text() if e is not None else ""


def _cell(e: Estimate | None) -> Html:
    """A table cell: the value (and counts) on one line, the 95% interval under it."""
    if e is None:
        return Html("–")
    counts = f" ({e.solved}/{e.n})" if e.solved is not None and e.n else ""
    ci = tag("div", f"{e.lo:.3f}–{e.hi:.3f}", class_="d") if e.lo is not None else Html("")
    return tag("b", f"{e.value:.3f}") + counts + ci


# ---- optimize / sleep ---------------------------------------------------------------------
def _skill_cards(run: SkillRun) -> Html:
    best = run.steps[-1].best_val if run.steps else run.baseline
    decisions = Counter(s.decision for s in run.steps)
    calls = sum(int(u.get("calls") or 0) for u in run.usage.values())
    tokens = sum(
        int(u.get("prompt_tokens") or 0) + int(u.get("completion_tokens") or 0)
        for u in run.usage.values()
    )
    usd = [u.get("usd") for u in run.usage.values() if u.get("usd") is not None]
    paired = run.test_paired
    test_detail = ""
    if paired:
        test_detail = (
            f"{paired.get('wins', 0)} wins / {paired.get('losses', 0)} losses, sign test "
            f"p = {num(paired.get('sign_test_p'))}"
        )
    rate = run.analyst.get("parse_rate")
    total = f" of {run.total_steps}" if run.total_steps else ""
    return cards(
        [
            (
                "val-initial",
                "val · initial skill",
                num(run.baseline and run.baseline.value),
                _ci(run.baseline),
            ),
            (
                "val-best",
                f"val · best skill ({run.best_version or '–'})",
                num(best and best.value),
                _ci(best),
            ),
            (
                "test",
                "test · initial → shipped",
                _change(run.test_initial, run.test_best),
                test_detail,
            ),
            ("steps", "steps", f"{len(run.steps)}{total}", ""),
            (
                "decisions",
                "gate decisions",
                " · ".join(f"{decisions[k]} {DECISION_TEXT[k]}" for k in DECISION_TEXT),
                f"{sum(decisions.values())} steps gated",
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
    )


def _skill_chart(run: SkillRun) -> Html:
    steps = run.steps
    metric = run.metric
    x_end = steps[-1].step if steps else 1
    batch = Series(
        f"train batch ({metric}, current skill)",
        [_pt(s.step, s.batch, f"step {s.step} batch") for s in steps],
        COLORS["orange"],
        error_bars=True,
        dashed=True,
        x_offset=-0.12,
    )
    best = Series(
        "val · best skill so far",
        [_pt(0, run.baseline, "baseline val")]
        + [_pt(s.step, s.best_val, f"step {s.step} best val") for s in steps],
        COLORS["green"],
        step=True,
        band=True,
    )
    cand = Series(
        "val · candidate of the step",
        [_pt(s.step, s.val, f"step {s.step} candidate {s.candidate}") for s in steps],
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
                    _pt(0, run.test_initial, "test, initial skill"),
                    _pt(x_end, run.test_best, f"test, shipped skill {run.best_version}"),
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


def _gate_table(steps: Sequence[SkillStep]) -> Html:
    rows = []
    for s in steps:
        e = s.edits
        calls = sum(int(u.get("calls") or 0) for u in s.usage.values())
        tokens = sum(
            int(u.get("prompt_tokens") or 0) + int(u.get("completion_tokens") or 0)
            for u in s.usage.values()
        )
        rows.append(
            [
                s.step,
                s.epoch,
                _cell(s.batch),
                s.budget,
                f"{e.get('proposed', 0)} → {e.get('merged', 0)} → {e.get('selected', 0)} → "
                f"{e.get('applied', 0)}",
                f"{s.parent} → {s.candidate}" if s.candidate else "–",
                _cell(s.val) + (" (cached)" if s.val_cached else ""),
                badge(DECISION_TEXT.get(s.decision, s.decision), s.decision),
                s.reason,
                f"{s.current} / {s.best}",
                f"{calls} / {num(tokens)}",
            ]
        )
    return table(
        [
            "step",
            "epoch",
            "train batch",
            "budget",
            "edits proposed → merged → selected → applied",
            "candidate",
            "val (candidate)",
            "gate",
            "reason",
            "current / best",
            "calls / tokens",
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


def _diffs(run: SkillRun) -> Html:
    parts = []
    for d in run.diffs:
        title = join(
            [
                f"step {d.step}: {d.old_version} → {d.new_version} ",
                badge(DECISION_TEXT.get(d.decision, d.decision), d.decision),
            ]
        )
        parts.append(
            details(title, diff_html(d.old_text, d.new_text), open_=d.decision == "accept_new_best")
        )
    if run.best_skill is not None:
        parts.append(
            details(f"the shipped skill ({run.best_version})", pre(run.best_skill), open_=True)
        )
    return join(parts) if parts else tag("p", "no candidate skill yet", class_="empty")


def _usage_table(usage: dict[str, dict[str, Any]]) -> Html:
    cols = [
        "calls",
        "cached_calls",
        "prompt_tokens",
        "completion_tokens",
        "retries",
        "errors",
        "truncated",
        "latency_s",
        "usd",
    ]
    rows = []
    for role, u in usage.items():
        rows.append(
            [role]
            + [
                num(u.get(c), 4 if c == "usd" else 1)
                if c in ("usd", "latency_s")
                else num(u.get(c))
                for c in cols
            ]
        )
    if len(usage) > 1:
        total = ["total"]
        for c in cols:
            vals = [u.get(c) for u in usage.values() if u.get(c) is not None]
            total.append(
                num(sum(vals), 4 if c == "usd" else 1)
                if c in ("usd", "latency_s") and vals
                else num(sum(vals))
                if vals
                else "–"
            )
        rows.append(total)
    return table(
        ["role"] + [c.replace("_", " ") for c in cols],
        rows,
        table_id="usage-table",
        empty="no usage recorded yet",
    )


def _failure_groups(failures: Sequence[Failure]) -> Html:
    groups: dict[str, list[Failure]] = {}
    for f in failures:
        groups.setdefault(f.where, []).append(f)
    parts = []
    for i, (where, items) in enumerate(groups.items()):
        rows = [
            [
                f.example_id,
                tag("code", f.reply),
                f.feedback + (f" (error: {f.error})" if f.error else ""),
                "yes" if f.truncated else "",
            ]
            for f in items[:MAX_FAILURES]
        ]
        more = len(items) - MAX_FAILURES
        body = table(["example", "reply (head)", "scorer's feedback", "truncated"], rows)
        if more > 0:
            body += tag("p", f"… and {more} more (see the run's diagnostics/)", class_="empty")
        parts.append(details(f"{where} — {len(items)} failed", body, open_=i == 0))
    return join(parts) if parts else tag("p", "no failure recorded yet", class_="empty")


def skill_page(run: SkillRun) -> tuple[str, Html]:
    task = str(run.config.get("task", run.root.name))
    models = (
        f"target {run.config.get('model', '?')}, analyst {run.config.get('optimizer_model', '?')}"
    )
    body = join(
        [
            _header(run.kind, run, task),
            tag("p", models, class_="sub"),
            _skill_cards(run),
            section("Learning curve", _skill_chart(run), "curve"),
            section(
                "Gate decisions",
                _gate_table(run.steps),
                "gate",
                "Each step's candidate skill is scored on val; the gate keeps it as the new "
                "best, keeps it as current without shipping it, or rejects it.",
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
                "Each candidate against the skill it was built from.",
            ),
            section("Usage per role", _usage_table(run.usage), "usage"),
            section(
                "Failures",
                _failure_groups(run.failures),
                "failures",
                "Examples the skill got wrong, with the scorer's feedback.",
            ),
            section("Config", config_table(run.config), "config"),
        ]
    )
    return f"selftaught {run.kind} · {task}", body


# ---- train: ReST-EM / SFT -------------------------------------------------------------------
def _rest_chart(run: RestRun) -> Html:
    rounds = run.rounds
    series = [
        Series(
            "samples solved (train)",
            [_pt(r.round, r.sample_solved, f"round {r.round} samples") for r in rounds[1:]],
            COLORS["orange"],
            error_bars=True,
            dashed=True,
        ),
        Series(
            "val",
            [_pt(r.round, r.val, f"round {r.round} val") for r in rounds],
            COLORS["blue"],
            band=True,
        ),
    ]
    if any(r.test for r in rounds):
        series.append(
            Series(
                "test",
                [_pt(r.round, r.test, f"round {r.round} test") for r in rounds],
                COLORS["purple"],
                band=True,
            )
        )
    elif run.base_test is not None or run.shipped_test is not None:
        x = run.best_round or 0
        series.append(
            Series(
                "test · base → shipped",
                [
                    _pt(0, run.base_test, "test, base model"),
                    _pt(x, run.shipped_test, f"test, shipped ({run.shipped})"),
                ],
                COLORS["purple"],
                line=False,
                error_bars=True,
                x_offset=0.06,
            )
        )
    marks = [
        Mark(
            r.round,
            r.val.value,
            "accept_new_best" if r.new_best else ("none" if not r.trained else "reject"),
            f"round {r.round}: "
            + ("new best on val" if r.new_best else r.reason or "not better than the best round"),
        )
        for r in rounds[1:]
        if r.val is not None
    ]
    labels = {
        "accept_new_best": "new best round (shipped if last best)",
        "reject": "not better than the best round",
        "none": "not trained",
    }
    metric = "mean soft score" if run.metric == "soft" else "accuracy"
    return Html(
        render_chart(
            Chart(
                "Samples, val and test per round",
                "round (0 = base model)",
                metric,
                series,
                marks,
                chart_id="learning-curve",
                mark_labels=labels,
                caption="Bands and bars are 95% confidence intervals.",
            )
        )
    )


def _rounds_table(run: RestRun) -> Html:
    rows = []
    for r in run.rounds:
        trained = "base" if r.round == 0 else ("yes" if r.trained else f"no: {r.reason}")
        loss = r.train.get("train_loss")
        rows.append(
            [
                r.round,
                r.label,
                r.samples,
                _cell(r.sample_solved),
                num(r.sample_truncated, 2),
                r.elite.get("kept"),
                trained,
                num(loss) if loss is not None else "–",
                _cell(r.val),
                _cell(r.test),
                badge("new best", "accept_new_best") if r.new_best else r.best_round,
                num(r.seconds, 1),
            ]
        )
    return table(
        [
            "round",
            "model",
            "samples",
            "samples solved",
            "truncated",
            "elite kept",
            "trained",
            "train loss",
            "val",
            "test",
            "best round",
            "seconds",
        ],
        rows,
        table_id="rounds-table",
        empty="no round has finished yet",
    )


def rest_page(run: RestRun) -> tuple[str, Html]:
    task = str(run.config.get("task", run.root.name))
    best = next((r.val for r in run.rounds if r.round == run.best_round), None)
    base_val = run.rounds[0].val if run.rounds else None
    total = f" of {run.total_rounds}" if run.total_rounds else ""
    body = join(
        [
            _header(f"train · {run.method}", run, task),
            tag("p", f"model {run.config.get('model', '?')}", class_="sub"),
            cards(
                [
                    (
                        "val-initial",
                        "val · base model",
                        num(base_val and base_val.value),
                        _ci(base_val),
                    ),
                    (
                        "val-best",
                        f"val · best round ({num(run.best_round)})",
                        num(best and best.value),
                        _ci(best),
                    ),
                    (
                        "test",
                        "test · base → shipped",
                        _change(run.base_test, run.shipped_test),
                        _ci(run.shipped_test),
                    ),
                    ("rounds", "rounds", f"{max(len(run.rounds) - 1, 0)}{total}", ""),
                    (
                        "shipped",
                        "shipped",
                        run.shipped or "–",
                        "the best round on val, never the last",
                    ),
                    (
                        "samples",
                        "samples generated",
                        num(sum(r.samples or 0 for r in run.rounds)),
                        "",
                    ),
                ]
            ),
            section("Learning curve", _rest_chart(run), "curve"),
            section(
                "Rounds",
                _rounds_table(run),
                "rounds",
                "Each round samples, keeps the elite, fine-tunes and is gated on val: a round "
                "is shipped only when it beats the best so far.",
            ),
            section("Config", config_table(run.config), "config"),
        ]
    )
    return f"selftaught train {run.method} · {task}", body


# ---- train: GRPO / GSPO ---------------------------------------------------------------------
def _rl_charts(run: RLRun) -> Html:
    steps = run.steps
    x_end = steps[-1].step if steps else 1

    def series(key: str, name: str, color: str, **kw: Any) -> Series:
        return Series(
            name,
            [
                Point(
                    s.step,
                    s.values.get(key, math.nan),
                    tip=f"step {s.step} {name}: {num(s.values.get(key))}",
                )
                for s in steps
            ],
            color,
            **kw,
        )

    reward = Series(
        "mean reward (band: ± std within groups)",
        [
            Point(
                s.step,
                s.values.get("reward", math.nan),
                s.values.get("reward", 0) - s.values.get("reward_std", 0),
                s.values.get("reward", 0) + s.values.get("reward_std", 0),
                f"step {s.step} reward {num(s.values.get('reward'))} ± "
                f"{num(s.values.get('reward_std'))}",
            )
            if "reward_std" in s.values
            else Point(s.step, s.values.get("reward", math.nan))
            for s in steps
        ],
        COLORS["orange"],
        band=True,
    )
    evals = [
        Series(
            "val · start → trained",
            [
                _pt(0, run.base_val, "val, start model"),
                _pt(x_end, run.trained_val, "val, trained model"),
            ],
            COLORS["blue"],
            line=False,
            error_bars=True,
        ),
        Series(
            "test · start → shipped",
            [
                _pt(0, run.base_test, "test, start model"),
                _pt(x_end, run.shipped_test, f"test, shipped ({run.shipped})"),
            ],
            COLORS["purple"],
            line=False,
            error_bars=True,
            x_offset=0.08,
        ),
    ]
    flat = [
        Mark(
            s.step,
            s.values.get("reward", 0.0),
            "reject",
            "; ".join(s.warnings) or "every reward of this step was equal",
        )
        for s in steps
        if s.all_rewards_equal
    ]
    charts = [
        Chart(
            "Reward and held-out accuracy",
            "step",
            "reward / accuracy",
            [reward] + [e for e in evals if any(math.isfinite(p.y) for p in e.points)],
            flat,
            y_range=None,
            chart_id="learning-curve",
            mark_labels={"reject": "no learning signal (all rewards equal)"},
            caption="Val and test bars are 95% confidence intervals (start model at step 0, "
            "trained model at the last step).",
        ),
        Chart(
            "KL to the start model",
            "step",
            "KL",
            [series("kl", "KL", COLORS["green"])],
            y_range=None,
            chart_id="kl",
        ),
        Chart(
            "Completions",
            "step",
            "share",
            [
                series("truncated", "share truncated by the length cap", COLORS["vermillion"]),
                series(
                    "frac_groups_no_signal",
                    "share of groups with no signal",
                    COLORS["grey"],
                    dashed=True,
                ),
            ],
            chart_id="truncation",
        ),
        Chart(
            "Completion length",
            "step",
            "tokens",
            [series("completion_length", "mean completion length", COLORS["sky"])],
            y_range=None,
            chart_id="length",
        ),
    ]
    main, *small = charts
    for c in small:
        c.width, c.height = 480, 220
    return Html(render_chart(main)) + tag(
        "div", join(Html(render_chart(c)) for c in small), class_="chart-grid"
    )


def rl_page(run: RLRun) -> tuple[str, Html]:
    task = str(run.config.get("task", run.root.name))
    flat = sum(1 for s in run.steps if s.all_rewards_equal)
    total = f" of {run.total_steps}" if run.total_steps else ""
    keys = [
        "reward",
        "reward_std",
        "kl",
        "completion_length",
        "truncated",
        "frac_groups_no_signal",
        "loss",
    ]
    rows = [
        [s.step]
        + [num(s.values.get(k), 4) for k in keys]
        + [join(tag("div", badge("warning", "warn") + esc(" " + w)) for w in s.warnings)]
        for s in run.steps
    ]
    body = join(
        [
            _header(f"train · {run.method}", run, task),
            tag("p", f"model {run.config.get('model', '?')}", class_="sub"),
            cards(
                [
                    (
                        "val",
                        "val · start → trained",
                        _change(run.base_val, run.trained_val),
                        _ci(run.trained_val),
                    ),
                    (
                        "test",
                        "test · start → shipped",
                        _change(run.base_test, run.shipped_test),
                        _ci(run.shipped_test),
                    ),
                    ("steps", "steps logged", f"{len(run.steps)}{total}", ""),
                    ("flat", "steps with no signal", str(flat), "every reward equal"),
                    (
                        "shipped",
                        "shipped",
                        run.shipped or "–",
                        "the better of start and trained on val",
                    ),
                    ("step-seconds", "seconds per step", num(run.step_seconds, 2), ""),
                ]
            ),
            section("Learning curves", _rl_charts(run), "curve"),
            section(
                "Steps",
                table(
                    ["step"] + [k.replace("_", " ") for k in keys] + ["warnings"],
                    rows,
                    table_id="steps-table",
                    empty="no step logged yet",
                ),
                "steps",
            ),
            section("Config", config_table(run.config), "config"),
        ]
    )
    return f"selftaught train {run.method} · {task}", body


def render_body(run: Run) -> tuple[str, Html]:
    """(page title, body) for any run the adapters read."""
    if isinstance(run, SkillRun):
        return skill_page(run)
    if isinstance(run, RestRun):
        return rest_page(run)
    return rl_page(run)
