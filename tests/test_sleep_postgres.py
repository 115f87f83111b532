"""Past one machine: what only a Postgres log does. Replicas (other processes, other sleep
homes) follow an adopt and a rollback within one poll, adapter included; nights on two
"hosts" never overlap and a killed night's lock goes with its session; `sleep log migrate`
copies, checks and resumes; bad URLs, a newer schema and a missing extra are one sentence.
The log's own behaviour on both backends is tested where it always was (`log_at`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.errors import MissingDependency
from selftaught.runs import atomic_write_json, atomic_write_text
from selftaught.sleep.adoption import skill_units, staging
from selftaught.sleep.intake.log import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Feedback,
    Interaction,
    LogError,
    LogFilter,
    LogUnavailable,
    TaskLog,
)
from selftaught.sleep.lock import NightRunning, night_lock, read_holder
from selftaught.sleep.move import move_log
from selftaught.sleep.paths import Unit, read_adopted
from selftaught.sleep.store import versions

SRC = str(Path(__file__).resolve().parents[1] / "src")
PROJECT = "demo"


def stage(home: Path, night: str, skill: str, *, base: int = 0, adapter: bytes | None = None):
    """A staged night as `sleep run` leaves it (with an adapter: its folder and report)."""
    folder = staging.nights_dir(PROJECT, home) / night
    atomic_write_text(folder / "proposal" / "skill.md", skill)
    atomic_write_text(folder / "proposal" / "memory.md", f"memory of {night}")
    proposal = {}
    if adapter is not None:
        atomic_write_json(folder / "adapter" / "adapter_config.json", {"r": 8})
        (folder / "adapter" / "adapter_model.safetensors").write_bytes(adapter)
        proposal["adapter"] = {"dir": "adapter", "method": "sft"}
    atomic_write_json(folder / "report.json", {"kind": staging.NIGHT_KIND, "night": night,
                      "project": PROJECT, "status": "staged", "base_version": base,
                      "proposal": proposal})  # fmt: skip
    return folder


def child(script: str, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env={**os.environ, "PYTHONPATH": SRC, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def next_line(proc: subprocess.Popen[str]) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return json.loads(line)


# ---- versions every replica serves ---------------------------------------------------------

REPLICA = """
import json, sys, time
from pathlib import Path
from selftaught.sleep.paths import Unit, read_adopted
home, stop, last = Path(sys.argv[1]), Path(sys.argv[2]), "start"
while not stop.exists():
    a = read_adopted("demo", home)
    if a.version != last:
        adapter = a.adapter and (a.adapter / "adapter_model.safetensors").read_bytes().hex()
        print(json.dumps({"t": time.time(), "version": a.version, "skill": a.skill,
                          "adapter": adapter}), flush=True)
        last = a.version
    time.sleep(0.01)
