"""`selftaught watch`: the incremental history reader, the live state and its JSON endpoint
(rows appended while watching appear, a half-written line waits, secrets are redacted, a
foreign Host / Origin or any other path is refused), a real loopback server, and the CLI."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from selftaught.cli import app as cli_app
from selftaught.report.live import HistoryTail, LiveRun, create_watch_app, watch_in_background
from tests.report_fixtures import optimize_run, rl_run

SECRET = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"  # a GitHub token's shape


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished scripted optimize run (decisions accept, new best, reject, new best)."""
    root = tmp_path_factory.mktemp("live") / "run"
    optimize_run(root)
    return root


class Replay:
    """A run directory written row by row from a finished run, as a running trainer would:
    config first, then each history row (with its state), then summary.json at the end."""

    def __init__(self, source: Path, root: Path):
        self.source, self.root = source, root
        root.mkdir(parents=True)
        shutil.copy(source / "config.json", root / "config.json")
        self.lines = (source / "history.jsonl").read_text().splitlines(keepends=True)
        self.state = json.loads((source / "state.json").read_text())
        self.written = 0

    def row(self, i: int) -> dict[str, Any]:
        return json.loads(self.lines[i])

    def append(self, n: int = 1, edit: Any = None) -> None:
        with open(self.root / "history.jsonl", "a") as f:
            for line in self.lines[self.written : self.written + n]:
                f.write(line if edit is None else json.dumps(edit(json.loads(line))) + "\n")
        self.written += n
        state = {**self.state, "step": self.written - 1, "finished": False}
        (self.root / "state.json").write_text(json.dumps(state))

    def finish(self) -> None:
        shutil.copy(self.source / "summary.json", self.root / "summary.json")


# ---- the incremental reader -----------------------------------------------------------------
def test_tail_reads_only_new_rows_and_waits_for_a_half_written_line(tmp_path):
    path = tmp_path / "history.jsonl"
    tail = HistoryTail(path)
    assert tail.read() == ([], False)  # no file yet
    path.write_text('{"step": 0}\n{"step": 1}\n')
    assert tail.read() == ([{"step": 0}, {"step": 1}], False)
    assert tail.read() == ([], False)
    with open(path, "a") as f:
        f.write('{"step": 2}\n{"step": 3, "gate": {"decis')  # a writer caught mid-line
    assert tail.read() == ([{"step": 2}], False)
    offset = tail.offset
    assert tail.read() == ([], False) and tail.offset == offset  # still waiting, no error
    with open(path, "a") as f:
        f.write('ion": "reject"}}\n')
    assert tail.read() == ([{"step": 3, "gate": {"decision": "reject"}}], False)
    assert tail.bad_lines == 0


def test_tail_follows_an_atomic_rewrite_and_restarts_on_another_history(tmp_path):
    path = tmp_path / "history.jsonl"
    tail = HistoryTail(path)
    path.write_text('{"step": 0}\n')
    tail.read()
    # RunDir.append_history rewrites the whole file through a rename: same start, one more row
    tmp = tmp_path / "new"
    tmp.write_text('{"step": 0}\n{"step": 1}\n')
    tmp.replace(path)
    assert tail.read() == ([{"step": 1}], False)
    # another run's history in its place (same length or longer): read again from the start
    path.write_text('{"step": 9}\n{"step": 8}\n{"step": 7}\n')
    assert tail.read() == ([{"step": 9}, {"step": 8}, {"step": 7}], True)
    path.write_text('{"step": 5}\n')  # shorter
    assert tail.read() == ([{"step": 5}], True)
    path.write_text('{"step": 5}\nnot json\n[1]\n{"step": 6}\n')
    assert tail.read() == ([{"step": 6}], False)
    assert tail.bad_lines == 2


