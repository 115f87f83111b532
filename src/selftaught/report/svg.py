"""Inline SVG line charts for the HTML report: lines, 95% CI bands or error bars, point
tooltips and decision marks. Hand-written so a report needs no plotting dependency and no
script at view time; every point is an element a browser test (or a person) can find."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from html import escape

WIDTH, HEIGHT = 760, 280
LEFT, RIGHT, TOP, BOTTOM = 56, 20, 16, 42

# colour-blind-safe palette (Okabe-Ito)
COLORS = {
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
    "grey": "#888888",
    "black": "#222222",
}
MARK_COLORS = {
    "accept_new_best": COLORS["green"],
    "accept": COLORS["blue"],
    "reject": COLORS["vermillion"],
    "none": COLORS["grey"],
}
MARK_LABELS = {
    "accept_new_best": "gate: new best",
    "accept": "gate: accept (not shipped)",
    "reject": "gate: reject",
    "none": "no candidate (empty patch)",
}


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    lo: float | None = None  # 95% interval, when known
    hi: float | None = None
    tip: str = ""  # hover text


@dataclass
class Series:
    name: str
    points: list[Point]
    color: str = COLORS["blue"]
    line: bool = True
    step: bool = False  # draw as a step function (a value that holds until it changes)
    band: bool = False  # the interval as a shaded band
    error_bars: bool = False  # the interval as vertical bars
    dashed: bool = False
    show_points: bool = True
    x_offset: float = 0.0  # drawn beside the x it belongs to, so bars at one x do not overlap


@dataclass(frozen=True)
class Mark:
    """A decision drawn on the curve: accept_new_best, accept, reject or none."""

    x: float
    y: float
    kind: str
    tip: str = ""


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    marks: list[Mark] = field(default_factory=list)
    y_range: tuple[float, float] | None = (0.0, 1.0)  # None: fit the data
    chart_id: str = ""
    caption: str = ""
    mark_labels: dict[str, str] = field(default_factory=lambda: dict(MARK_LABELS))
    height: int = HEIGHT
    width: int = WIDTH


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"


def _nice_ticks(lo: float, hi: float, max_ticks: int = 6) -> list[float]:
    span = hi - lo
    raw = span / max(1, max_ticks - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], first
    while t <= hi + 1e-9 * step:
        ticks.append(round(t, 10))
        t += step
    return ticks


def _x_ticks(lo: float, hi: float, max_ticks: int = 12) -> list[float]:
    step = max(1, math.ceil((hi - lo) / max_ticks))
    return [float(v) for v in range(math.ceil(lo), math.floor(hi) + 1, step)]


def _y_extent(chart: Chart) -> tuple[float, float]:
    if chart.y_range is not None:
        return chart.y_range
    values = [
        v
        for s in chart.series
        for p in s.points
        for v in (p.y, p.lo, p.hi)
        if v is not None and math.isfinite(v)
    ] + [m.y for m in chart.marks]
    if not values:
        return 0.0, 1.0
    lo, hi = min(values), max(values)
    if lo == hi:
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.08
    return (0.0 if lo >= 0 and lo - pad < 0 else lo - pad), hi + pad


class _Scale:
    def __init__(self, chart: Chart):
        xs = [p.x for s in chart.series for p in s.points] + [m.x for m in chart.marks]
        self.x0, self.x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        if self.x0 == self.x1:
            self.x0, self.x1 = self.x0 - 1, self.x1 + 1
        pad = (self.x1 - self.x0) * 0.03
        self.x0, self.x1 = self.x0 - pad, self.x1 + pad
        self.y0, self.y1 = _y_extent(chart)
        self.height = chart.height
        self.width = chart.width

    def x(self, v: float) -> float:
        return LEFT + (v - self.x0) / (self.x1 - self.x0) * (self.width - LEFT - RIGHT)

    def y(self, v: float) -> float:
        v = min(max(v, self.y0), self.y1)
        return (
            self.height
            - BOTTOM
            - (v - self.y0) / (self.y1 - self.y0) * (self.height - TOP - BOTTOM)
        )


def _axes(chart: Chart, sc: _Scale) -> list[str]:
    out = []
    height = sc.height
    bottom, right = height - BOTTOM, sc.width - RIGHT
    for t in _nice_ticks(sc.y0, sc.y1, max_ticks=6 if height >= 240 else 4):
        y = sc.y(t)
        out.append(f'<line class="grid" x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">')
        out.append(f"{_fmt(t)}</text>")
    for t in _x_ticks(sc.x0, sc.x1, max_ticks=12 if sc.width >= 600 else 7):
        x = sc.x(t)
        out.append(
            f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}"/>'
        )
        out.append(f'<text class="tick" x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">')
        out.append(f"{int(t)}</text>")
    out.append(f'<line class="axis" x1="{LEFT}" x2="{right}" y1="{bottom}" y2="{bottom}"/>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}"/>')
    out.append(
        f'<text class="label" x="{(LEFT + right) / 2:.1f}" y="{height - 6}" '
        f'text-anchor="middle">{escape(chart.x_label)}</text>'
    )
    mid = (TOP + bottom) / 2
    out.append(
        f'<text class="label" x="14" y="{mid:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {mid:.1f})">{escape(chart.y_label)}</text>'
    )
    return out


def _segments(points: Sequence[Point]) -> list[list[Point]]:
    """Runs of finite points; a missing value breaks the line."""
    runs: list[list[Point]] = [[]]
    for p in points:
        if math.isfinite(p.y):
            runs[-1].append(p)
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def _path(points: Sequence[Point], sc: _Scale, step: bool) -> str:
    coords: list[str] = []
    prev_y: float | None = None
    for p in points:
        x, y = sc.x(p.x), sc.y(p.y)
        if step and prev_y is not None:
            coords.append(f"{x:.1f},{prev_y:.1f}")
        coords.append(f"{x:.1f},{y:.1f}")
        prev_y = y
    return " ".join(coords)


def _series(s: Series, index: int, sc: _Scale) -> list[str]:
    off = s.x_offset
    if off:
        s = replace(
            s,
            points=[replace(p, x=p.x + s.x_offset) for p in s.points],
            x_offset=0.0,
        )
    name = escape(s.name)
    out = [f'<g class="series" data-series="{name}" data-index="{index}">']
    with_ci = [  # (x, lo, hi)
        (p.x, p.lo, p.hi)
        for p in s.points
        if p.lo is not None and p.hi is not None and math.isfinite(p.y)
    ]
    if s.band and len(with_ci) > 1:
        upper = _path([Point(x, hi) for x, _, hi in with_ci], sc, s.step)
        lower = _path([Point(x, lo) for x, lo, _ in reversed(with_ci)], sc, False)
        if s.step:  # the lower edge of a step band must step too
            lower = _path([Point(x, lo) for x, lo, _ in with_ci], sc, True)
            lower = " ".join(reversed(lower.split()))
        out.append(f'<polygon class="band" fill="{s.color}" points="{upper} {lower}"/>')
    if s.error_bars:
        for at, lo, hi in with_ci:
            x, y_lo, y_hi = sc.x(at), sc.y(lo), sc.y(hi)
            out.append(
                f'<path class="errbar" stroke="{s.color}" d="M{x - 3:.1f},{y_hi:.1f}h6'
                f'M{x:.1f},{y_hi:.1f}V{y_lo:.1f}M{x - 3:.1f},{y_lo:.1f}h6"/>'
            )
    if s.line:
        dash = ' stroke-dasharray="5 4"' if s.dashed else ""
        for run in _segments(s.points):
            if len(run) > 1:
                out.append(
                    f'<polyline class="line" stroke="{s.color}"{dash} '
                    f'points="{_path(run, sc, s.step)}"/>'
                )
    if s.show_points:
        for p in s.points:
            if not math.isfinite(p.y):
                continue
            tip = escape(p.tip or f"{s.name}: {_fmt(p.y)} at {_fmt(p.x)}")
            out.append(
                f'<circle class="pt" r="3.5" fill="{s.color}" cx="{sc.x(p.x):.1f}" '
                f'cy="{sc.y(p.y):.1f}" data-x="{p.x - off:g}" data-y="{p.y:.6g}">'
                f"<title>{tip}</title></circle>"
            )
    out.append("</g>")
    return out


def _mark(m: Mark, sc: _Scale) -> str:
    x, y = sc.x(m.x), sc.y(m.y)
    color = MARK_COLORS.get(m.kind, COLORS["grey"])
    tip = f"<title>{escape(m.tip)}</title>" if m.tip else ""
    attrs = f'class="mark mark-{escape(m.kind)}" data-x="{m.x:g}" data-kind="{escape(m.kind)}"'
    if m.kind == "accept_new_best":  # a star: the skill that would ship
        pts = " ".join(
            f"{x + r * math.sin(a):.1f},{y - r * math.cos(a):.1f}"
            for i in range(10)
            for r, a in [((8 if i % 2 == 0 else 3.5), i * math.pi / 5)]
        )
        return f'<polygon {attrs} fill="{color}" points="{pts}">{tip}</polygon>'
    if m.kind == "reject":  # a cross
        return (
            f'<path {attrs} stroke="{color}" stroke-width="2.5" fill="none" '
            f'd="M{x - 5:.1f},{y - 5:.1f}L{x + 5:.1f},{y + 5:.1f}M{x - 5:.1f},{y + 5:.1f}'
            f'L{x + 5:.1f},{y - 5:.1f}">{tip}</path>'
        )
    return (
        f'<circle {attrs} r="6" fill="none" stroke="{color}" stroke-width="2" '
        f'cx="{x:.1f}" cy="{y:.1f}">{tip}</circle>'
    )


def _swatch_class(s: Series) -> str:
    if not s.line:
        return " dot"
    return " dashed" if s.dashed else ""


def render_chart(chart: Chart) -> str:
    """A <figure> holding the SVG and its legend (plain HTML, so it wraps on narrow pages)."""
    sc = _Scale(chart)
    body = _axes(chart, sc)
    for i, s in enumerate(chart.series):
        body += _series(s, i, sc)
    body += [_mark(m, sc) for m in chart.marks]
    legend = "".join(
        f'<li><span class="swatch{_swatch_class(s)}" '
        f'style="--c:{s.color}"></span>{escape(s.name)}</li>'
        for s in chart.series
    )
    kinds = sorted({m.kind for m in chart.marks}, key=list(MARK_COLORS).index)
    legend += "".join(
        f'<li><span class="swatch mark-{k}" style="--c:{MARK_COLORS[k]}"></span>'
        f"{escape(chart.mark_labels[k])}</li>"
        for k in kinds
        if k in chart.mark_labels
    )
    cid = f' id="{escape(chart.chart_id)}"' if chart.chart_id else ""
    caption = f"<p class=caption>{escape(chart.caption)}</p>" if chart.caption else ""
    return (
        f'<figure class="chart"{cid}><figcaption>{escape(chart.title)}</figcaption>'
        f'<svg class="chart" viewBox="0 0 {chart.width} {chart.height}" role="img" '
        f'aria-label="{escape(chart.title)}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(body)
        + f'</svg><ul class="legend">{legend}</ul>{caption}</figure>'
    )
