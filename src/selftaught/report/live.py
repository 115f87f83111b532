"""`selftaught watch RUN_DIR`: the report's view of a run, live, on a page served on loopback.

The page polls `GET /api/state?since=N&gen=G&rev=R`. The server reads history.jsonl from the
byte offset it last stopped at (a half-written last line waits for its newline; a file rewritten
with another beginning is read again from the start: `gen` changes), keeps the rows in memory,
and builds the view with the report's own readers (`skill_run_from`, `rest_run_from`,
`rl_run_from`, without the per-step files), cards and charts. Only what changed leaves: the
rows after the client's cursor, and the cards, chart and status when `rev` moved. The small
files (config, state, summary, result, error) are re-read only when their stat changes.

Safety: the app sits behind `http_guard` (loopback Host and Origin only, an exact list of three
GET routes, no path or file parameter), binds 127.0.0.1 only, and everything it reads from the
run passes through the project's redaction (`redact.Redactor.redact_value`) as it is read, so
every text the page shows (and the charts built from it) is redacted. Files are read only under
RUN_DIR (a symlink out of it is not followed)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from selftaught.errors import RunError
from selftaught.http_guard import LOOPBACK, install_guard
from selftaught.redact import Redactor, default_redactor
from selftaught.report.candidates import FATE_TEXT
from selftaught.report.html import Html, cards, esc, page, tag
from selftaught.report.readers import (
    Estimate,
    ReportError,
    RestRun,
    RLRun,
    RunReader,
    RunStatus,
    SkillRun,
    detect_kind,
    night_notes,
    rest_run_from,
    rl_run_from,
    skill_run_from,
)
from selftaught.report.skill_page import DECISION_TEXT, skill_card_items, skill_chart, step_cost
from selftaught.report.train_pages import rest_card_items, rest_chart, rl_card_items, rl_charts

DEFAULT_INTERVAL_S = 2.0
LIVE_CSP = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; "
    "img-src data:"
)
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": LIVE_CSP + "; frame-ancestors 'none'",
}
ROUTES = frozenset({("GET", "/"), ("GET", "/live.js"), ("GET", "/api/state")})
# the files a view is built from besides history.jsonl (a change of any re-builds it)
SMALL_FILES = (
    "config.json",
    "state.json",
    "summary.json",
    "test_results.json",
    "error.json",
    "report.json",
    "result.json",
)
_TAIL_BYTES = 256  # the bytes before the offset, kept to notice a rewritten file
_BADGES = {"accept_new_best", "accept", "reject", "none", "warn"}


def _inside(root: Path, path: Path) -> bool:
    """`path` is under `root` once symlinks are resolved (nothing outside RUN_DIR is read)."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


@dataclass
class HistoryTail:
    """The rows of a JSONL file as it grows, read from the last offset: a half-written last
    line is left for the next read; a file that shrank or whose bytes before the offset
    changed (rewritten otherwise) is read again from the start (`read` says `reset`)."""

    path: Path
    offset: int = 0
    tail: bytes = b""
    bad_lines: int = 0

    def read(self) -> tuple[list[dict[str, Any]], bool]:
        """(new rows, whether the file was reset and the rows are all of them)."""
        try:
            f = open(self.path, "rb")  # noqa: SIM115  (closed below)
        except FileNotFoundError:
            reset = self.offset > 0
            self.offset, self.tail = 0, b""
            return [], reset
        with f:
            size = os.fstat(f.fileno()).st_size
            reset = size < self.offset or not self._same_before(f)
            if reset:
                self.offset, self.tail, self.bad_lines = 0, b"", 0
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n") + 1
        if end == 0:
            return [], reset
        rows = []
        for line in data[:end].splitlines():
            row = _row(line)
            if row is not None:
                rows.append(row)
            elif line.strip():
                self.bad_lines += 1
        self.offset += end
        self.tail = (self.tail + data[:end])[-_TAIL_BYTES:]
        return rows, reset

    def _same_before(self, f: Any) -> bool:
        if not self.tail:
            return True
        f.seek(self.offset - len(self.tail))
        return bool(f.read(len(self.tail)) == self.tail)


