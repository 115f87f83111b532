"""The report as a person sees it: headless Chromium (Debian's `chromium`, driven by the
`playwright` package with the system binary; no browser download) loads the page of a finished
scripted-model optimize run and of train runs. Checks: the charts are drawn with their data
points inside the plot, the summary numbers match history.jsonl, a collapsed diff opens on
click, no console error, no network request. A screenshot lands in the test's tmp dir."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from selftaught.report import write_report
from tests.report_fixtures import optimize_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium binary: install Debian's `chromium` package (.ci/run does)",
)
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class Browser:
    """One headless Chromium with a fresh profile; records console errors and requests."""

    def __init__(self, profile: Path):
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        self.context = self._pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=LAUNCH_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        self.errors: list[str] = []
        self.requests: list[str] = []

    def open(self, path: Path | str):
        """A page of a file, or of a URL (the live view's server)."""
        page = self.context.new_page()
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("request", lambda r: self.requests.append(r.url))
        page.goto(path if isinstance(path, str) else path.resolve().as_uri(), wait_until="load")
        return page

    def close(self) -> None:
        self.context.close()
        self._pw.stop()


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path / "profile")
    yield b
    b.close()


def drawn_points(page, chart: str, series: str) -> list[dict]:
    """Bounding boxes of a series' points, each checked to lie inside the chart's plot."""
    svg = page.locator(f"#{chart} svg").bounding_box()
    assert svg is not None and svg["width"] > 300 and svg["height"] > 100
    boxes = []
    locator = page.locator(f'#{chart} g.series[data-series="{series}"] circle.pt')
    for i in range(locator.count()):
        assert locator.nth(i).is_visible()
        box = locator.nth(i).bounding_box()
        assert svg["x"] <= box["x"] and box["x"] + box["width"] <= svg["x"] + svg["width"]
        assert svg["y"] <= box["y"] and box["y"] + box["height"] <= svg["y"] + svg["height"]
        boxes.append(box)
    return boxes


def card(page, key: str) -> str:
    return page.locator(f'[data-key="{key}"] .v').inner_text().strip()


def test_optimize_report_in_headless_chromium(tmp_path, browser):
    run = tmp_path / "run"
    optimize_run(run)
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    page = browser.open(write_report(run))

    assert page.title() == "selftaught optimize · toy"
    # the learning curve is drawn: one best-so-far point per history row, higher is better
    best = drawn_points(page, "learning-curve", "val · best skill so far")
    assert len(best) == len(rows)
    assert best[-1]["y"] < best[0]["y"]  # 8/11 is drawn above 0/11
    assert len(drawn_points(page, "learning-curve", "val · candidate of the step")) == 4
    marks = page.locator("#learning-curve .mark")
    kinds = [marks.nth(i).get_attribute("data-kind") for i in range(marks.count())]
    assert kinds == [r["gate"]["decision"] for r in rows[1:]]

    # the summary says what history.jsonl says
    best_val = [
        r["val"]["hard"]
        for r in rows
        if r["step"] == 0 or r["gate"]["decision"] == "accept_new_best"
    ][-1]
    assert card(page, "val-initial") == f"{rows[0]['val']['hard']:.3f}"
    assert card(page, "val-best") == f"{best_val:.3f}"
    decisions = Counter(r["gate"]["decision"] for r in rows[1:] if r["val"] is not None)
    assert card(page, "decisions") == (
        f"{decisions['accept_new_best']} new best · {decisions['accept']} accept · "
        f"{decisions['reject']} reject"
    )
    assert card(page, "steps") == f"{len(rows) - 1} of {len(rows) - 1}"
    assert card(page, "calls") == f"{summary['llm_calls']:,}"
    gate_rows = page.locator("#gate-table tbody tr")
    assert gate_rows.count() == len(rows) - 1
    assert [gate_rows.nth(i).locator(".badge").inner_text() for i in range(4)] == [
        "accept",
        "new best",
        "reject",
        "new best",
    ]

    # a collapsed diff (the rejected step) opens when clicked
    rejected = page.locator("#diffs details", has_text="step 3: v0002 → v0003")
    assert not rejected.locator("tr.add").is_visible()
    rejected.locator("summary").click()
    assert rejected.locator("tr.add").is_visible()
    assert "ALWAYS ANSWER 0" in rejected.locator("tr.add").inner_text()

    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000
    assert browser.errors == []
    assert all(url.startswith("file:") for url in browser.requests), browser.requests


def test_train_reports_in_headless_chromium(tmp_path, tmp_path_factory, browser):
    pytest.importorskip("torch")
    pytest.importorskip("trl")
    from tests.report_fixtures import rl_run, shared_rest_run

    rest = shared_rest_run(tmp_path_factory)
    page = browser.open(write_report(rest, tmp_path / "rest.html"))
    assert len(drawn_points(page, "learning-curve", "val")) == 3
    assert page.locator("#learning-curve .mark").count() == 2
    assert card(page, "val-best") == "0.750" and card(page, "shipped") == "round 1"
    assert page.locator("#rounds-table tbody tr").count() == 3
    page.screenshot(path=str(tmp_path / "rest.png"), full_page=True)

    rl_run(tmp_path / "grpo")
    page = browser.open(write_report(tmp_path / "grpo"))
    for chart, series in [
        ("learning-curve", "mean reward (band: ± std within groups)"),
        ("kl", "KL"),
        ("truncation", "share truncated by the length cap"),
        ("length", "mean completion length"),
    ]:
        assert len(drawn_points(page, chart, series)) == 3, chart
    assert page.locator("#steps-table .badge").count() == 2  # step 1's two warnings
    page.screenshot(path=str(tmp_path / "grpo.png"), full_page=True)
    assert browser.errors == []
    assert all(url.startswith("file:") for url in browser.requests), browser.requests
