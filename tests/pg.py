"""A PostgreSQL server for the tests: `$SELFTAUGHT_TEST_POSTGRES` (CI starts one), else a
throwaway cluster this process starts with `initdb` (trust auth, loopback only, a free port, a
temp folder; run as an unprivileged user when we are root), else None and the Postgres tests
skip with the reason. Each test gets a fresh database (`fresh_database`), dropped after."""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ENV = "SELFTAUGHT_TEST_POSTGRES"
UNPRIVILEGED = ("postgres", "nobody")  # initdb refuses to run as root
PASSWORD_ROLE = "pwcheck"  # the one role whose password is checked (everyone else: trust)
PASSWORD_RULE = f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n"


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return versions[-1] if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_user(cmd: list[str]) -> tuple[list[str], str | None]:
    """`cmd` run as an unprivileged user when we are root; (command, that user)."""
    if os.geteuid() != 0:
        return cmd, None
    for user in UNPRIVILEGED:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(user)
            return ["runuser", "-u", user, "--", *cmd], user
    raise RuntimeError(f"running as root and no unprivileged user ({', '.join(UNPRIVILEGED)})")


PREFIX = "selftaught-pg-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_orphans(pg_ctl: str) -> None:
    """Stop and delete the clusters of test runs that died without stopping theirs (killed by
    a timeout: no atexit), found by the pid each cluster's folder records."""
    for root in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            owner = int((root / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if not _alive(owner):
            cmd, _ = _as_user([pg_ctl, "-D", str(root / "data"), "-m", "immediate", "stop"])
            subprocess.run(cmd, capture_output=True, timeout=60)
            shutil.rmtree(root, ignore_errors=True)


def _exit_on_sigterm() -> None:
    """`timeout` ends a test run with SIGTERM, which skips atexit: make it an exit that runs
    it (only where nobody handles SIGTERM already)."""
    import signal

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


class Cluster:
    """A throwaway cluster: initdb, start, stop (at exit, or by the next run if this one is
    killed) and delete."""

    def __init__(self, *, durable: bool = False) -> None:
        """`durable`: fsync and synchronous commit on, as a real server (benchmarks); off by
        default (tests are faster without them, and never crash the server)."""
        initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not initdb or not pg_ctl:
            raise RuntimeError("no initdb / pg_ctl on PATH or in /usr/lib/postgresql/*/bin")
        self.pg_ctl = pg_ctl
        _stop_orphans(pg_ctl)
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX))
        (self.root / "owner.pid").write_text(str(os.getpid()))
        self.data = self.root / "data"
        self.port = _free_port()
        cmd, user = _as_user([initdb, "-D", str(self.data), "-A", "trust", "-U", "selftaught",
                              "-E", "UTF8", "--no-sync", "--no-instructions"])  # fmt: skip
        if user:
            shutil.chown(self.root, user)
        self._run(cmd)
        hba = self.data / "pg_hba.conf"  # one role checks its password: the wrong-password test
        hba.write_text(PASSWORD_RULE + hba.read_text())
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
            "-c shared_buffers=32MB -c max_connections=200"
        )
        if not durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        start, _ = _as_user([pg_ctl, "-D", str(self.data), "-o", options, "-w", "-t", "60",
                             "-l", str(self.root / "server.log"), "start"])  # fmt: skip
        self._run(start)
        atexit.register(self.stop)
        if threading.current_thread() is threading.main_thread():
            _exit_on_sigterm()
        self.url = f"postgresql://selftaught@127.0.0.1:{self.port}/postgres"

    @staticmethod
    def _run(cmd: list[str]) -> None:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:4])}... failed: {done.stderr.strip()[-500:]}")

    def stop(self) -> None:
        if self.data.exists():
            cmd, _ = _as_user([self.pg_ctl, "-D", str(self.data), "-m", "immediate", "stop"])
            subprocess.run(cmd, capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)


_server: tuple[str | None, str] | None = None


def server() -> tuple[str | None, str]:
    """(the admin URL of a server, or None; why not). Started once per process."""
    global _server
    if _server is None:
        _server = _find_server()
    return _server


def _find_server() -> tuple[str | None, str]:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return None, "psycopg is not installed (pip install 'selftaught[postgres]')"
    if os.environ.get(ENV):
        return os.environ[ENV], ""
    try:
        return Cluster().url, ""
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        return None, f"no PostgreSQL server: set ${ENV}, or install initdb ({err})"


def database_url(admin_url: str, name: str) -> str:
    """The admin URL with its database replaced by `name`."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(admin_url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


@contextlib.contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    """A new empty database on the server; dropped (its sessions ended) afterwards."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url(admin_url, name)
    finally:
        for _ in range(3):
            try:
                with psycopg.connect(admin_url, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                break
            except psycopg.Error:
                time.sleep(0.5)


class Relay:
    """A TCP relay to the server that can be cut (its connections reset, new ones closed at
    once) and restored: a database going away and coming back, for one test only."""

    def __init__(self, url: str):
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = url.replace(f":{parts.port}/", f":{self.port}/", 1)
        self.up = True
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self.up = False
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            server = socket.create_connection(self.target)
            with self._lock:  # a cut between the check above and here closes this one too
                if not self.up:
                    client.close()
                    server.close()
                    continue
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
