"""`selftaught watch` as a person sees it: headless Chromium (the system `chromium`, driven by
playwright; no browser download) opens the live page of a run while history rows are appended
to it, and the new steps, their gate decisions and the curve's marks appear without a reload;
the page says "finished" when the run ends. No console error, no request off the server."""

from __future__ import annotations

import json

import pytest

from selftaught.report.live import watch_in_background
from tests.test_report_browser import browser, pytestmark  # noqa: F401  (fixture, skip mark)
from tests.test_report_live import SECRET, Replay, finished_run  # noqa: F401  (fixture)

expect = pytest.importorskip("playwright.sync_api").expect
WAIT_MS = 20_000  # generous: the page polls every 0.2 s


def test_the_live_page_shows_new_steps_and_decisions_without_a_reload(  # noqa: F811
    finished_run,  # noqa: F811  (the fixtures imported above)
    tmp_path,
    browser,  # noqa: F811
):
    replay = Replay(finished_run, tmp_path / "run")

    def leak(row):
        if row.get("step") == 3:
            row["gate"]["reason"] += f" (reply held {SECRET})"
        return row

    replay.append(2)  # baseline and step 1 (accept)
    with watch_in_background(replay.root, interval_s=0.2) as url:
        page = browser.open(url)
        rows = page.locator("#history-body tr")
        rows.nth(1).wait_for(timeout=WAIT_MS)
        assert page.locator("#title").inner_text() == "selftaught optimize · toy"
        assert page.locator("#live").inner_text() == "live"
        assert rows.count() == 2
        assert page.locator('#history-body tr[data-key="1"] .badge').inner_text() == "accept"
        marks = page.locator("#learning-curve .mark")
        assert marks.count() == 1

        page.evaluate("window.__same_page = true")  # gone if the page reloads
        replay.append(2, edit=leak)  # step 2 (new best) and step 3 (reject)
        step3 = page.locator('#history-body tr[data-key="3"]')
        step3.wait_for(timeout=WAIT_MS)
        assert step3.locator(".badge").inner_text() == "reject"
        assert page.locator('#history-body tr[data-key="2"] .badge').inner_text() == "new best"
        why = step3.locator("td").last.inner_text()
        assert "[REDACTED:github_token]" in why and SECRET not in page.content()
        expect(marks).to_have_count(3, timeout=WAIT_MS)  # the page's CSP forbids eval
        kinds = [marks.nth(i).get_attribute("data-kind") for i in range(marks.count())]
        assert kinds == ["accept", "accept_new_best", "reject"]
        assert page.locator('[data-key="steps"] .v').inner_text().startswith("3")

        replay.append(1)
        replay.finish()
        expect(page.locator("#live")).to_have_text("finished", timeout=WAIT_MS)
        assert rows.count() == 5
        assert page.locator("#status").inner_text() == "finished: 4 steps"
        assert page.evaluate("window.__same_page") is True
        summary = json.loads((finished_run / "summary.json").read_text())
        assert page.locator('[data-key="calls"] .v').inner_text() == f"{summary['llm_calls']:,}"
        page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
    assert browser.errors == []
    assert all(u.startswith(url) for u in browser.requests), browser.requests
