"""A proxy you can leave running (docs/operations.md): its log going away on either backend (a
SQLite file locked by another process, a Postgres server cut off) costs no answer, spools,
shows on /health and /ready, and is replayed when the log returns; with the spool unusable
too, /ready says so; a stop drains the streams in flight and logs them; and the service
recipes (`--print-systemd`, the Dockerfile) hold the options the docs promise."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests import loopback

pytest.importorskip("fastapi")

from selftaught.sleep.intake.log import TaskLog  # noqa: E402
from selftaught.sleep.intake.proxy import ProxyConfig, proxy_in_background  # noqa: E402
from selftaught.sleep.store.postgres import POOL_TIMEOUT_S  # noqa: E402
from tests import pg  # noqa: E402
from tests.fake_upstream import FakeUpstream, asker, health, wait_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")

HOLD_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")  # every other writer waits, as behind a long forget or backup
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


class SqliteOutage:
    """The log file held locked by another process (never a second connection in this one:
    closing it would drop the proxy's own locks)."""

    def __init__(self, tmp_path: Path):
        self.log_path: Path | str = tmp_path / "log.db"
        self.words = "locked"
        self._proc: subprocess.Popen[str] | None = None

    def cut(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", HOLD_LOCK, str(self.log_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None and self._proc.stdout.readline() == "locked\n"

    def restore(self) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write("\n")
        self._proc.stdin.flush()
        assert self._proc.wait(timeout=30) == 0

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=30)


class PostgresOutage:
    """The database behind a relay that is cut (connections reset, new ones refused)."""

    def __init__(self, url: str, monkeypatch: pytest.MonkeyPatch):
        self.relay = pg.Relay(url)
        self.log_path = self.relay.url
        self.words = "cannot write"
        monkeypatch.setenv("SELFTAUGHT_LOG", self.relay.url)  # versions read through it too

    def cut(self) -> None:
        self.relay.cut()

    def restore(self) -> None:
        self.relay.restore()

    def close(self) -> None:
        from selftaught.sleep.store import versions

        versions.forget(self.relay.url)
        self.relay.close()


@pytest.fixture(params=["sqlite", "postgres"])
def outage(request, tmp_path, monkeypatch) -> Iterator[SqliteOutage | PostgresOutage]:
    if request.param == "sqlite":
        made: SqliteOutage | PostgresOutage = SqliteOutage(tmp_path)
    else:
        made = PostgresOutage(request.getfixturevalue("pg_url"), monkeypatch)
    try:
        yield made
    finally:
        made.close()


def own(url: str, route: str) -> httpx.Response:
    return loopback.get(url.removesuffix("/v1") + route, timeout=30)


def test_a_log_that_goes_away_costs_no_answer_and_is_replayed_when_it_returns(outage, tmp_path):
    home = tmp_path / "home"
    with FakeUpstream() as upstream:
        config = ProxyConfig(upstream=f"{upstream.base_url}#m", project="demo", port=0,
                             log_path=outage.log_path, home=home)  # fmt: skip
        with proxy_in_background(config) as (url, _app):
            ask = asker(url)
            before = [ask(f"before {i}") for i in range(2)]
            wait_for(lambda: health(url)["log"]["logged"] == 2)
            assert own(url, "/ready").json() == {"status": "ready"}
            outage.cut()
            during = [ask("during 0")]  # answered; it may wait for the log (`log_wait_s`)
            started = time.monotonic()
            during += [ask(f"during {i}") for i in range(1, 5)]  # every one answered
            # and none waits on the database that does not answer (the adopted version a
            # request serves is the cached one: each used to wait out the pool's timeout)
            assert time.monotonic() - started < POOL_TIMEOUT_S
            log = wait_for(lambda: (h := health(url)["log"])["spooled"] == 5 and h)
            assert log["state"] == "unreachable" and outage.words in log["error"]
            assert log["spool_waiting"] == 5 and log["failures"] == log["dropped"] == 0
            stats = health(url)
            if isinstance(outage, SqliteOutage):  # a lock is waited for 2 s, then spooled, so
                # each row reached the spool before its answer's last byte went out (Postgres:
                # the first one may wait out the pool's 5 s, as long as `log_wait_s`)
                assert stats["answered_before_logged"] == 0
            ready = own(url, "/ready")  # the spool takes the rows: still worth sending traffic
            assert ready.status_code == 200 and stats["ready"] is True
            outage.restore()
            log = wait_for(lambda: (h := health(url)["log"])["state"] == "ok" and h)
            assert log["replayed"] == 5 and log["spool_waiting"] == 0
            after = ask("after")
            wait_for(lambda: health(url)["log"]["logged"] == 3)
        with TaskLog(outage.log_path) as stored:
            rows = stored.query()
    assert sorted(r.id for r in rows) == sorted(before + during + [after])
    assert not list((home / "spool").iterdir())  # nothing left behind


def test_ready_says_when_rows_can_go_nowhere_and_comes_back_without_traffic(tmp_path):
    outage = SqliteOutage(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (home / "spool").write_text("not a folder")  # the spool cannot be written either
    try:
        with FakeUpstream() as upstream:
            config = ProxyConfig(upstream=f"{upstream.base_url}#m", project="demo", port=0,
                                 log_path=outage.log_path, home=home)  # fmt: skip
            with proxy_in_background(config) as (url, _app):
                ask = asker(url)
                ask("before")
                outage.cut()
                ask("during")  # still answered: its row is counted as failed, said on stderr
                stats = wait_for(lambda: (h := health(url))["log"]["failures"] and h)
                why = "log_and_spool_unavailable"
                assert stats["ready"] is False and stats["not_ready"] == why
                assert stats["log"]["spool_error"] and stats["log"]["state"] == "unreachable"
                ready = own(url, "/ready")
                assert ready.status_code == 503
                assert ready.json() == {"status": "not_ready", "reason": why}
                outage.restore()  # no request comes meanwhile: the writer probes the log
                wait_for(lambda: own(url, "/ready").status_code == 200)
                assert health(url)["log"]["state"] == "ok"
                ask("after")
                wait_for(lambda: health(url)["log"]["logged"] == 2)
    finally:
        outage.close()


def test_a_sqlite_file_that_cannot_be_written_now_is_unavailable_not_bad_input(tmp_path):
    import sqlite3

    from selftaught.sleep.intake.log import Interaction, LogUnavailable
    from selftaught.sleep.store.sqlite import unavailable

    log = TaskLog(tmp_path / "log.db")
    log.add(Interaction([{"role": "user", "content": "q"}], "a"))
    with log._backend.read() as conn:  # SQLite's own READONLY error, as on a read-only mount
        conn.execute("PRAGMA query_only = ON")
    with pytest.raises(LogUnavailable, match="cannot write the task log .*readonly"):
        log.add(Interaction([{"role": "user", "content": "r"}], "a"))
    with pytest.raises(LogUnavailable):
        log.ping()  # what the proxy's writer probes while the log is away
    log.close()
    with pytest.raises(sqlite3.OperationalError) as bad:  # a wrong statement is not waited out
        sqlite3.connect(":memory:").execute("SELEC 1")
    assert not unavailable(bad.value)


# ---- a stop drains -------------------------------------------------------------------------


@contextlib.contextmanager
def proxy_process(tmp_path: Path, upstream: FakeUpstream, *args: str):
    """`selftaught proxy` in its own process (signals as a service manager sends them);
    yields (the process, its /v1 URL, its log path) once /ready answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path / "log.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "selftaught", "proxy", "--upstream", f"{upstream.base_url}#m",
         "--port", str(port), "--log", str(log_path), *args],
        env={**os.environ, "PYTHONPATH": SRC, "SELFTAUGHT_HOME": str(tmp_path / "home")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if own(url, "/ready").status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)
        yield proc, url, log_path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def stream_then_stop(url: str, proc: subprocess.Popen[str], after_chunks: int) -> str:
    """A streamed answer during which the proxy gets SIGTERM; the text the client received."""
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "long"}], stream=True
    )
    text = ""
    with contextlib.suppress(openai.APIError, httpx.HTTPError):  # a cut stream ends abruptly
        for n, chunk in enumerate(stream):
            text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
            if n == after_chunks:
                proc.send_signal(signal.SIGTERM)
    return text


def test_a_stop_lets_the_streams_in_flight_finish_and_logs_them(tmp_path):
    words = " ".join(f"w{i}" for i in range(60))
    with FakeUpstream(lambda m: words, chunk_delay_s=0.03) as upstream:
        with proxy_process(tmp_path, upstream) as (proc, url, log_path):
            received = stream_then_stop(url, proc, after_chunks=5)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM), proc.stdout.read()
            with pytest.raises(httpx.ConnectError):  # the port is closed: a balancer moves on
                own(url, "/health")
    assert received == words  # the whole answer, after the stop began
    (row,) = TaskLog(log_path).query()
    assert row.reply == words and row.error is None


def test_a_stream_past_the_drain_timeout_is_cut_and_logged_as_cut(tmp_path):
    words = " ".join(f"w{i}" for i in range(400))
    with FakeUpstream(lambda m: words, chunk_delay_s=0.03) as upstream:
        with proxy_process(tmp_path, upstream, "--drain-timeout", "1") as (proc, url, log_path):
            received = stream_then_stop(url, proc, after_chunks=5)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM), proc.stdout.read()
    assert received and len(received) < len(words)
    (row,) = TaskLog(log_path).query()  # what was sent before the cut, and why it ended
    assert row.error == "the proxy stopped before the stream ended (drain timeout)"
    assert row.reply and words.startswith(row.reply) and len(row.reply) < len(words)


# ---- the service recipe: --print-systemd -----------------------------------------------------

SANDBOX = {  # what the unit must set, as docs/operations.md lists it
    "User": "selftaught",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "StateDirectory": "selftaught",
    "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    "SystemCallFilter": "@system-service",
    "SystemCallArchitectures": "native",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictNamespaces": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "UMask": "0077",
    "CapabilityBoundingSet": "",
}


def print_unit(*args: str, env: dict[str, str | None] | None = None) -> str:
    from typer.testing import CliRunner

    from selftaught import cli

    # `--log URL` sets $SELFTAUGHT_LOG for the command: named here, the runner restores it
    env = {"SELFTAUGHT_LOG": None, **(env or {})}
    result = CliRunner().invoke(cli.app, ["proxy", *args, "--print-systemd"], env=env)
    assert result.exit_code == 0, result.output
    return result.stdout


def unit_keys(text: str) -> dict[str, list[str]]:
    """`Key=value` lines of a unit, each key's values in order (comments and sections out)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def verify(unit: str, tmp_path: Path, name: str = "selftaught-proxy-demo.service") -> None:
    """`systemd-analyze verify` says nothing (no unknown key, no bad value, the program
    exists); skipped, saying why, where systemd-analyze is not installed."""
    import shutil

    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here (Debian: apt-get install systemd)")
    path = tmp_path / name
    path.write_text(unit)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stderr
    # systemd's own score of the sandbox, 0 (shut) to 10 (open; its threshold counts tenths)
    score = ["systemd-analyze", "security", "--offline=true", "--threshold=30", str(path)]
    done = subprocess.run(score, capture_output=True, text=True, timeout=60)
    if "offline" in done.stderr and "unrecognized" in done.stderr:  # systemd < 250
        return
    assert done.returncode == 0, done.stdout[-800:]


def test_print_systemd_writes_a_sandboxed_unit_with_no_secret_in_it(tmp_path, monkeypatch):
    import shlex

    monkeypatch.delenv("SELFTAUGHT_LOG", raising=False)
    keys = tmp_path / "keys.toml"
    keys.write_text('alice = "alice-key-123456"\n')
    upstream = "http://127.0.0.1:8000/v1#m"
    given = ["--upstream", upstream, "--project", "demo", "--port", "8080", "--no-inject",
             "--drain-timeout", "20", "--canary-share", "0.1"]  # fmt: skip
    unit = print_unit(*given, "--require-key", "sekrit-proxy-key", "--feedback-key",
                      "sekrit-feedback-key", "--client-keys", str(keys),
                      env={"SELFTAUGHT_HOME": None})  # fmt: skip
    assert "sekrit" not in unit and "alice-key" not in unit
    found = unit_keys(unit)
    for key, value in SANDBOX.items():
        assert found.get(key) == [value], key
    assert found["ProtectHome"][0] in ("yes", "read-only")  # read-only: Python under /home
    assert found["ReadWritePaths"] == ["/var/lib/selftaught"]
    assert "Environment=SELFTAUGHT_HOME=/var/lib/selftaught" in unit
    assert found["TimeoutStopSec"] == ["50"]  # past the drain, time to flush the log
    # the keys are read from the environment file, which must exist (no leading "-")
    assert found["EnvironmentFile"] == ["/etc/selftaught/selftaught-proxy-demo.env"]
    assert "#     SELFTAUGHT_PROXY_KEY=..." in unit and "SELFTAUGHT_FEEDBACK_KEY=..." in unit
    assert found["LoadCredential"] == [f"client-keys:{keys}"]
    command = shlex.split(found["ExecStart"][0])
    assert command[:4] == [sys.executable, "-m", "selftaught", "proxy"]
    assert command[4:] == [*given, "--client-keys", "%d/client-keys"]
    verify(unit, tmp_path)


def test_the_units_command_is_the_same_proxy(tmp_path, monkeypatch):
    """The printed command, run again with --print-systemd, prints the same unit: its words
    parse back into the options given."""
    import shlex

    monkeypatch.delenv("SELFTAUGHT_LOG", raising=False)
    home = tmp_path / "srv home"  # a space, quoted in the unit
    unit = print_unit("--upstream", "http://127.0.0.1:8000/v1#m", "--project", "demo",
                      "--port", "443", "--trusted-clients", "*", "--log",
                      str(tmp_path / "logs" / "log 1.db"),
                      env={"SELFTAUGHT_HOME": str(home), "PYTHONPATH": SRC})  # fmt: skip
    found = unit_keys(unit)  # PYTHONPATH on both sides: the unit carries it (the rerun needs it)
    assert found["AmbientCapabilities"] == ["CAP_NET_BIND_SERVICE"]  # a port below 1024
    assert found["ReadWritePaths"] == [f'"{home}"', str(tmp_path / "logs")]
    command = shlex.split(found["ExecStart"][0])
    env = {**os.environ, "PYTHONPATH": SRC, "SELFTAUGHT_HOME": str(home)}
    again = subprocess.run([*command, "--print-systemd"], capture_output=True, text=True,
                           env=env, timeout=120)  # fmt: skip
    assert again.returncode == 0 and again.stdout == unit, again.stderr
    verify(unit, tmp_path)


def test_a_log_urls_password_goes_to_the_environment_file(tmp_path, monkeypatch):
    monkeypatch.delenv("SELFTAUGHT_LOG", raising=False)
    url = "postgresql://app:pw-sekrit@db.internal:5432/selftaught"
    unit = print_unit("--upstream", "http://127.0.0.1:8000/v1#m", "--log", url)
    assert "pw-sekrit" not in unit and "db.internal" not in unit
    assert "#     SELFTAUGHT_LOG=..." in unit
    plain_url = "postgresql://app@db.internal/selftaught"
    plain = print_unit("--upstream", "http://h:8000/v1#m", env={"SELFTAUGHT_LOG": plain_url})
    assert f"--log {plain_url}" in unit_keys(plain)["ExecStart"][0]
    assert unit_keys(plain)["EnvironmentFile"] == ["-/etc/selftaught/selftaught-proxy-default.env"]


# ---- the container recipe: the Dockerfile ------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments), lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        word, _, rest = line.strip().partition(" ")
        if word.upper() == "FROM":
            stages.append([])
        stages[-1].append((word.upper(), " ".join(rest.split())))
    return stages


def test_the_dockerfile_installs_the_wheel_and_runs_unprivileged_behind_a_key():
    import fnmatch
    import json

    build, final = dockerfile_stages()
    assert any(i == "RUN" and "pip wheel" in a and a.endswith(" .") for i, a in build)
    installs = [a for i, a in final if i == "RUN" and "pip install" in a]
    assert installs and all(".whl" in a and " -e " not in a for a in installs)  # the wheel only
    steps = [i for i, _ in final]
    user = [a for i, a in final if i == "USER"]
    assert user and user[-1] not in ("root", "0")  # an unprivileged user runs the proxy
    assert steps.index("USER") < steps.index("ENTRYPOINT")
    assert ("EXPOSE", "8080") in final
    assert any(i == "HEALTHCHECK" and "/ready" in a for i, a in final)
    (entry,) = [json.loads(a) for i, a in final if i == "ENTRYPOINT"]
    assert ("COPY", f"scripts/container-entrypoint.sh /usr/local/bin/{entry[0]}") in final
    assert any(i == "VOLUME" and "/var/lib/selftaught" in a for i, a in final)
    # every file copied from the build context exists and passes .dockerignore's allow list
    allowed = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]  # fmt: skip
    for instruction, args in build + final:
        if instruction == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), source
                assert any(fnmatch.fnmatch(source.rstrip("/"), a) for a in allowed), source