# ---- the live state -------------------------------------------------------------------------
def test_rows_appended_while_watching_appear_and_finished_is_said(finished_run, tmp_path):
    replay = Replay(finished_run, tmp_path / "run")
    live = LiveRun(replay.root)
    first = live.snapshot()
    assert first["rows"] == [] and not first["finished"]
    replay.append(2)  # baseline and step 1
    s = live.snapshot(first["cursor"], first["gen"], first["rev"])
    assert [r["key"] for r in s["rows"]] == [0, 1]
    assert (
        s["rows"][1]["decision"] == "accept" and s["view"]["title"] == "selftaught optimize · toy"
    )
    assert s["view"]["status"]["text"].startswith("not finished: 1 of")
    quiet = live.snapshot(s["cursor"], s["gen"], s["rev"])
    assert quiet["rows"] == [] and "view" not in quiet  # nothing new: nothing re-sent
    replay.append(2)
    s2 = live.snapshot(s["cursor"], s["gen"], s["rev"])
    assert [(r["key"], r["decision"]) for r in s2["rows"]] == [
        (2, "accept_new_best"),
        (3, "reject"),
    ]
    assert s2["rows"][1]["cells"][6] == replay.row(3)["gate"]["reason"]
    assert 'data-kind="reject"' in s2["view"]["chart"]  # the curve marks the new decision
    replay.append(1)
    replay.finish()
    s3 = live.snapshot(s2["cursor"], s2["gen"], s2["rev"])
    assert [r["key"] for r in s3["rows"]] == [4]
    assert s3["finished"] and s3["view"]["status"] == {
        "text": "finished: 4 steps",
        "error": None,
        "finished": True,
    }
    # a new page (no cursor) gets everything
    assert [r["key"] for r in live.snapshot()["rows"]] == [0, 1, 2, 3, 4]


def test_a_secret_in_the_run_is_redacted_everywhere_the_page_shows_it(finished_run, tmp_path):
    replay = Replay(finished_run, tmp_path / "run")
    config = json.loads((replay.root / "config.json").read_text())
    config["task"] = f"toy {SECRET}"
    (replay.root / "config.json").write_text(json.dumps(config))

    def leak(row: dict[str, Any]) -> dict[str, Any]:
        if row.get("gate"):
            row["gate"]["reason"] = f"the reply printed {SECRET} and the gate said no"
        return row

    replay.append(4, edit=leak)
    text = json.dumps(LiveRun(replay.root).snapshot())
    assert SECRET not in text
    assert "the reply printed [REDACTED:github_token] and the gate said no" in text
    assert "toy [REDACTED:github_token]" in text  # the title, from config.json


def test_waits_for_a_run_that_has_not_started_and_for_half_written_rows(finished_run, tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    live = LiveRun(root)
    s = live.snapshot()
    assert s["view"]["status"]["text"].startswith("waiting") and s["rows"] == []
    replay = Replay(finished_run, tmp_path / "other")
    shutil.copy(replay.root / "config.json", root / "config.json")
    half = replay.lines[0] + replay.lines[1][:40]
    (root / "history.jsonl").write_text(half)
    s = live.snapshot(s["cursor"], s["gen"], s["rev"])
    assert [r["key"] for r in s["rows"]] == [0]
    assert "view" in s and s["view"]["columns"][1] == "gate"


def test_a_grpo_run_shows_its_steps(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("trl")
    rl_run(tmp_path / "grpo", finished=False)
    s = LiveRun(tmp_path / "grpo").snapshot()
    assert [r["key"] for r in s["rows"]] == [1, 2, 3]
    assert s["rows"][0]["decision"] == "reject" and s["rows"][0]["cells"][1] == "no signal"
    assert not s["finished"] and s["view"]["title"] == "selftaught train grpo · toy"


def test_a_file_linked_out_of_the_run_dir_is_not_read(finished_run, tmp_path):
    root = tmp_path / "run"
    Replay(finished_run, root).append(2)
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps({"llm_calls": 1, "usage": {}, "note": "outside"}))
    (root / "summary.json").symlink_to(outside)
    s = LiveRun(root).snapshot()
    assert not s["finished"]  # the summary outside RUN_DIR was not taken as the run's
    assert any("leads outside the run directory" in n for n in s["view"]["notes"])


# ---- the endpoint ---------------------------------------------------------------------------
def client(root: Path, **kw: Any) -> Any:
    from fastapi.testclient import TestClient

    return TestClient(create_watch_app(root, interval_s=0.2), base_url="http://127.0.0.1", **kw)


def test_the_endpoint_answers_the_page_its_script_and_new_rows(finished_run, tmp_path):
    replay = Replay(finished_run, tmp_path / "run")
    c = client(replay.root)
    page = c.get("/")
    assert page.status_code == 200 and 'id="history-table"' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    assert 'data-interval-ms="200"' in page.text
    js = c.get("/live.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    s = c.get("/api/state").json()
    replay.append(3)
    s = c.get("/api/state", params={k: s[k] for k in ("gen", "rev")} | {"since": s["cursor"]})
    assert [r["key"] for r in s.json()["rows"]] == [0, 1, 2]
    assert s.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/api/state", {"Host": "evil.example:8000"}, 403),  # DNS rebinding
        ("/api/state", {"Origin": "https://evil.example"}, 403),  # a cross-site page
        ("/", {"Host": "rebind.attacker.test"}, 403),
        # issue 63: a lax Host parser read these as loopback
        ("/api/state", {"Host": "[::1].evil.example"}, 403),
        ("/api/state", {"Host": "127.0.0.1:80@evil.example"}, 403),
        ("/api/state", {"Host": "user@localhost:8000"}, 403),
        ("/", {"Host": "localhost:8000 evil.example"}, 403),
        ("/api/state", {"Origin": "http://evil.example@127.0.0.1"}, 403),
        ("/history.jsonl", {}, 404),  # no file is served by name
        ("/api/state/../../etc/passwd", {}, 404),
        ("/%2E%2E/config.json", {}, 404),
        ("/docs", {}, 404),
    ],
)
def test_foreign_hosts_origins_and_other_paths_are_refused(
    finished_run, tmp_path, path, headers, status
):
    replay = Replay(finished_run, tmp_path / "run")
    replay.append(2)
    r = client(replay.root).get(path, headers=headers)
    assert r.status_code == status
    assert "toy" not in r.text and "gate" not in r.text


