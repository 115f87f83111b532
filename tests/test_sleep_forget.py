"""Forgetting an end user's rows leaves their words nowhere (issue 63, class 1): not in the
log's files (WAL included) nor its tables, not in the stores a later night reads (recall, weak
labels, the edit ledger), and with `--everywhere` not in any file of the sleep home (night
folders, versions, adopted documents, backups) nor in the live file an adopt wrote; the next
night sends nothing of them to a model. On both log backends (`log_at`, tests/conftest.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.sleep.adoption import staging
from selftaught.sleep.intake.log import Feedback, Interaction, LogFilter, TaskLog
from selftaught.sleep.night import recall
from selftaught.sleep.night.cycle import run_night
from selftaught.sleep.night.forget import drop_forgotten, provenance
from selftaught.sleep.paths import read_adopted
from tests.scripted import canned_analyst, rule_target
from tests.test_sleep_cycle import config, fill_log, models

MARKER = "QZX-bobs-own-words-5e1f"
BOB = "key:bob"
PARROT = '{"rules": {"append": {"content": "better text"}}}'  # an analyst that writes nothing


def bobs_rows(log_at: Path | str, n: int = 4, start: int = 50) -> list[str]:
    """`n` of bob's requests, the marker in the request, the reply and the comment his
    correction carries (the operator's word: proposed to the memory as said)."""
    log = TaskLog(log_at)
    ids = []
    for i in range(start, start + n):
        a, b = i + 1, 7 * i + 3
        it = Interaction(
            messages=[{"role": "user", "content": f"[needs alpha] What is {a} + {b}? {MARKER}"}],
            reply=f"Answer: {a + b + 1} {MARKER}",
            project="demo",
            source="proxy",
            client=BOB,
            feedback=Feedback(thumb="down", reference=str(a + b), comment=f"rule alpha {MARKER}"),
        )
        log.add(it)
        ids.append(it.id)
    log.close()
    return ids


def holding(root: Path) -> list[str]:
    """Every file under `root` whose bytes hold the marker."""
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            if not path.is_symlink() and MARKER.encode() in path.read_bytes():
                found.append(str(path.relative_to(root)))
    return sorted(found)


def rows_holding(url: str) -> list[str]:
    """Every table of the Postgres database with a row holding the marker."""
    import psycopg

    with psycopg.connect(url) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        )]  # fmt: skip
        return [t for t in tables if conn.execute(
            f"SELECT 1 FROM {t} x WHERE x::text LIKE %s LIMIT 1", (f"%{MARKER}%",)
        ).fetchone()]  # fmt: skip


def sent(*models_used) -> list[str]:
    """The model calls (roles: target, analyst) that carried the marker."""
    return [
        str(m)
        for model in models_used
        for call in model.calls
        for m in call
        if MARKER in json.dumps(m, ensure_ascii=False)
    ]


@pytest.fixture
def forget(tmp_path, monkeypatch, log_at):
    home = tmp_path / "home"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(log_at))

    def invoke(*args: str) -> str:
        result = CliRunner().invoke(app, ["sleep", "log", "forget", *args])
        assert result.exit_code == 0, result.output
        return " ".join(result.output.split())

    return invoke


def test_forget_everywhere_leaves_bobs_words_in_no_file_and_no_row(tmp_path, log_at, forget):
    home, live = tmp_path / "home", tmp_path / "AGENTS.md"
    live.write_text("# My agent\n")
    fill_log(home, ["alpha"] * 12, log_at=log_at)
    bobs_rows(log_at)
    (night,) = run_night(config(home, log_at), models=models(analyst=canned_analyst(PARROT)))
    assert night.status == "staged", night.reason
    staging.adopt("demo", home=home, target_paths=[live])
    assert MARKER in read_adopted("demo", home).memory  # his words went live, as he said them
    assert MARKER in live.read_text()
    assert "recall.jsonl" in " ".join(holding(home)) and "evidence.jsonl" in " ".join(holding(home))

    text = forget("--client", BOB, "--everywhere", "--yes")
    assert "forgot 4 rows" in text and "1 night folders read a forgotten row" in text
    assert holding(tmp_path) == []  # the log's files (WAL included), the home, the live file
    if isinstance(log_at, str):
        assert rows_holding(log_at) == []
    assert "rule alpha" not in read_adopted("demo", home).memory  # his line is out
    assert staging.adopted_consistent("demo", home)
    assert (night.night_dir / "report.json").is_file() and not (
        night.night_dir / "evidence.jsonl"
    ).exists()

    fill_log(home, ["alpha"] * 4, start=200, log_at=log_at)  # a quiet night: recall fills it
    target, analyst = rule_target(), canned_analyst(PARROT)
    run_night(config(home, log_at), models=models(target, analyst))
    assert target.calls and sent(target, analyst) == []
    assert holding(tmp_path) == []


