"""Sections of the optimize page about what each step tried: every candidate with its fate,
the shipped skill's worked examples with the demo candidates and the leaks refused, and the
demonstrations a candidate added or removed (shown beside its rules diff)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from selftaught.report.candidates import FATE_TEXT, CandidateView, DemoView
from selftaught.report.html import Html, badge, details, join, num, table, tag
from selftaught.report.readers import SkillRun, SkillStep

CLIP = 400  # characters of a demo's input or reply shown (the skill file has them whole)


def clip(text: str, limit: int = CLIP) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more)"


def _demo_list(c: CandidateView, shipped: set[str]) -> Html:
    if not c.demos:
        return Html("none")
    items = []
    for label, demo_id in zip(c.demos, c.demo_ids, strict=True):
        mark = badge("shipped", "accepted_new_best") if demo_id in shipped else Html("")
        items.append(tag("li", join([tag("code", label), " ", mark])))
    return tag("ul", join(items), class_="plain")


def _step_cell(s: SkillStep) -> Html:
    d = s.demo_stats
    lines = [tag("b", s.step), tag("div", f"parent {s.parent}", class_="d")]
    if d:
        lines.append(
            tag(
                "div",
                f"demo pool {d.get('pool', '?')} (+{d.get('new', 0)} new), "
                f"{d.get('leaks_refused', 0)} leaks refused",
                class_="d",
            )
        )
    if s.pool is not None:
        lines.append(tag("div", f"gated pool: {', '.join(s.pool)}", class_="d"))
    return join(lines)


def candidates_table(run: SkillRun) -> Html:
    shipped = {d.id for d in run.shipped_demos}
    rows = []
    for s in run.steps:
        for i, c in enumerate(s.candidates):
            rows.append(
                [
                    _step_cell(s) if i == 0 else Html(""),
                    tag("b", c.version) + tag("div", c.kind, class_="d"),
                    c.why,
                    _demo_list(c, shipped),
                    num(c.screen),
                    num(c.val),
                    badge(FATE_TEXT.get(c.fate, c.fate), c.fate) + tag("div", c.reason),
                ]
            )
    if not rows and run.steps:
        return tag(
            "p",
            "This run recorded no candidates per step (it was written before the candidate "
            "search); each step's single candidate is in the decisions table.",
            class_="empty",
        )
    return table(
        [
            "step",
            "candidate",
            "what was done",
            "its demonstrations",
            "screen (val subset)",
            "full val (hard)",
            "fate and why",
        ],
        rows,
        table_id="candidates-table",
        empty="no step has finished yet",
    )


def _demo_rows(demos: Sequence[DemoView], extra: dict[str, str] | None = None) -> list[list[str]]:
    return [
        [tag("code", d.id), d.source, tag("pre", clip(d.input)), tag("pre", clip(d.reply))]
        + ([extra.get(d.id, "")] if extra is not None else [])
        for d in demos
    ]


def worked_examples(run: SkillRun) -> Html:
    """The shipped skill's demonstrations, the leaks refused, and every demo candidate with
    how often a step tried it."""
    parts = []
    if run.shipped_demos:
        where = (
            "as prior user/assistant turns"
            if run.shipped_placement == "turns"
            else "as a section of the system prompt"
        )
        parts.append(
            tag(
                "p",
                f"The shipped skill ({run.best_version}) shows {len(run.shipped_demos)} "
                f"worked example(s) {where}.",
            )
        )
        parts.append(
            table(
                ["train id", "source", "input", "reply"],
                _demo_rows(run.shipped_demos),
                table_id="demos-table",
            )
        )
    else:
        parts.append(tag("p", "The shipped skill has no worked examples.", class_="empty"))
    if run.leaks:
        rows = [[tag("code", x.demo_id), tag("code", x.held_out_id), x.split] for x in run.leaks]
        parts.append(tag("h3", "Leaks refused"))
        parts.append(
            tag(
                "p",
                "Train examples that are the same item as a held-out input (a rewording, "
                "not another instance of a template) never became demo candidates.",
                class_="intro",
            )
        )
        parts.append(
            table(["train id", "held-out id it copies", "split"], rows, table_id="leaks-table")
        )
    if run.demo_pool:
        tried = Counter(i for s in run.steps for c in s.candidates for i in set(c.demo_ids))
        shipped = {d.id for d in run.shipped_demos}
        fate = {
            d.id: ("shipped · " if d.id in shipped else "") + f"in {tried[d.id]} candidate(s)"
            for d in run.demo_pool
        }
        body = table(
            ["train id", "source", "input", "reply", "tried"],
            _demo_rows(run.demo_pool, fate),
            table_id="demo-pool-table",
        )
        parts.append(details(f"demo candidates found on train: {len(run.demo_pool)}", body))
    return join(parts)


def demo_changes(added: Sequence[DemoView], removed: Sequence[DemoView]) -> Html:
    """The demonstrations a candidate added and removed, listed beside its rules diff."""
    if not added and not removed:
        return Html("")
    items = [
        tag(
            "li",
            join(
                [
                    tag("span", sign, class_=cls),
                    " ",
                    tag("code", d.label),
                    " ",
                    tag("span", clip(d.input, 120), class_="d"),
                ]
            ),
        )
        for sign, cls, group in (("+ demo", "add", added), ("− demo", "del", removed))
        for d in group
    ]
    return tag("ul", join(items), class_="demo-changes")