def _row(line: bytes) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except ValueError:  # not UTF-8 or not JSON
        return None
    return row if isinstance(row, dict) else None


class LiveReader(RunReader):
    """A `RunReader` for the live view: JSON files under RUN_DIR only, redacted as read, and
    read again only when their stat changed."""

    def __init__(self, root: Path, redactor: Redactor):
        super().__init__(root)
        self.redactor = redactor
        self._cache: dict[str, tuple[tuple[int, int, int], Any]] = {}

    def json(self, *parts: str) -> Any:
        name = "/".join(parts)
        key = self.stamp(name)
        if key is None:
            self._cache.pop(name, None)
            return None
        hit = self._cache.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        try:
            value = super().json(*parts)
        except ReportError:  # caught mid-write by a writer that is not atomic
            self.note(f"{name} is not valid JSON right now; read again on the next poll.")
            return None
        value = self.redactor.redact_value(value)[0]
        self._cache[name] = (key, value)
        return value

    def jsonl(self, *parts: str) -> list[dict[str, Any]]:
        return []  # history comes from HistoryTail; other JSONL files are report-only

    def text(self, *parts: str) -> str | None:
        return None  # skills and other text files are report-only

    def stamp(self, name: str) -> tuple[int, int, int] | None:
        path = self.root / name
        if not _inside(self.root, path):
            self.note(f"{name} leads outside the run directory and is not read.")
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino


@dataclass
class RowView:
    """One history row as the page's table shows it: `cells` in `columns` order; the second
    cell is drawn as a badge of kind `decision` when there is one."""

    key: int
    decision: str
    cells: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "decision": self.decision, "cells": self.cells}


@dataclass
class PageView:
    """What changes with `rev`: the header, cards, charts and the table's columns."""

    title: str
    path: str
    status: RunStatus
    notes: list[str]
    columns: list[str]
    cards: str
    chart: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "path": self.path,
            "status": {
                "text": self.status.text,
                "error": self.status.error,
                "finished": self.status.finished,
            },
            "notes": self.notes,
            "columns": self.columns,
            "cards": self.cards,
            "chart": self.chart,
        }


