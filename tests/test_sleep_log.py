"""The task log: round trips, feedback, filters, export, redaction on the way in, file mode,
schema migration from an older log, and 8 real processes writing at once. Tests taking
`log_at` run on both backends: a SQLite file and a Postgres database (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from selftaught.sleep.intake.log import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Feedback,
    Interaction,
    LogError,
    LogFilter,
    TaskLog,
    log_interaction,
    migrate,
    parse_time,
)

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_round_trip_with_every_field(log_at, tmp_path):
    log = TaskLog(log_at)
    it = Interaction(
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
        reply="4",
        project="calc",
        source="proxy",
        model="m",
        latency_s=0.25,
        prompt_tokens=12,
        completion_tokens=1,
        reference=["4", "four"],
        tags=["math"],
        meta={"path": "/v1/chat/completions"},
        skill_version="3",
        private=True,
        dedupe_key="proxy:abc",
    )
    assert log.add(it) is True
    assert log.add(it) is False  # same id: stored once
    back = log.get(it.id)
    assert back.messages == it.messages and back.reply == "4" and back.reference == ["4", "four"]
    assert (back.project, back.source, back.model, back.skill_version) == (
        "calc",
        "proxy",
        "m",
        "3",
    )
    assert back.private and not back.reviewed and back.is_task
    assert log.mark_reviewed([it.id[:8]]) == 1 and log.get(it.id).reviewed
    assert back.prompt_tokens == 12 and back.tags == ["math"] and back.meta["path"]
    assert abs(back.created_at - it.created_at) < 1e-6
    assert log.count() == 1


def test_dedupe_key_makes_inserts_idempotent(log_at, tmp_path):
    log = TaskLog(log_at)
    rows = [
        Interaction([{"role": "user", "content": f"q{i}"}], "a", dedupe_key=f"k{i}")
        for i in range(5)
    ]
    assert log.add_many(rows) == 5
    again = [
        Interaction([{"role": "user", "content": f"q{i}"}], "a", dedupe_key=f"k{i}")
        for i in range(7)
    ]
    assert log.add_many(again) == 2
    assert log.count() == 7


def stored_bytes(log_at: Path | str) -> bytes:
    """Everything the backend holds, as bytes: the SQLite files, or every table's rows."""
    if isinstance(log_at, Path):
        return b"".join(p.read_bytes() for p in log_at.parent.glob(log_at.name + "*"))
    import psycopg

    with psycopg.connect(log_at) as conn:
        return b"".join(
            str(conn.execute(f"SELECT t::text FROM {table} t").fetchall()).encode()
            for table in ("interactions", "feedback")
        )


def test_secrets_are_redacted_before_storage_and_counted(log_at):
    log = TaskLog(log_at)
    key = "sk-proj-" + "Ab3" * 20
    iid = log_interaction(
        [{"role": "user", "content": f"my key is {key}"}],
        "use password=hunter22 then",
        error=None,
        reference=f"Bearer {key}",
        log=log,
    )
    raw = stored_bytes(log_at)
    assert key.encode() not in raw and b"hunter22" not in raw and b"my key is" in raw
    row = log.get(iid)
    assert row.redactions == 3
    assert "[REDACTED:openai_key]" in row.messages[0]["content"]


def test_feedback_accumulates_latest_value_per_field(log_at, tmp_path):
    log = TaskLog(log_at)
    iid = log_interaction("What is 2+2?", "5", feedback="down", log=log)
    log.add_feedback(iid[:8], Feedback(score=0.0, reference="4"))
    log.add_feedback(iid, {"comment": "off by one", "thumb": "down"})
    fb = log.get(iid).feedback
    assert (fb.thumb, fb.score, fb.reference, fb.comment) == ("down", 0.0, "4", "off by one")
    assert log.get(iid).effective_reference == "4"
    with pytest.raises(LogError, match="no interaction"):
        log.add_feedback("ffffffff-nope", "up")
    with pytest.raises(ValueError, match="empty"):
        log.add_feedback(iid, {})
    with pytest.raises(ValueError, match="thumb"):
        log.add_feedback(iid, "sideways")