def test_hostile_bytes_in_a_row_do_not_break_the_endpoint(finished_run, tmp_path):
    replay = Replay(finished_run, tmp_path / "run")

    def lone_surrogate(row: dict[str, Any]) -> dict[str, Any]:
        if row.get("gate"):
            row["gate"]["reason"] = "half a pair \ud800 here"  # valid JSON, not UTF-8-encodable
        return row

    replay.append(3, edit=lone_surrogate)
    r = client(replay.root).get("/api/state")
    assert r.status_code == 200
    assert [row["key"] for row in r.json()["rows"]] == [0, 1, 2]


def test_every_candidate_of_a_step_shows_with_its_fate(tmp_path):
    from tests.report_fixtures import demo_optimize_run

    demo_optimize_run(tmp_path / "run")
    rows = LiveRun(tmp_path / "run").snapshot()["rows"]
    assert rows[1]["decision"] == "accept_new_best"
    assert "v0001 rules: screened out" in rows[1]["cells"][4]
    assert "demos: kept · new best" in rows[1]["cells"][4]


def test_a_night_folder_shows_the_night(finished_run, tmp_path):
    replay = Replay(finished_run, tmp_path / "run")
    replay.append(2)
    night = {"kind": "sleep-night", "night": 3, "project": "demo", "status": "staged"}
    (replay.root / "report.json").write_text(json.dumps({**night, "reason": "val rose"}))
    view = LiveRun(replay.root).snapshot()["view"]
    assert view["title"] == "selftaught sleep · toy"
    assert view["notes"][0] == "Night 3 of project demo: staged — val rose."


def test_a_post_is_refused(finished_run, tmp_path):
    replay = Replay(finished_run, tmp_path / "run")
    r = client(replay.root).post("/api/state", json={})
    assert r.status_code == 404


def test_a_real_loopback_server_serves_the_page_and_refuses_a_foreign_host(finished_run, tmp_path):
    replay = Replay(finished_run, tmp_path / "run")
    replay.append(2)
    with watch_in_background(replay.root, interval_s=0.2) as url:
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "api/state", timeout=10) as r:
            assert [row["key"] for row in json.loads(r.read())["rows"]] == [0, 1]
        foreign = urllib.request.Request(url + "api/state", headers={"Host": "evil.example"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(foreign, timeout=10)
        assert err.value.code == 403


# ---- the CLI --------------------------------------------------------------------------------
def test_cli_refuses_a_missing_run_dir_and_a_bad_port(tmp_path):
    runner = CliRunner()
    r = runner.invoke(cli_app, ["watch", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "does not exist" in r.output
    r = runner.invoke(cli_app, ["watch", str(tmp_path), "--port", "70000"])
    assert r.exit_code == 2