@dataclass
class LiveRun:
    """The live state of one run directory; `snapshot` is what `/api/state` answers.
    Thread-safe (the server answers polls on a thread pool)."""

    root: Path
    redactor: Redactor = field(default_factory=default_redactor)
    kind: str | None = None
    gen: int = 0
    rev: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    views: list[RowView] = field(default_factory=list)
    view: PageView | None = None
    finished: bool = False

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.reader = LiveReader(self.root, self.redactor)
        self.tail = HistoryTail(self.root / "history.jsonl")
        self._stamps: tuple[Any, ...] | None = None
        self._lock = threading.Lock()

    def snapshot(self, since: int = 0, gen: int = -1, rev: int = -1) -> dict[str, Any]:
        """The rows after `since` (all when `gen` is not the current one) and, when `rev`
        is not the current one, the page view."""
        with self._lock:
            self.refresh()
            reset = gen != self.gen
            start = 0 if reset else min(max(since, 0), len(self.views))
            out: dict[str, Any] = {
                "gen": self.gen,
                "rev": self.rev,
                "reset": reset,
                "cursor": len(self.views),
                "finished": self.finished,
                "rows": [v.to_dict() for v in self.views[start:]],
            }
            if (reset or rev != self.rev) and self.view is not None:
                out["view"] = self.view.to_dict()
            return out

    def refresh(self) -> None:
        """Read what the run wrote since the last call; re-build the view when it changed."""
        if self.kind is None:
            self.kind = self._detect()
        if self.kind is None:
            if self.view is None:
                self.view = self._waiting()
            return
        new, reset = self.tail.read() if _inside(self.root, self.tail.path) else ([], False)
        if reset:
            self.rows, self.views = [], []
            self.gen += 1
        self.rows += [self.redactor.redact_value(r)[0] for r in new]
        stamps = tuple(self.reader.stamp(n) for n in SMALL_FILES)
        if not new and not reset and stamps == self._stamps and self.view is not None:
            return
        self._stamps = stamps
        self._rebuild()
        self.rev += 1

    def _detect(self) -> str | None:
        try:
            return detect_kind(self.root)
        except ReportError:
            return None  # nothing written yet (or not a run yet): wait

    def _waiting(self) -> PageView:
        status = RunStatus(False, "waiting: the run has written nothing this page can read yet")
        return PageView(
            f"selftaught watch · {self.root.name}", self._path(), status, [], [], "", ""
        )

    def _path(self) -> str:
        return self.redactor.redact(str(self.root.resolve()))[0]

    def _rebuild(self) -> None:
        rd = self.reader
        rd.notes = []
        if self.kind in ("optimize", "sleep"):
            built = _skill_view(rd, self.rows, self.kind)
        elif self.kind == "rest":
            built = _rest_view(rd, self.rows)
        else:
            built = _rl_view(rd, self.rows)
        run, title, columns, card_html, chart, views = built
        if self.tail.bad_lines:
            rd.note(f"{self.tail.bad_lines} line(s) of history.jsonl are not JSON: left out.")
        self.views += [self._redacted(v) for v in views[len(self.views) :]]
        self.finished = run.status.finished
        status = RunStatus(
            run.status.finished,
            self.redactor.redact(run.status.text)[0],
            self.redactor.redact(run.status.error)[0] if run.status.error else None,
        )
        notes = [self.redactor.redact(n)[0] for n in rd.notes]
        self.view = PageView(title, self._path(), status, notes, columns, card_html, chart)

    def _redacted(self, view: RowView) -> RowView:
        cells = [self.redactor.redact(c)[0] for c in view.cells]
        return RowView(view.key, view.decision if view.decision in _BADGES else "", cells)


_Built = tuple[Any, str, list[str], str, str, list[RowView]]


def _est(e: Estimate | None) -> str:
    return e.text() if e is not None else "–"


def _budget_card(run: SkillRun) -> tuple[str, str, Any, str] | None:
    """What the run's budget (config `budget`) allows and how much of it the ledger used."""
    limits = run.config.get("budget")
    if not isinstance(limits, dict):
        return None
    usage = run.usage.values()
    used = {
        "calls": sum(int(u.get("calls") or 0) + int(u.get("errors") or 0) for u in usage),
        "tokens": sum(
            int(u.get("prompt_tokens") or 0) + int(u.get("completion_tokens") or 0) for u in usage
        ),
        "usd": sum(float(u.get("usd") or 0.0) for u in usage),
    }
    parts = [
        f"{used[k]:.4f} of {limits[k]} USD" if k == "usd" else f"{used[k]:,} of {limits[k]:,} {k}"
        for k in ("calls", "tokens", "usd")
        if isinstance(limits.get(k), (int, float))
    ]
    if not parts:
        unset = "no --budget-calls, --budget-tokens or --budget-usd set"
        return ("budget", "budget used", "no limit", unset)
    return ("budget", "budget used", " · ".join(parts), "as the run's usage ledger counts it")


