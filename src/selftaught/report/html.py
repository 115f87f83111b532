"""HTML building blocks for the report: escaping, tables, summary cards, skill diffs, and the
page shell (a package-data template with inline CSS: the page needs no network to view).

Everything a run wrote (skills, replies, feedback, edits, config) is model- or user-written,
so every value is escaped unless it is an `Html` fragment built here."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from html import escape
from importlib import resources
from string import Template
from typing import Any


class Html(str):
    """A fragment that is already safe HTML (built by this package, never run text). Adding
    plain text to it escapes that text, so `Html + str` stays safe."""

    def __add__(self, other: Any) -> Html:
        return Html(str.__add__(self, esc(other)))

    def __radd__(self, other: Any) -> Html:
        return Html(str.__add__(esc(other), self))


def esc(value: Any) -> Html:
    if isinstance(value, Html):
        return value
    return Html(escape("" if value is None else str(value), quote=True))


def join(parts: Iterable[Any]) -> Html:
    return Html("".join(esc(p) for p in parts))


def tag(name: str, body: Any = "", **attrs: Any) -> Html:
    """<name attrs>body</name>; attribute names use `_` for `-` and a trailing `_` for keywords."""
    rendered = "".join(
        f' {k.rstrip("_").replace("_", "-")}="{escape(str(v), quote=True)}"'
        for k, v in attrs.items()
        if v is not None and v is not False
    )
    return Html(f"<{name}{rendered}>{esc(body)}</{name}>")


def num(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return "–" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    cls: str = "",
    table_id: str | None = None,
    empty: str = "nothing to show",
) -> Html:
    head = join(tag("th", h) for h in headers)
    body = [join(tag("td", c) for c in row) for row in rows]
    if not body:
        return tag("p", empty, class_="empty")
    trs = join(tag("tr", r) for r in body)
    body_html = Html(f"<thead><tr>{head}</tr></thead><tbody>{trs}</tbody>")
    return tag("div", tag("table", body_html, class_=cls or None, id=table_id), class_="scroll")


def cards(items: Sequence[tuple[str, str, Any, str]]) -> Html:
    """Summary cards: (key, label, value, detail); `data-key` lets a test find each one."""
    return tag(
        "div",
        join(
            tag(
                "div",
                join([tag("div", label, class_="k"), tag("div", value, class_="v")])
                + (tag("div", detail, class_="d") if detail else Html("")),
                class_="card",
                data_key=key,
            )
            for key, label, value, detail in items
        ),
        class_="cards",
        id="summary",
    )


def section(title: str, body: Any, section_id: str, intro: str = "") -> Html:
    return tag(
        "section",
        tag("h2", title) + (tag("p", intro, class_="intro") if intro else Html("")) + esc(body),
        id=section_id,
    )


def details(summary: Any, body: Any, *, open_: bool = False, cls: str = "") -> Html:
    return tag("details", tag("summary", summary) + esc(body), open=open_, class_=cls or None)


def badge(text: str, kind: str) -> Html:
    return tag("span", text, class_=f"badge b-{kind}")


def pre(text: str, cls: str = "") -> Html:
    return tag("pre", text, class_=cls or None)


def diff_html(old: str, new: str, context: int = 3) -> Html:
    """A unified line diff (difflib) as a table: removed lines red, added green, with line
    numbers of both versions and `context` unchanged lines around each change."""
    a, b = old.splitlines(), new.splitlines()
    rows: list[Html] = []

    def row(cls: str, la: Any, lb: Any, sign: str, text: str) -> None:
        rows.append(
            tag(
                "tr",
                join(
                    [
                        tag("td", la, class_="ln"),
                        tag("td", lb, class_="ln"),
                        tag("td", sign, class_="sign"),
                        tag("td", text, class_="txt"),
                    ]
                ),
                class_=cls,
            )
        )

    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        first = group[0]
        row("hunk", "", "", "", f"@@ line {first[1] + 1} → {first[3] + 1} @@")
        for op, i1, i2, j1, j2 in group:
            if op == "equal":
                for k in range(i2 - i1):
                    row("ctx", i1 + k + 1, j1 + k + 1, " ", a[i1 + k])
                continue
            for k in range(i1, i2):
                row("del", k + 1, "", "−", a[k])
            for k in range(j1, j2):
                row("add", "", k + 1, "+", b[k])
    if not rows:
        return tag("p", "no change", class_="empty")
    return tag("table", join(rows), class_="diff")


def config_table(config: dict[str, Any]) -> Html:
    def value(v: Any) -> Html:
        if isinstance(v, (dict, list)):
            return tag("code", json.dumps(v, ensure_ascii=False, sort_keys=True))
        return tag("code", "null" if v is None else json.dumps(v, ensure_ascii=False))

    return table(
        ["setting", "value"],
        [(k, value(v)) for k, v in config.items()],
        cls="config",
        empty="config.json is missing",
    )


REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
"""The static report's policy: no script, no network (the page can be mailed)."""


def page(title: str, body: Html, *, csp: str = REPORT_CSP) -> str:
    """The whole page; `csp` is its Content-Security-Policy (the live view allows its own
    script and polling of its own server, nothing else)."""
    template = resources.files("selftaught.report").joinpath("template.html").read_text("utf-8")
    return Template(template).substitute(
        title=escape(title), body=body, csp=escape(csp, quote=True)
    )
