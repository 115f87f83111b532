"""The pages of `train` runs: ReST-EM / SFT (one row per round, round 0 = the base model)
and GRPO / GSPO (one row per logged step)."""

from __future__ import annotations

import math
from typing import Any

from selftaught.report.html import (
    Html,
    badge,
    cards,
    config_table,
    esc,
    join,
    num,
    section,
    table,
    tag,
)
from selftaught.report.parts import change, ci_text, estimate_cell, failure_groups, header, point
from selftaught.report.readers import RestRun, RLRun, RLStep
from selftaught.report.svg import COLORS, Chart, Mark, Point, Series, render_chart


# ---- train: ReST-EM / SFT -------------------------------------------------------------------
def rest_chart(run: RestRun) -> Html:
    rounds = run.rounds
    series = [
        Series(
            "samples solved (train)",
            [point(r.round, r.sample_solved, f"round {r.round} samples") for r in rounds[1:]],
            COLORS["orange"],
            error_bars=True,
            dashed=True,
        ),
        Series(
            "val",
            [point(r.round, r.val, f"round {r.round} val") for r in rounds],
            COLORS["blue"],
            band=True,
        ),
    ]
    if any(r.test for r in rounds):
        series.append(
            Series(
                "test",
                [point(r.round, r.test, f"round {r.round} test") for r in rounds],
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
                    point(0, run.base_test, "test, base model"),
                    point(x, run.shipped_test, f"test, shipped ({run.shipped})"),
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
                estimate_cell(r.sample_solved),
                num(r.sample_truncated, 2),
                r.elite.get("kept"),
                trained,
                num(loss) if loss is not None else "–",
                estimate_cell(r.val),
                estimate_cell(r.test),
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


def rest_card_items(run: RestRun) -> list[tuple[str, str, Any, str]]:
    """The summary cards of a ReST / SFT run."""
    best = next((r.val for r in run.rounds if r.round == run.best_round), None)
    base_val = run.rounds[0].val if run.rounds else None
    total = f" of {run.total_rounds}" if run.total_rounds else ""
    return [
        (
            "val-initial",
            "val · base model",
            num(base_val and base_val.value),
            ci_text(base_val),
        ),
        (
            "val-best",
            f"val · best round ({num(run.best_round)})",
            num(best and best.value),
            ci_text(best),
        ),
        (
            "test",
            "test · base → shipped",
            change(run.base_test, run.shipped_test),
            ci_text(run.shipped_test),
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


def rest_page(run: RestRun) -> tuple[str, Html]:
    task = str(run.config.get("task", run.root.name))
    body = join(
        [
            header(f"train · {run.method}", run, task),
            tag("p", f"model {run.config.get('model', '?')}", class_="sub"),
            cards(rest_card_items(run)),
            section("Learning curve", rest_chart(run), "curve"),
            section(
                "Rounds",
                _rounds_table(run),
                "rounds",
                "Each round samples, keeps the elite, fine-tunes and is gated on val: a round "
                "is shipped only when it beats the best so far.",
            ),
            section(
                "Unsolved episodes",
                failure_groups(run.failures),
                "failures",
                "The last round's sampled episodes the task did not score solved: each tool "
                "call with its arguments and result, then the final answer.",
            )
            if run.failures
            else Html(""),
            section("Config", config_table(run.config), "config"),
        ]
    )
    return f"selftaught train {run.method} · {task}", body


# ---- train: GRPO / GSPO ---------------------------------------------------------------------
def _rl_series(run: RLRun, key: str, name: str, color: str, **kw: Any) -> Series:
    """One logged metric per step (a step that did not log it leaves a gap)."""
    pts = [
        Point(
            s.step,
            s.values.get(key, math.nan),
            tip=f"step {s.step} {name}: {num(s.values.get(key))}",
        )
        for s in run.steps
    ]
    return Series(name, pts, color, **kw)


_REWARD_COLORS = [COLORS["green"], COLORS["sky"], COLORS["vermillion"], COLORS["black"]]


def reward_names(run: RLRun) -> list[str]:
    """The reward functions whose means the steps logged (`rewards/<name>`), in order."""
    names: dict[str, None] = {}
    for s in run.steps:
        names.update(
            (k.removeprefix("rewards/"), None) for k in s.values if k.startswith("rewards/")
        )
    return list(names)


def _reward_label(run: RLRun, name: str) -> str:
    weights = run.config.get("rl", {}).get("rewards") or {}
    weight = weights.get(name) if isinstance(weights, dict) else None
    return f"{name} (weight {weight:g})" if isinstance(weight, int | float) else name


def _reward_point(step: RLStep) -> Point:
    v = step.values
    if "reward" not in v:
        return Point(step.step, math.nan)
    if "reward_std" not in v:
        return Point(step.step, v["reward"])
    tip = f"step {step.step} reward {num(v['reward'])} ± {num(v['reward_std'])}"
    return Point(
        step.step, v["reward"], v["reward"] - v["reward_std"], v["reward"] + v["reward_std"], tip
    )


def _rl_reward_chart(run: RLRun) -> Chart:
    """Reward per step (band: spread within groups, not a CI) with the start and trained
    models' val / test accuracy (95% CIs) at both ends."""
    x_end = run.steps[-1].step if run.steps else 1
    reward = Series(
        "mean reward (band: ± std within groups)",
        [_reward_point(s) for s in run.steps],
        COLORS["orange"],
        band=True,
    )
    evals = [
        Series(
            "val · start → trained",
            [
                point(0, run.base_val, "val, start model"),
                point(x_end, run.trained_val, "val, trained model"),
            ],
            COLORS["blue"],
            line=False,
            error_bars=True,
        ),
        Series(
            "test · start → shipped",
            [
                point(0, run.base_test, "test, start model"),
                point(x_end, run.shipped_test, f"test, shipped ({run.shipped})"),
            ],
            COLORS["purple"],
            line=False,
            error_bars=True,
            x_offset=0.08,
        ),
    ]
    names = reward_names(run)
    each = [  # one reward alone is the mean reward (times its weight): no second line
        _rl_series(
            run,
            f"rewards/{name}",
            f"mean {_reward_label(run, name)}",
            _REWARD_COLORS[i % len(_REWARD_COLORS)],
            dashed=True,
        )
        for i, name in enumerate(names)
        if len(names) > 1
    ]
    flat = [
        Mark(
            s.step,
            s.values.get("reward", 0.0),
            "reject",
            "; ".join(s.warnings) or "every reward was equal",
        )
        for s in run.steps
        if s.all_rewards_equal
    ]
    return Chart(
        "Reward and held-out accuracy",
        "step",
        "reward / accuracy",
        [reward, *each] + [e for e in evals if any(math.isfinite(p.y) for p in e.points)],
        flat,
        y_range=None,
        chart_id="learning-curve",
        mark_labels={"reject": "no learning signal (all rewards equal)"},
        caption="Val and test bars are 95% confidence intervals (start model at step 0, "
        "trained model at the last step).",
    )


def rl_charts(run: RLRun) -> Html:
    small = [
        Chart(
            "KL to the start model",
            "step",
            "KL",
            [_rl_series(run, "kl", "KL", COLORS["green"])],
            y_range=None,
            chart_id="kl",
        ),
        Chart(
            "Completions",
            "step",
            "share",
            [
                _rl_series(
                    run, "truncated", "share truncated by the length cap", COLORS["vermillion"]
                ),
                _rl_series(
                    run,
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
            [_rl_series(run, "completion_length", "mean completion length", COLORS["sky"])],
            y_range=None,
            chart_id="length",
        ),
    ]
    for c in small:
        c.width, c.height = 480, 220
    grid = tag("div", join(Html(render_chart(c)) for c in small), class_="chart-grid")
    return Html(render_chart(_rl_reward_chart(run))) + grid


def rl_card_items(run: RLRun) -> list[tuple[str, str, Any, str]]:
    """The summary cards of a GRPO / GSPO run."""
    flat = sum(1 for s in run.steps if s.all_rewards_equal)
    total = f" of {run.total_steps}" if run.total_steps else ""
    return [
        (
            "val",
            "val · start → trained",
            change(run.base_val, run.trained_val),
            ci_text(run.trained_val),
        ),
        (
            "test",
            "test · start → shipped",
            change(run.base_test, run.shipped_test),
            ci_text(run.shipped_test),
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


def rl_page(run: RLRun) -> tuple[str, Html]:
    task = str(run.config.get("task", run.root.name))
    names = reward_names(run)
    keys = [
        "reward",
        *(f"rewards/{name}" for name in names),
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
            header(f"train · {run.method}", run, task),
            tag("p", f"model {run.config.get('model', '?')}", class_="sub"),
            cards(rl_card_items(run)),
            section("Learning curves", rl_charts(run), "curve"),
            section(
                "Steps",
                table(
                    ["step"]
                    + [
                        _reward_label(run, k[8:])
                        if k.startswith("rewards/")
                        else k.replace("_", " ")
                        for k in keys
                    ]
                    + ["warnings"],
                    rows,
                    table_id="steps-table",
                    empty="no step logged yet",
                ),
                "steps",
                "reward is the weighted sum of the reward functions' means (one column each)."
                if names
                else "",
            ),
            section("Config", config_table(run.config), "config"),
        ]
    )
    return f"selftaught train {run.method} · {task}", body
