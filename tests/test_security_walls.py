"""Security round four (issue #49): walls between projects and clients.

- URLs stay URLs, secrets stay secret: a password holding `/` or `?` is cut from every URL
  shown or stored (`display_url`, `strip_credentials`, the `url_password` redaction), up to
  the last `@`; `--log URL` with a password warns and points to $SELFTAUGHT_LOG.

(The MCP server's and the hooks' project walls are tested in tests/test_mcp.py and
tests/test_hooks.py.)"""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.http_guard import strip_credentials
from selftaught.redact import redact_text
from selftaught.sleep.intake.log import TaskLog
from selftaught.sleep.store import LogUrl, display_url

pytest.importorskip("fastapi")
from selftaught.sleep.intake.proxy import ProxyConfig, proxy_in_background  # noqa: E402

SECRET = "Secret9"
SLASHED = [
    f"postgresql://app:Ab/{SECRET}@127.0.0.1:1/db",
    f"postgresql://app:Ab?{SECRET}@127.0.0.1:1/db?sslmode=disable",
    f"postgresql://app:Ab#{SECRET}@127.0.0.1:1/db",
    f"postgresql://app:A@b/{SECRET}@127.0.0.1:1/db",
]


# ---- 5. URLs stay URLs, secrets stay secret ----------------------------------------------------


@pytest.mark.parametrize("url", SLASHED)
def test_a_password_holding_a_slash_or_question_mark_is_never_shown(url):
    for shown in (display_url(url), str(LogUrl(url)), strip_credentials(f"see {url} now")):
        assert SECRET not in shown and "127.0.0.1:1/db" in shown, shown
    assert display_url(url).startswith("postgresql://app@127.0.0.1:1/db")
    text, found = redact_text(f"connect with {url} please")
    assert SECRET not in text and found == 1, text


def test_scrubbing_keeps_urls_without_a_password_and_ports_with_paths():
    plain = "http://localhost:8000/api?email=bob@example.com"
    assert redact_text(f"see {plain}")[1] == 0  # a port and a path are no password
    assert strip_credentials("http://h:80/v1#m") == "http://h:80/v1#m"
    assert display_url("postgresql://app@db:5432/x") == "postgresql://app@db:5432/x"


def test_sleep_status_with_such_a_log_shows_no_password_and_warns(tmp_path, monkeypatch):
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(tmp_path / "log.db"))  # --log URL sets it: undone
    done = CliRunner().invoke(app, ["sleep", "status", "--log", SLASHED[0]])
    assert SECRET not in done.output, done.output
    assert "carries a password on the command line" in " ".join(done.stderr.split())
    assert "SELFTAUGHT_LOG" in done.stderr
    assert not (tmp_path / "postgresql:").exists()


def test_the_proxy_shows_no_upstream_password_holding_a_slash(tmp_path):
    config = ProxyConfig(
        upstream=f"http://bob:Ab/{SECRET}@127.0.0.1:9/v1#m",
        port=0,
        log_path=tmp_path / "log.db",
        home=tmp_path / "home",
    )
    with proxy_in_background(config) as (url, _):
        health = httpx.get(url.removesuffix("/v1") + "/health").json()  # no key configured
        answer = httpx.post(
            f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
    assert SECRET not in str(health) and health["upstream"] == "http://127.0.0.1:9/v1#m"
    assert answer.status_code == 502 and SECRET not in answer.text
    (row,) = TaskLog(tmp_path / "log.db").query()
    assert row.meta["upstream"] == "http://127.0.0.1:9/v1#m" and SECRET not in str(row.to_dict())