def _skill_view(rd: LiveReader, rows: list[dict[str, Any]], kind: str) -> _Built:
    if _report_kind(rd) == "sleep-night":  # a night's staging folder, report.json at its end
        kind = "sleep"
    run = skill_run_from(rd, rows, kind, details=False)
    if kind == "sleep":
        run.notes[:0] = night_notes(rd)
    task = str(run.config.get("task", rd.root.name))
    items = skill_card_items(run)
    budget = _budget_card(run)
    views = []
    if rows:
        first = str(rows[0].get("skill_version") or "initial skill")
        base = _est(run.baseline)
        views.append(RowView(0, "", ["0", "baseline", base, base, first, "", ""]))
    for s in run.steps:
        decision = s.decision if s.val is not None else "none"
        candidate = f"{s.parent} → {s.candidate}" if s.candidate else "–"
        if len(s.candidates) > 1:  # each candidate of the step with its fate
            fates = (f"{c.version} {c.kind}: {FATE_TEXT.get(c.fate, c.fate)}" for c in s.candidates)
            candidate += " (" + "; ".join(fates) + ")"
        label = DECISION_TEXT.get(s.decision, s.decision) if s.val is not None else "no candidate"
        cells = [str(s.step), label, _est(s.val), _est(s.best_val), candidate]
        views.append(RowView(s.step, decision, [*cells, step_cost(s), s.reason]))
    return (
        run,
        f"selftaught {run.kind} · {task}",
        ["step", "gate", "val · candidate", "val · best", "candidate", "calls / tokens", "why"],
        cards(items + ([budget] if budget else [])),
        skill_chart(run),
        views,
    )


def _report_kind(rd: LiveReader) -> Any:
    report = rd.json("report.json")
    return report.get("kind") if isinstance(report, dict) else None


def _rest_view(rd: LiveReader, rows: list[dict[str, Any]]) -> _Built:
    run: RestRun = rest_run_from(rd, rows, details=False)
    views = [
        RowView(
            r.round,
            "accept_new_best" if r.new_best else "",
            [
                str(r.round),
                "new best" if r.new_best else ("base" if r.round == 0 else "kept out"),
                _est(r.val),
                str(r.best_round),
                _est(r.sample_solved),
                "base" if r.round == 0 else ("yes" if r.trained else f"no: {r.reason}"),
                "–" if r.seconds is None else f"{r.seconds:.1f}",
            ],
        )
        for r in run.rounds
    ]
    return (
        run,
        f"selftaught train {run.method} · {run.config.get('task', rd.root.name)}",
        ["round", "gate", "val", "best round", "samples solved", "trained", "seconds"],
        cards(rest_card_items(run)),
        rest_chart(run),
        views,
    )


def _rl_view(rd: LiveReader, rows: list[dict[str, Any]]) -> _Built:
    run: RLRun = rl_run_from(rd, rows)

    def value(step: Any, key: str) -> str:
        v = step.values.get(key)
        return "–" if v is None else f"{v:.4g}"

    keys = ["reward", "reward_std", "kl", "completion_length", "truncated"]
    views = [
        RowView(
            s.step,
            "reject" if s.all_rewards_equal else "",
            [str(s.step), "no signal" if s.all_rewards_equal else "ok"]
            + [value(s, k) for k in keys]
            + ["; ".join(s.warnings)],
        )
        for s in run.steps
    ]
    return (
        run,
        f"selftaught train {run.method} · {run.config.get('task', rd.root.name)}",
        ["step", "signal", "reward", "reward std", "KL", "length", "truncated", "warnings"],
        cards(rl_card_items(run)),
        rl_charts(run),
        views,
    )


# ---- the page and the server ------------------------------------------------------------
def live_page(interval_s: float) -> str:
    """The page: empty panels the script fills from `/api/state` (no run text in it)."""
    body = tag(
        "div",
        Html(
            tag("h1", "selftaught watch", id="title")
            + tag(
                "p",
                tag("span", "", id="run-path")
                + Html(" · ")
                + tag("span", "connecting", id="live", class_="badge b-none")
                + Html(" ")
                + tag("span", "", id="updated"),
                class_="sub",
            )
            + tag("div", "loading…", id="status", class_="status unfinished")
            + tag("ul", "", id="notes", class_="notes")
            + tag("div", "", id="cards")
            + tag("section", tag("h2", "Learning curve") + tag("div", "", id="chart"), id="curve")
            + tag(
                "section",
                tag("h2", "History")
                + tag(
                    "div",
                    tag(
                        "table",
                        tag("thead", tag("tr", "", id="history-head"))
                        + tag("tbody", "", id="history-body"),
                        id="history-table",
                    ),
                    class_="scroll",
                ),
                id="history",
            )
            + Html(
                "<noscript>This page updates with JavaScript; `selftaught report RUN_DIR` "
                "writes a static page.</noscript>"
            )
        ),
        id="live-root",
        data_interval_ms=str(max(int(interval_s * 1000), 100)),
    )
    script = Html('<script src="/live.js" defer></script>')
    return page("selftaught watch", esc(body) + script, csp=LIVE_CSP)


