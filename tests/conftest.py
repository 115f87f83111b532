"""Fixtures shared by the sleep tests: the task log on both backends.

`log_at` is where a test's task log lives, once per backend: a SQLite file in the test's temp
folder, and a fresh Postgres database (`tests/pg.py`) with $SELFTAUGHT_LOG naming it, so the
adopted versions and the night's lock live there too. The Postgres run skips, with the reason,
only when no server can be had (no psycopg, no $SELFTAUGHT_TEST_POSTGRES and no initdb)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import pg

BACKENDS = ("sqlite", "postgres")


@pytest.fixture
def pg_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh Postgres database's URL, also in $SELFTAUGHT_LOG (versions and lock follow)."""
    admin, why = pg.server()
    if admin is None:
        pytest.skip(why)
    with pg.fresh_database(admin) as url:
        monkeypatch.setenv("SELFTAUGHT_LOG", url)
        yield url
        from selftaught.sleep.store import versions

        versions.forget(url)  # its pooled connections and cached reads go with the database


@pytest.fixture(params=BACKENDS)
def log_at(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """The test's task log: a SQLite path, or a Postgres URL (see the module docstring)."""
    if request.param == "sqlite":
        return tmp_path / "log.db"
    return request.getfixturevalue("pg_url")


@pytest.fixture(autouse=True)
def _selftaught_environment_kept() -> Iterator[None]:
    """The `SELFTAUGHT_*` variables as they were before each test: a command run in process
    sets some for its run (`--log URL` sets $SELFTAUGHT_LOG), and a later test must not read
    them (the next file's nights went to a made-up Postgres host)."""
    before = {k: v for k, v in os.environ.items() if k.startswith("SELFTAUGHT_")}
    yield
    for name in [k for k in os.environ if k.startswith("SELFTAUGHT_") and k not in before]:
        del os.environ[name]
    os.environ.update(before)


@pytest.fixture(autouse=True)
def _night_reports_round_trip(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every night report.json a test leaves in its temp folder reads into a `NightResult`
    whose `report_dict()` is that file, key for key and in order (issue 50: the typed result
    keeps report.json's shape)."""
    wanted = "tmp_path" in request.fixturenames
    root = request.getfixturevalue("tmp_path") if wanted else None  # before it is torn down
    yield
    if root is not None:
        from tests.night_reports import check_round_trip

        check_round_trip(root)