"""


def test_a_replica_follows_an_adopt_and_a_rollback_within_one_poll(pg_url, tmp_path):
    host_a, host_b = tmp_path / "a", tmp_path / "b"  # two sleep homes: two hosts
    weights = os.urandom(4096)
    stage(host_a, "n1", "SKILL ONE", adapter=weights)
    stage(host_a, "n2", "SKILL TWO", base=1)
    replica = child(REPLICA, str(host_b), str(tmp_path / "stop"), env={})
    try:
        assert next_line(replica)["version"] is None  # nothing adopted yet
        staging.adopt(PROJECT, "n1", home=host_a)
        adopted_at = time.time()
        seen = next_line(replica)
        assert seen["version"] == "1" and seen["skill"] == "SKILL ONE"
        assert bytes.fromhex(seen["adapter"]) == weights  # the adapter, copied to host B
        assert seen["t"] - adopted_at < versions.POLL_S + 2.0  # one poll (+ a busy machine)
        staging.adopt(PROJECT, "n2", home=host_a)  # text only: carries version 1's adapter
        seen = next_line(replica)
        assert (seen["version"], seen["skill"]) == ("2", "SKILL TWO")
        assert bytes.fromhex(seen["adapter"]) == weights
        staging.rollback(PROJECT, 0, home=host_a)
        rolled_at = time.time()
        seen = next_line(replica)
        assert (seen["version"], seen["skill"], seen["adapter"]) == ("0", "", None)
        assert seen["t"] - rolled_at < versions.POLL_S + 2.0
    finally:
        (tmp_path / "stop").touch()
        replica.wait(timeout=30)
    # the history, the events and the adopted version are the database's, seen from any home
    assert [r["version"] for r in staging.history(PROJECT, host_b)] == [0, 1, 2]
    assert [e["event"] for e in staging.events(PROJECT, host_b)] == ["adopt", "adopt", "rollback"]
    assert staging.current_version(PROJECT, host_b) == 0
    assert not (host_a / "projects" / PROJECT / "adopted").exists()  # no local copy to drift
    staging.rollback(PROJECT, 2, home=host_b)
    assert read_adopted(PROJECT, host_a).skill == "SKILL TWO"  # this process: at once


def test_a_replica_follows_a_forget_rewriting_the_served_version_within_one_poll(pg_url, tmp_path):
    """`sleep log forget --everywhere` rewrites a version in place (issue 63): a serving
    process on another host, polling, serves the rewritten text, not what it read before."""
    stage(tmp_path, "n1", "KEEP THIS\nA FORGOTTEN ROW'S WORDS")
    staging.adopt(PROJECT, "n1", home=tmp_path)
    replica = versions.PgVersions(pg_url)  # another host's store: its own poll
    try:
        local = tmp_path / "b" / "versions"
        assert "FORGOTTEN" in replica.poll(PROJECT, local).skill
        versions.store(pg_url).rewrite(PROJECT, 1, "KEEP THIS\n", "")
        deadline = time.time() + versions.POLL_S + 5.0
        while "FORGOTTEN" in replica.poll(PROJECT, local).skill and time.time() < deadline:
            time.sleep(0.05)
        assert replica.poll(PROJECT, local).skill == "KEEP THIS\n"
    finally:
        replica.close()


def test_an_adopt_is_one_version_row_and_one_pointer_switch(pg_url, tmp_path):
    import psycopg

    stage(tmp_path, "n1", "ONE")
    staging.adopt(PROJECT, "n1", home=tmp_path)
    stage(tmp_path, "n2", "TWO", base=0)
    with pytest.raises(staging.StagingError, match="gated against version 0"):
        staging.adopt(PROJECT, "n2", home=tmp_path)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT project, version FROM adopted").fetchall() == [(PROJECT, 1)]
        assert conn.execute("SELECT version, skill FROM versions").fetchall() == [(1, "ONE")]
    assert staging.version_meta(PROJECT, 1)["night"] == "n1"
    with pytest.raises(staging.StagingError, match="no adopted version 7"):
        staging.read_version(PROJECT, 7, tmp_path)


# ---- the night's lock across hosts -----------------------------------------------------------

HOLDER = """
import sys, time
from pathlib import Path
from selftaught.sleep.lock import night_lock
with night_lock(Path(sys.argv[1]), "night-A", project=sys.argv[2] or None):
    print('{"held": true}', flush=True)
    time.sleep(600)