def test_the_operators_feedback_outranks_an_end_users_whatever_the_order(log_at, tmp_path):
    log = TaskLog(log_at)
    iid = log_interaction("What is 2+2?", "4", log=log)
    log.add_feedback(iid, "up")  # the operator's, first
    log.add_feedback(iid, {"thumb": "down", "comment": "wrong"}, giver="key:ab12", trusted=False)
    fb = log.get(iid).feedback
    assert fb.thumb == "up" and fb.comment == "wrong" and not fb.trusted
    log.add_feedback(iid, {"comment": "fine"})  # the operator covers every untrusted value
    fb = log.get(iid).feedback
    assert (fb.thumb, fb.comment, fb.giver, fb.trusted) == ("up", "fine", "operator", True)
    # when and by whom is stamped by the log, never taken from the giver
    with pytest.raises(ValueError, match="unknown feedback field.*created_at"):
        log.add_feedback(iid, {"thumb": "down", "created_at": 4102444800.0})
    with pytest.raises(ValueError, match="unknown feedback field.*trusted"):
        log.add_feedback(iid, {"thumb": "down", "trusted": True})


def test_filters_and_export(log_at, tmp_path):
    log = TaskLog(log_at)
    now = time.time()
    rows = [
        Interaction(
            [{"role": "user", "content": "a"}],
            "x",
            project="p1",
            source="proxy",
            created_at=now - 3 * 86400,
        ),
        Interaction(
            [{"role": "user", "content": "b"}],
            "y",
            project="p1",
            source="api",
            created_at=now - 3600,
        ),
        Interaction(
            [{"role": "user", "content": "c"}],
            None,
            project="p2",
            source="proxy",
            error="HTTP 500: boom",
            error_status=500,
            created_at=now - 60,
        ),
    ]
    log.add_many(rows)
    log.add_feedback(rows[1].id, "up")
    assert [r.reply for r in log.query(LogFilter(project="p1"))] == ["y", "x"]  # newest first
    assert [r.reply for r in log.query(LogFilter(source="proxy", errors=False))] == ["x"]
    assert [r.error_status for r in log.query(LogFilter(errors=True))] == [500]
    assert [r.reply for r in log.query(LogFilter(has_feedback=True))] == ["y"]
    assert len(log.query(LogFilter(since=parse_time("1d")))) == 2
    assert len(log.query(LogFilter(until=parse_time("1d")))) == 1
    assert len(log.query(LogFilter(limit=1))) == 1
    n = log.export_jsonl(tmp_path / "out.jsonl", LogFilter(project="p1"))
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert n == 2 and [x["reply"] for x in lines] == ["x", "y"]  # oldest first
    assert lines[1]["feedback"]["thumb"] == "up" and lines[0]["feedback"] is None
    assert lines[0]["timestamp"].endswith("Z")


def test_parse_time_forms():
    assert abs(parse_time("2d") - (time.time() - 2 * 86400)) < 5
    assert parse_time("2026-01-01T00:00:00Z") == 1767225600.0
    assert parse_time(12.5) == 12.5
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday-ish")


def test_file_mode_is_0600(tmp_path):
    log = TaskLog(tmp_path / "sub" / "log.db")
    log_interaction("hi", "ho", log=log)
    for name in ("log.db", "log.db-wal", "log.db-shm"):
        mode = stat.S_IMODE(os.stat(tmp_path / "sub" / name).st_mode)
        assert mode == 0o600, (name, oct(mode))


def test_an_older_log_is_migrated_and_keeps_its_rows(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target=1)  # a log written by the first schema
    conn.execute(
        "INSERT INTO interactions (id, project, source, created_at, messages, reply) "
        "VALUES ('old-1', 'default', 'api', 1.0, '[{\"role\": \"user\", \"content\": \"q\"}]', 'a')"
    )
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()
    log = TaskLog(path)
    assert log.schema_version() == SCHEMA_VERSION == len(MIGRATIONS)
    old = log.get("old-1")
    assert old.reply == "a" and old.private is False and old.dedupe_key is None
    log_interaction("new", "row", log=log)
    assert log.count() == 2


def test_an_empty_v0_file_and_a_newer_log(tmp_path):
    empty = tmp_path / "v0.db"
    sqlite3.connect(empty).close()  # a v0 database: exists, no schema
    assert TaskLog(empty).schema_version() == SCHEMA_VERSION
    newer = tmp_path / "newer.db"
    conn = sqlite3.connect(newer)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(LogError, match="newer than this selftaught"):
        TaskLog(newer)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LogError, match="not a usable task log"):
        TaskLog(junk)


WRITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {src!r})
from selftaught.sleep.intake.log import Interaction, TaskLog
path, proc, n, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
log = TaskLog(path)
while not go.exists():
    time.sleep(0.005)
for i in range(n):
    log.add(Interaction([{{"role": "user", "content": f"p{{proc}} q{{i}}"}}], f"a{{i}}",
                        source="api", meta={{"proc": proc, "i": i}}))
"""


def test_eight_processes_writing_at_once_lose_and_duplicate_nothing(log_at, tmp_path):
    path, go = log_at, tmp_path / "go"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(src=SRC))
    procs = [
        subprocess.Popen([sys.executable, str(script), str(path), str(p), "500", str(go)])
        for p in range(8)
    ]
    time.sleep(1.0)  # let every process open the log (and race on creating the schema)
    go.touch()
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0] * 8
    log = TaskLog(path)
    rows = log.query()
    assert len(rows) == 4000
    assert len({(r.meta["proc"], r.meta["i"]) for r in rows}) == 4000
    assert len({r.id for r in rows}) == 4000
    assert log.integrity_check() == "ok"


def test_a_spool_keeps_every_field_and_a_line_cut_by_a_kill_costs_nothing_else(log_at, tmp_path):
    from selftaught.sleep.intake.spool import Spool

    log = TaskLog(log_at)
    rows = [
        Interaction(
            [{"role": "user", "content": f"q{i}"}], f"a{i}", project="p", source="proxy",
            tags=["t"], meta={"i": i}, skill_version="2", private=i == 1, client="key:ab",
            tool_calls=[{"id": "c", "type": "function", "function": {"name": "f"}}],
            feedback=Feedback(thumb="down", reference="x", giver="key:ab", trusted=False),
        )
        for i in range(3)
    ]  # fmt: skip
    spool = Spool(tmp_path / "spool")
    spool.append([log.redacted(it) for it in rows])
    with open(spool.path, "a") as f:
        f.write('{"id": "cut-by-a-kill", "messa')  # the last line, half written
    assert spool.replay(log) == 3 and spool.waiting == 0
    assert spool.replay(log) == 0  # emptied: nothing stored twice
    for it in rows:
        back = log.get(it.id)
        assert back.to_dict() == {**it.to_dict(), "feedback": back.feedback.to_dict()}
        assert (back.feedback.thumb, back.feedback.trusted) == ("down", False)
    assert log.count() == 3
    spool.close()
    assert not spool.path.exists()


def test_trust_is_per_field_an_end_users_comment_leaves_the_operators_correction_his(tmp_path):
    log = TaskLog(tmp_path / "log.db")
    iid = log_interaction("What is 2+2?", "5", log=log)
    log.add_feedback(iid, {"comment": "answer in French"}, giver="key:ab12", trusted=False)
    log.add_feedback(iid, {"thumb": "down", "reference": "4"})  # the operator's
    fb = log.get(iid).feedback
    assert not fb.trusted and fb.untrusted_fields == ("comment",)
    assert fb.trusted_for("reference") and fb.trusted_for("thumb")
    assert not fb.trusted_for("comment")
    as_given = Feedback(thumb="up", giver="key:ab12", trusted=False)  # one giver: its trust
    assert not as_given.trusted_for("thumb")


def test_a_writer_closed_before_its_replay_thread_ran_leaves_nothing_in_the_spool(log_at, tmp_path):
    """On a busy machine the replay thread may not have run when the proxy shuts down: the
    close still stores a dead proxy's rows and the ones queued behind them."""
    from selftaught.sleep.intake.spool import Spool, spool_dir
    from selftaught.sleep.intake.writer import LogWriter

    class StarvedWriter(LogWriter):
        def _replay_loop(self) -> None:  # the thread never gets the CPU before the close
            return

    log = TaskLog(log_at)
    dead = Spool(spool_dir(tmp_path))
    dead.append([Interaction([{"role": "user", "content": f"q{i}"}], "a") for i in range(3)])
    dead.close()  # its proxy died with rows waiting
    writer = StarvedWriter(log, home=tmp_path)
    assert writer.submit(Interaction([{"role": "user", "content": "new"}], "b")).result(10) == (
        "spooled"  # behind the older rows
    )
    writer.close()
    assert sorted(r.messages[0]["content"] for r in log.query()) == ["new", "q0", "q1", "q2"]
    assert not list(spool_dir(tmp_path).iterdir())