def live_script() -> str:
    return resources.files("selftaught.report").joinpath("live.js").read_text("utf-8")


def create_watch_app(
    run_dir: str | Path,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    redactor: Redactor | None = None,
) -> Any:
    """The FastAPI app of `selftaught watch`: GET /, /live.js and /api/state, nothing else,
    behind the loopback guard."""
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse, Response

    if not interval_s > 0:
        raise ReportError(f"--interval must be above 0 seconds, got {interval_s}")
    live = LiveRun(Path(run_dir), redactor or default_redactor())
    html, script = live_page(interval_s), live_script()
    app = FastAPI(title="selftaught watch", docs_url=None, redoc_url=None, openapi_url=None)
    install_guard(app, allow_remote=False, max_body_bytes=1024, routes=ROUTES)

    @app.get("/")
    def index() -> HTMLResponse:
        return HTMLResponse(html, headers=HEADERS)

    @app.get("/live.js")
    def js() -> Response:
        return Response(script, media_type="text/javascript", headers=HEADERS)

    @app.get("/api/state")
    def state(since: int = 0, gen: int = -1, rev: int = -1) -> Response:
        # ASCII JSON: a lone surrogate a run recorded (valid JSON) travels as `\ud800`
        # instead of failing UTF-8 encoding on every poll
        body = json.dumps(live.snapshot(since, gen, rev), ensure_ascii=True)
        return Response(body, media_type="application/json", headers=HEADERS)

    app.state.live = live
    return app


def check_run_dir(run_dir: str | Path) -> Path:
    path = Path(run_dir)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise ReportError(f"run directory {path} {what}; give the folder a run writes into")
    return path


def _listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, port))
    except OSError as err:
        sock.close()
        raise RunError(
            f"could not listen on {LOOPBACK}:{port} ({err.strerror or err}); pick another "
            "--port, or 0 for a free one"
        ) from None
    return sock


def _server(run_dir: str | Path, port: int, interval_s: float) -> tuple[Any, socket.socket, str]:
    import uvicorn

    app = create_watch_app(check_run_dir(run_dir), interval_s=interval_s)
    sock = _listen(port)
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    url = f"http://{LOOPBACK}:{sock.getsockname()[1]}/"
    return uvicorn.Server(config), sock, url


def serve_watch(
    run_dir: str | Path,
    *,
    port: int = 0,
    interval_s: float = DEFAULT_INTERVAL_S,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the live page of `run_dir` on 127.0.0.1 (`port` 0: a free one) until
    interrupted; `on_ready` gets the page's URL before the first request is answered."""
    server, sock, url = _server(run_dir, port, interval_s)
    if on_ready is not None:
        on_ready(url)
    with sock:
        server.run(sockets=[sock])


@contextlib.contextmanager
def watch_in_background(
    run_dir: str | Path,
    *,
    port: int = 0,
    interval_s: float = DEFAULT_INTERVAL_S,
    startup_timeout_s: float = 30.0,
) -> Iterator[str]:
    """The live page served from a thread for the block; yields its URL (tests, notebooks)."""
    server, sock, url = _server(run_dir, port, interval_s)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="selftaught-watch", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RunError(f"the watch server did not start on {url}")
            time.sleep(0.02)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