def test_a_plain_forget_drops_bobs_tasks_from_what_the_next_night_reads(tmp_path, log_at, forget):
    home = tmp_path / "home"
    fill_log(home, ["alpha"] * 12, log_at=log_at)
    gone = bobs_rows(log_at)
    (night,) = run_night(config(home, log_at), models=models())
    assert night.status == "staged"
    pool = recall.load("demo", home)
    assert any(set(r.task.sources) & set(gone) for r in pool)

    text = forget("--client", BOB, "--yes")
    assert "recalled tasks" in text and "--everywhere" in text  # says what it left
    stores = ["recall.jsonl", "weak_labels.jsonl", "edit_ledger.jsonl"]
    folder = home / "projects" / "demo"
    assert [s for s in stores if (folder / s).exists() and MARKER in (folder / s).read_text()] == []

    fill_log(home, ["alpha"] * 4, start=200, log_at=log_at)
    target, analyst = rule_target(), canned_analyst()
    run_night(config(home, log_at), models=models(target, analyst))
    assert target.calls and sent(target, analyst) == []


def test_a_night_drops_what_a_pool_written_before_the_forget_holds(tmp_path):
    """Belt and braces: rows forgotten through the Python API (the home left as it was), or a
    pool written by an older version: the next night takes them out before it reads."""
    home = tmp_path
    fill_log(home, ["alpha"] * 12)
    gone = bobs_rows(home / "log.db")
    run_night(config(home), models=models())
    TaskLog(home / "log.db").forget(LogFilter(client=BOB))
    assert MARKER in recall.recall_path("demo", home).read_text()  # the log alone forgot
    pool = recall.load("demo", home)
    his = sum(bool(set(r.task.sources) & set(gone)) for r in pool)
    fill_log(home, ["alpha"] * 4, start=200)
    target, analyst = rule_target(), canned_analyst()
    (second,) = run_night(config(home), models=models(target, analyst))
    assert his and second.recall.pool == len(pool) - his  # his tasks were never read
    assert sent(target, analyst) == []
    assert not any(set(r.task.sources) & set(gone) for r in recall.load("demo", home))


def test_each_store_drops_by_provenance_and_a_label_without_it(tmp_path):
    """The stores beside recall: a weak label names its rows (one that names none cannot say
    whose it is and goes), a ledger event its tasks (their rows through tasks.jsonl)."""
    log = TaskLog(tmp_path / "log.db")
    bob, eve = (Interaction([{"role": "user", "content": w}], "r") for w in ("bob", "eve"))
    log.add_many([bob, eve])
    folder = tmp_path / "projects" / "demo"
    night = folder / "nights" / "n1"
    night.mkdir(parents=True)
    (night / "tasks.jsonl").write_text(
        json.dumps({"id": "t-bob", "sources": [bob.id]}) + "\n"
        + json.dumps({"id": "t-eve", "sources": [eve.id]}) + "\n"
    )  # fmt: skip
    weak = [
        {"id": "t-bob", "prompt": "bob", "answer": "1", "sources": [bob.id]},
        {"id": "t-eve", "prompt": "eve", "answer": "2", "sources": [eve.id]},
        {"id": "t-old", "prompt": "old", "answer": "3"},  # from before labels named rows
    ]
    (folder / "weak_labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in weak))
    ledger = [
        {"kind": "rejected", "run": "r", "content": "bob's idea", "tasks": ["t-bob", "t-eve"]},
        {"kind": "rejected", "run": "r", "content": "eve's idea", "tasks": ["t-eve"]},
    ]
    (folder / "edit_ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger))
    assert drop_forgotten("demo", tmp_path, log).total() == 1  # the old label: whose was it?
    log.forget(LogFilter(ids=(bob.id,)))
    dropped = drop_forgotten("demo", tmp_path, log)
    assert (dropped.weak, dropped.ledger) == (1, 1)
    assert "bob" not in (folder / "weak_labels.jsonl").read_text()
    assert "bob" not in (folder / "edit_ledger.jsonl").read_text()
    assert provenance("demo", tmp_path).tasks["t-bob"] == {bob.id}