def test_the_containers_entry_point_refuses_to_start_without_a_client_key(tmp_path):
    stub = tmp_path / "bin" / "selftaught"  # stands for the installed command: says its args
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\necho "selftaught $*"\n')
    stub.chmod(0o755)
    script = str(ROOT / "scripts" / "container-entrypoint.sh")
    path = f"{stub.parent}{os.pathsep}{os.environ['PATH']}"

    def start(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("SELFTAUGHT_")}
        return subprocess.run(["sh", script, *args], capture_output=True, text=True,
                              env={**clean, "PATH": path, **env}, timeout=30)  # fmt: skip

    refused = start("--upstream", "http://vllm:8000/v1#m")
    assert refused.returncode == 2 and "SELFTAUGHT_PROXY_KEY" in refused.stderr
    assert not refused.stdout  # the proxy never started
    keyed = start("--upstream", "http://vllm:8000/v1#m", SELFTAUGHT_PROXY_KEY="k" * 16)
    assert keyed.returncode == 0
    assert keyed.stdout.split() == [
        *("selftaught", "proxy", "--host", "0.0.0.0", "--port", "8080", "--allow-remote"),
        *("--upstream", "http://vllm:8000/v1#m"),
    ]
    assert start("--client-keys", "/run/secrets/keys.toml", "--upstream", "x").returncode == 0