"""


def test_nights_on_two_hosts_never_overlap_and_a_killed_night_frees_the_lock(pg_url, tmp_path):
    holder = child(HOLDER, str(tmp_path / "a"), "", env={})
    try:
        assert next_line(holder) == {"held": True}
        with pytest.raises(NightRunning, match=rf"night-A \(host .+, pid {holder.pid}, started"):
            with night_lock(tmp_path / "b", "night-B"):
                pass
        with pytest.raises(NightRunning):  # a night over one project waits for every project
            with night_lock(tmp_path / "b", "night-B", project="p1"):
                pass
        who = read_holder(tmp_path / "b")
        assert who["pid"] == holder.pid and who["night"] == "night-A" and who["host"]
        status = CliRunner().invoke(cli.app, ["sleep", "status"])
        assert f"running now: night night-A (host {who['host']}, pid {holder.pid}" in status.output
        holder.kill()  # kill -9: the server ends its session, and the lock with it
        holder.wait(timeout=30)
        deadline = time.monotonic() + 10
        while read_holder(tmp_path / "b") is not None:
            assert time.monotonic() < deadline, "the dead night's lock was never released"
            time.sleep(0.05)
        with night_lock(tmp_path / "b", "night-B"):
            assert read_holder(tmp_path / "a")["night"] == "night-B"
        assert read_holder(tmp_path / "a") is None
    finally:
        holder.kill()


def test_nights_over_two_different_projects_run_side_by_side(pg_url, tmp_path):
    holder = child(HOLDER, str(tmp_path / "a"), "p1", env={})
    try:
        assert next_line(holder) == {"held": True}
        with night_lock(tmp_path / "b", "night-p2", project="p2"):
            pass  # another project: no wait
        for project in ("p1", None):
            with pytest.raises(NightRunning, match="night-A"):
                with night_lock(tmp_path / "b", "night-B", project=project):
                    pass
    finally:
        holder.kill()
        holder.wait(timeout=30)


# ---- moving in -------------------------------------------------------------------------------


def a_sqlite_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int) -> Path:
    """A log of `rows` rows (feedback on every 7th, one tag, one private) and a project
    with two adopted versions, rolled back to 1, as files (SQLite era)."""
    home, path = tmp_path / "home", tmp_path / "home" / "log.db"
    monkeypatch.setenv("SELFTAUGHT_LOG", str(path))
    log = TaskLog(path)
    log.add_many(
        Interaction([{"role": "user", "content": f"q{i}"}], f"a{i}", project=PROJECT,
                    created_at=1_700_000_000 + i // 3, tags=["t"] * (i == 5), private=i == 6)
        for i in range(rows)
    )  # fmt: skip
    for it in log.query()[::7]:
        log.add_feedback(it.id, Feedback(thumb="up", comment="ok"))
        log.add_feedback(it.id, {"thumb": "down"}, giver="key:x", trusted=False)
    log.close()
    stage(home, "n1", "ONE", adapter=b"w1")
    staging.adopt(PROJECT, "n1", home=home)
    stage(home, "n2", "TWO", base=1)
    staging.adopt(PROJECT, "n2", home=home)
    staging.rollback(PROJECT, 1, home=home)
    return home


def test_migrate_copies_checks_and_resumes_after_a_kill(pg_url, tmp_path, monkeypatch):
    home = a_sqlite_home(tmp_path, monkeypatch, rows=1200)
    batches = []

    def killed_after_three(message: str) -> None:
        batches.append(message)
        if len(batches) == 3:
            raise KeyboardInterrupt  # a kill between two batches

    with pytest.raises(KeyboardInterrupt):
        move_log(home / "log.db", pg_url, home, batch=100, progress=killed_after_three)
    with TaskLog(pg_url) as moved:
        assert moved.count() == 300  # three whole batches, nothing half-written
    done = move_log(home / "log.db", pg_url, home, batch=100)
    assert (done.rows, done.rows_copied, done.rows_present) == (1200, 900, 300)
    assert done.rows_checked == 1200 and done.ok and not done.rows_by_dedupe_key
    assert (done.versions_copied, done.versions_checked, done.pointers_set) == (2, 2, ["demo=1"])
    assert done.events_copied == 3
    again = move_log(home / "log.db", pg_url, home, batch=100)  # idempotent
    assert (again.rows_copied, again.rows_present, again.feedback_copied) == (0, 1200, 0)
    assert (again.versions_copied, again.events_copied, again.pointers_set) == (0, 0, [])
    source, moved = TaskLog(home / "log.db"), TaskLog(pg_url)
    assert [r.to_dict() for r in moved.query()] == [r.to_dict() for r in source.query()]
    assert [r.reply for r in moved.query(LogFilter(tag="t"))] == ["a5"]
    assert moved.get(source.query()[-1].id).feedback.trusted is True  # operator outranks
    monkeypatch.setenv("SELFTAUGHT_LOG", pg_url)  # from now on, the database
    assert staging.current_version(PROJECT, home) == 1
    assert read_adopted(PROJECT, tmp_path / "elsewhere").skill == "ONE"
    assert [e["event"] for e in staging.events(PROJECT, home)] == ["adopt", "adopt", "rollback"]


def test_migrate_copies_each_named_skills_versions_and_pointer(pg_url, tmp_path, monkeypatch):
    from tests.test_sleep_skills import stage_skills

    home = a_sqlite_home(tmp_path, monkeypatch, rows=3)
    stage_skills(home, "s1", {"sql-queries": "SQL ONE", "unit-conversion": "UNITS ONE"})
    skill_units.adopt_skill(PROJECT, "sql-queries", "s1", home=home)
    stage_skills(home, "s2", {"sql-queries": "SQL TWO"}, bases={"sql-queries": 1})
    skill_units.adopt_skill(PROJECT, "sql-queries", "s2", home=home)
    skill_units.rollback_skill(PROJECT, "sql-queries", 1, home=home)
    done = move_log(home / "log.db", pg_url, home)
    assert (done.versions_copied, done.versions_checked) == (4, 4)  # the project's 2, the skill's 2
    assert done.pointers_set == ["demo=1", "demo/skills/sql-queries=1"]
    monkeypatch.setenv("SELFTAUGHT_LOG", pg_url)  # from now on, the database
    elsewhere, sql = tmp_path / "elsewhere", Unit(PROJECT, "sql-queries")
    assert staging.current_version(sql, elsewhere) == 1
    assert read_adopted(sql, elsewhere).skill == "SQL ONE"
    assert [e["event"] for e in staging.events(sql, elsewhere)] == ["adopt", "adopt", "rollback"]
    assert staging.current_version(Unit(PROJECT, "unit-conversion"), elsewhere) == 0
    again = move_log(home / "log.db", pg_url, home)  # idempotent
    assert (again.versions_copied, again.versions_present, again.events_copied) == (0, 4, 0)


def test_migrate_records_what_either_log_forgot_and_copies_none_of_it(
    pg_url, tmp_path, monkeypatch
):
    home = a_sqlite_home(tmp_path, monkeypatch, rows=10)
    source = TaskLog(home / "log.db")
    first, second, third = (r.id for r in source.query(LogFilter(newest_first=False))[:3])
    assert sorted(source.forget(LogFilter(ids=(first, second)))) == sorted([first, second])
    done = move_log(home / "log.db", pg_url, home)
    assert (done.forgotten_copied, done.rows, done.rows_copied, done.rows_checked) == (2, 8, 8, 8)
    moved = TaskLog(pg_url)
    assert moved.is_forgotten(first, None) and moved.count() == 8
    assert moved.forget(LogFilter(ids=(third,))) == [third]  # forgotten in the database
    again = move_log(home / "log.db", pg_url, home)
    assert again.ok and again.rows_forgotten_there == [third] and again.rows_copied == 0
    assert (again.forgotten_copied, again.rows_present) == (0, 7)
    assert "1 rows were forgotten in the database" in " ".join(again.lines())
    assert third not in {r.id for r in moved.query()}


def test_a_forget_and_an_insert_in_flight_never_leave_a_forgotten_row(pg_url):
    import threading

    import psycopg

    log = TaskLog(pg_url)
    first = Interaction([{"role": "user", "content": "q1"}], "a", dedupe_key="cc:s:1")
    with psycopg.connect(pg_url) as writer:  # an insert in flight, not committed yet
        writer.execute(
            "INSERT INTO interactions (id, project, source, created_at, messages, dedupe_key) "
            "VALUES (%s, 'default', 'api', 1.0, '[]', 'cc:s:1')",
            (first.id,),
        )
        gone: list[list[str]] = []
        forget = threading.Thread(
            target=lambda: gone.append(log.forget(LogFilter(ids=(first.id,))))
        )
        forget.start()
        forget.join(1.5)
        assert forget.is_alive()  # it waits for the insert rather than miss its row
    forget.join(10)
    assert gone == [[first.id]] and log.count() == 0

    second = Interaction([{"role": "user", "content": "q2"}], "a", dedupe_key="cc:s:2")
    with psycopg.connect(pg_url) as forgetter:  # a forget in flight: its ids not committed
        forgetter.execute("LOCK TABLE interactions IN SHARE ROW EXCLUSIVE MODE")
        forgetter.execute(
            "INSERT INTO forgotten (id, dedupe_key, forgotten_at) VALUES ('x', 'cc:s:2', 1.0)"
        )
        stored: list[bool] = []
        insert = threading.Thread(target=lambda: stored.append(log.add(second)))
        insert.start()
        insert.join(1.5)
        assert insert.is_alive()
    insert.join(10)
    assert stored == [False] and log.count() == 0  # it saw what the forget recorded
    log.close()


def test_migrate_cli_prints_what_it_copied_and_checked(pg_url, tmp_path, monkeypatch):
    home = a_sqlite_home(tmp_path, monkeypatch, rows=30)
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    args = ["sleep", "log", "migrate", "--to", pg_url, "--log", str(home / "log.db")]
    first = CliRunner().invoke(cli.app, args)
    assert first.exit_code == 0, first.output
    assert "30 in the source, 30 copied, 0 already there" in first.output
    assert "checked: 30 of 30 rows read back equal" in first.output
    assert "versions: 2 copied, 0 already there, 2 checked; adopted: demo=1" in first.output
    second = CliRunner().invoke(cli.app, args)
    assert "30 in the source, 0 copied, 30 already there" in second.output
    bad = CliRunner().invoke(cli.app, ["sleep", "log", "migrate", "--to", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "must be a postgresql:// URL" in bad.output


# ---- bad input -----------------------------------------------------------------------------


def test_a_newer_schema_is_refused_and_an_older_one_migrated(pg_url):
    import psycopg

    from selftaught.sleep.store.postgres import migrate

    with psycopg.connect(pg_url) as conn:
        migrate(conn, "log", MIGRATIONS[:2])  # a log of schema 2
        conn.execute(
            "INSERT INTO interactions (id, project, source, created_at, messages, reply) "
            "VALUES ('old-1', 'default', 'api', 1.0, '[]', 'a')"
        )
    log = TaskLog(pg_url)
    assert log.schema_version() == SCHEMA_VERSION and log.get("old-1").reply == "a"
    log.close()
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE selftaught_schema SET version = 99 WHERE component = 'log'")
    with pytest.raises(LogError, match="schema version 99, newer than this selftaught"):
        TaskLog(pg_url)


def test_bad_urls_are_one_sentence_exit_1_or_2_and_never_show_the_password(
    pg_url, tmp_path, monkeypatch
):
    from tests.pg import database_url

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SELFTAUGHT_LOG")
    port = pg_url.rsplit(":", 1)[1].split("/")[0]
    cases = {  # url: (exit code, what the sentence says)
        "postgresql://ada:S3cretPW@127.0.0.1:1/db": (1, "Connection refused"),
        "postgresql://ada:S3cretPW@127.0.0.1:notaport/db": (2, "invalid integer value"),
        f"postgresql://nobody_here:S3cretPW@127.0.0.1:{port}/db": (2, "nobody_here"),
        database_url(pg_url, "no_such_db"): (2, 'database "no_such_db" does not exist'),
        "postgresq://ada:S3cretPW@127.0.0.1/db": (2, "neither a file path nor a postgresql://"),
    }
    for url, (code, says) in cases.items():
        done = CliRunner().invoke(cli.app, ["sleep", "log", "--log", url])
        assert done.exit_code == code, (url, done.output)
        assert says in done.output and "error:" in done.output, done.output
        assert "S3cretPW" not in done.output and "Traceback" not in done.output
        assert len(done.output.strip().splitlines()) <= 3  # one sentence (wrapped)
    assert list(tmp_path.iterdir()) == []  # no folder named 'postgresql:' (the old bug)
    wrong = wrong_password_url(pg_url)
    done = CliRunner().invoke(cli.app, ["sleep", "log", "--log", wrong])
    assert done.exit_code == 2 and "password authentication failed" in done.output, done.output
    assert "WrongPW" not in done.output
    with pytest.raises(LogUnavailable):
        TaskLog("postgresql://ada:S3cretPW@127.0.0.1:1/db")


def wrong_password_url(pg_url: str) -> str:
    """A URL with a wrong password for a role whose password the server checks (the test
    clusters check `pg.PASSWORD_ROLE`'s); skips when this server trusts everyone."""
    import psycopg

    from tests import pg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        if not conn.execute(
            "SELECT 1 FROM pg_roles WHERE rolname = %s", (pg.PASSWORD_ROLE,)
        ).fetchone():
            conn.execute(f"CREATE ROLE {pg.PASSWORD_ROLE} LOGIN PASSWORD 'right-pw'")
    wrong = pg_url.replace("://selftaught@", f"://{pg.PASSWORD_ROLE}:WrongPW@", 1)
    try:
        psycopg.connect(wrong).close()
    except psycopg.OperationalError:
        return wrong
    pytest.skip("this server does not check passwords (no scram rule for the test role)")


def test_the_log_option_takes_a_url(pg_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SELFTAUGHT_LOG")
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                "reply": "yo"}) + "\n")  # fmt: skip
    runner = CliRunner()
    done = runner.invoke(cli.app, ["sleep", "import", str(data), "--log", pg_url])
    assert done.exit_code == 0, done.output
    shown = runner.invoke(cli.app, ["sleep", "log", "--log", pg_url, "--json"])
    assert [json.loads(x)["reply"] for x in shown.output.splitlines()] == ["yo"]
    assert list(tmp_path.iterdir()) == [data]
    assert os.environ["SELFTAUGHT_LOG"] == pg_url  # --log URL: versions and lock follow it