def test_forget_deletes_rows_feedback_and_shadows_and_nothing_stores_them_again(log_at, tmp_path):
    log = TaskLog(log_at)
    old = time.time() - 40 * 86400

    def row(text: str, **kw: object) -> Interaction:
        return Interaction([{"role": "user", "content": text}], "a", project="p", **kw)  # type: ignore[arg-type]

    harvested = row("old harvested", dedupe_key="claude-code:s1:u1", created_at=old)
    served = row("old served", created_at=old + 1)
    shadow = row("old served", shadow_of=served.id, created_at=old + 2)
    recent, other = row("recent"), Interaction([{"role": "user", "content": "q"}], "a", project="q")
    other.created_at = old
    assert log.add_many([harvested, served, shadow, recent, other]) == 5
    log.add_feedback(harvested.id, {"thumb": "down"})

    until = LogFilter(project="p", until=parse_time("30d"))
    assert {r.id for r in log.query(until)} == {harvested.id, served.id, shadow.id}
    gone = log.forget(LogFilter(project="p", until=parse_time("30d"), source="api", limit=1))
    assert sorted(gone) == sorted([harvested.id, served.id, shadow.id])  # limit ignored
    assert {r.id for r in log.query()} == {recent.id, other.id}  # other projects untouched
    with pytest.raises(LogError, match="no interaction"):
        log.add_feedback(harvested.id, {"thumb": "up"})  # its feedback went with it

    again = row("old harvested, harvested again", dedupe_key="claude-code:s1:u1")
    late_shadow = row("old served", shadow_of=served.id)
    assert log.add_many([harvested, again, late_shadow]) == 0  # by id, dedupe key, shadow_of
    entries = log.forgotten_entries()
    assert {e[0] for e in entries} == set(gone) and "claude-code:s1:u1" in {e[1] for e in entries}
    assert all(len(e) == 3 and "old" not in json.dumps(e) for e in entries)  # no content kept

    copy = TaskLog(tmp_path / "copy.db")  # another log: one row by id, one by dedupe key
    assert copy.add(served) and copy.add(recent) and copy.add(again)
    assert copy.add_forgotten(entries) == 3 and copy.add_forgotten(entries) == 0
    assert [r.id for r in copy.query()] == [recent.id]
    assert copy.is_forgotten(served.id, None) and not copy.is_forgotten(recent.id, None)
    assert log.forget(LogFilter(ids=())) == []  # an empty selection deletes nothing
    one_client = row("from one end user", client="key:abc")
    assert log.add(one_client) and log.forget(LogFilter(client="key:abc")) == [one_client.id]
    assert {r.id for r in log.query()} == {recent.id, other.id}


def test_a_forgotten_rows_words_are_in_no_file_of_the_log_while_a_writer_is_open_and_after(
    tmp_path, monkeypatch
):
    """Issue 63, class 1: secure delete on every connection (here SQLite is made to start
    without it, as a build without SQLITE_SECURE_DELETE does) and the WAL checkpointed and
    truncated after a forget, while the proxy's connection stays open and after it closes."""
    connect = sqlite3.connect

    def insecure(*args, **kw):  # a SQLite built without secure delete
        conn = connect(*args, **kw)
        conn.execute("PRAGMA secure_delete = OFF")
        return conn

    monkeypatch.setattr(sqlite3, "connect", insecure)
    path = tmp_path / "log.db"
    marker = b"QZX-bob-words-7f3a"

    def row(text: str, client: str) -> Interaction:
        return Interaction([{"role": "user", "content": text}], f"re: {text}", client=client)

    proxy = TaskLog(path)  # the proxy's connection, open throughout
    proxy.add_many([row(f"{marker.decode()} {i}", "key:bob") for i in range(3)])
    proxy.add_many([row(f"other {i}", "key:eve") for i in range(3)])
    cli = TaskLog(path)
    assert len(cli.forget(LogFilter(client="key:bob"))) == 3
    files = [path, path.with_name("log.db-wal"), path.with_name("log.db-shm")]

    def holding() -> list[str]:
        return [f.name for f in files if f.exists() and marker in f.read_bytes()]

    assert holding() == []  # the proxy still running
    proxy.add(row("after the forget", "key:eve"))
    assert holding() == [] and cli.checkpoint()
    cli.close()
    proxy.close()
    assert holding() == [] and TaskLog(path).count() == 4  # and after it stopped