def test_the_documented_sqlite_backup_copies_a_live_log(tmp_path):
    """docs/operations.md's backup lines, run while the proxy holds the log open."""
    page = (ROOT / "docs" / "operations.md").read_text()
    block = page.split("umask 077", 1)[1].split("```", 1)[0]
    with FakeUpstream() as upstream:
        home = tmp_path / "home"
        config = ProxyConfig(upstream=f"{upstream.base_url}#m", project="demo", port=0,
                             log_path=home / "log.db", home=home)  # fmt: skip
        with proxy_in_background(config) as (url, _app):
            ids = [asker(url)(f"q{i}") for i in range(3)]
            wait_for(lambda: health(url)["log"]["logged"] == 3)
            env = {**os.environ, "PYTHONPATH": SRC, "SELFTAUGHT_HOME": str(tmp_path / "home")}
            env.pop("SELFTAUGHT_LOG", None)
            done = subprocess.run(["bash", "-ec", "umask 077" + block], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=60)  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert ask_ok(url)  # the proxy goes on writing after the copy
    backup = tmp_path / "log-backup.db"
    assert oct(backup.stat().st_mode & 0o777) == "0o600"
    with TaskLog(backup) as copy:
        assert copy.integrity_check() == "ok" and sorted(r.id for r in copy.query()) == sorted(ids)


def ask_ok(url: str) -> bool:
    asker(url)("after the backup")
    return wait_for(lambda: health(url)["log"]["logged"] == 4)