def test_without_psycopg_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg raises ImportError
    with pytest.raises(MissingDependency, match=r"pip install 'selftaught\[postgres\]'"):
        TaskLog("postgresql://localhost/db")


# ---- a proxy whose database goes away ----------------------------------------------------------


@pytest.mark.slow  # about a minute (reconnects); test_proxy_ops covers the outage on Postgres fast
def test_a_proxy_whose_database_goes_away_keeps_answering_spools_and_replays(
    pg_url, tmp_path, monkeypatch
):
    from selftaught.sleep.intake.proxy import ProxyConfig, proxy_in_background
    from tests import loopback
    from tests.fake_upstream import FakeUpstream, asker, health, wait_for
    from tests.pg import Relay

    relay = Relay(pg_url)
    monkeypatch.setenv("SELFTAUGHT_LOG", relay.url)
    secret = "sk-proj-" + "Zq9" * 20
    try:
        with FakeUpstream() as upstream:
            config = ProxyConfig(upstream=f"{upstream.base_url}#m", project=PROJECT, port=0,
                                 log_path=relay.url, home=tmp_path / "home")  # fmt: skip
            with proxy_in_background(config) as (url, _app):
                ask = asker(url)
                for i in range(3):
                    ask(f"before {i}")
                wait_for(lambda: health(url)["log"]["logged"] == 3)
                relay.cut()  # the database goes away
                during = [ask(f"during {i} {secret}") for i in range(12)]  # all answered
                log = wait_for(lambda: (h := health(url)["log"])["spooled"] == 12 and h)
                assert log["state"] == "unreachable" and "cannot write" in log["error"]
                assert log["spool_waiting"] == 12 and log["failures"] == log["dropped"] == 0
                (spool,) = (tmp_path / "home" / "spool").iterdir()
                assert oct(spool.stat().st_mode & 0o777) == "0o600"
                assert secret not in spool.read_text() and "REDACTED" in spool.read_text()
                fb = loopback.post(
                    f"{url}/feedback", json={"id": during[0], "thumb": "up"}, timeout=30
                )
                assert fb.status_code == 503 and "cannot" in fb.json()["error"]["message"]
                relay.restore()  # it comes back: the spool is replayed, then new rows
                log = wait_for(lambda: (h := health(url)["log"])["state"] == "ok" and h, 90)
                assert log["replayed"] == 12 and log["spool_waiting"] == 0
                ask("after")
                wait_for(lambda: health(url)["log"]["logged"] == 4)
        with TaskLog(pg_url) as stored:
            rows = stored.query()
        texts = sorted(r.messages[0]["content"] for r in rows)
        assert len(rows) == 16 and len({r.id for r in rows}) == 16
        assert {"before 0", "before 1", "before 2", "after"} <= set(texts)
        assert {r.id for r in rows} >= set(during)
        assert not any(secret in t for t in texts)
        assert not list((tmp_path / "home" / "spool").iterdir())  # nothing left behind
    finally:
        versions.forget(relay.url)
        relay.close()


def test_a_dead_proxys_spool_is_replayed_by_the_next_one(pg_url, tmp_path):
    from selftaught.sleep.intake.spool import spool_dir
    from selftaught.sleep.intake.writer import LogWriter

    folder = spool_dir(tmp_path)
    dead = child(
        "import sys; from pathlib import Path\n"
        "from selftaught.sleep.intake.log import Interaction\n"
        "from selftaught.sleep.intake.spool import Spool\n"
        "s = Spool(Path(sys.argv[1]))\n"
        "s.append([Interaction([{'role': 'user', 'content': f'q{i}'}], 'a') for i in range(5)])\n",
        str(folder),
        env={},
    )
    assert dead.wait(timeout=60) == 0, dead.stderr.read()  # exited without closing its spool
    (left,) = folder.iterdir()
    assert len(left.read_text().splitlines()) == 5
    with TaskLog(pg_url) as log:
        writer = LogWriter(log, home=tmp_path)
        writer.submit(Interaction([{"role": "user", "content": "new"}], "b"))
        assert writer.flush(30)
        writer.close()
        assert sorted(r.messages[0]["content"] for r in log.query()) == [
            "new", "q0", "q1", "q2", "q3", "q4"
        ]  # fmt: skip
    # the new row went straight in after the replay, or through the spool behind the old rows
    assert writer.snapshot()["replayed"] in (5, 6) and not list(folder.iterdir())
