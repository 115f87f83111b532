"""Security round four (issue #49): walls between projects and clients.

- URLs stay URLs, secrets stay secret: a password holding `/` or `?` is cut from every URL
  shown or stored (`display_url`, `strip_credentials`, the `url_password` redaction), up to
  the last `@`; `--log URL` with a password warns and points to $SELFTAUGHT_LOG.
- Sessions belong to clients: with client keys, bob cannot give feedback on alice's rows (by
  id or session), his rows sent with alice's session id are a session of their own, and the
  operator's feedback by session names the client, so it never lands on bob's rows.
- A night pointed at the proxy: its calls carry the night's mark (a MAC under the home's
  0600 key), which the proxy relays untouched and never logs; a forged mark is traffic.

(The MCP server's and the hooks' project walls are tested in tests/test_mcp.py and
tests/test_hooks.py.)"""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.http_guard import strip_credentials
from selftaught.redact import redact_text
from selftaught.sleep.intake.log import Interaction, LogFilter, TaskLog
from selftaught.sleep.intake.sessions import collapse_sessions
from selftaught.sleep.replay_mark import REPLAY_HEADER, mark, replay_key
from selftaught.sleep.store import LogUrl, display_url
from tests import loopback

pytest.importorskip("fastapi")
from selftaught.sleep.intake.proxy import (  # noqa: E402
    ID_HEADER,
    ProxyConfig,
    proxy_in_background,
)
from tests.fake_upstream import FakeUpstream, fake_proxy  # noqa: E402
from tests.test_sleep_night_cli import answer, fill  # noqa: E402
from tests.test_sleep_proxy import wait_logged  # noqa: E402

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
        health = loopback.get(url.removesuffix("/v1") + "/health").json()  # no key configured
        answer = loopback.post(
            f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
    assert SECRET not in str(health) and health["upstream"] == "http://127.0.0.1:9/v1#m"
    assert answer.status_code == 502 and SECRET not in answer.text
    (row,) = TaskLog(tmp_path / "log.db").query()
    assert row.meta["upstream"] == "http://127.0.0.1:9/v1#m" and SECRET not in str(row.to_dict())


# ---- 6. sessions belong to clients ---------------------------------------------------------

ALICE, BOB, OPERATOR_KEY = "alice-secret-key", "bob-secret-key-2", "operator-feedback-key-1"


def _ask(url: str, key: str, text: str, session: str) -> str:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
    headers = {"authorization": f"Bearer {key}", "x-claude-code-session-id": session}
    answer = loopback.post(f"{url}/chat/completions", json=body, headers=headers, timeout=20)
    assert answer.status_code == 200, answer.text
    return answer.headers[ID_HEADER]


def _feedback(url: str, key: str, **body: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return loopback.post(f"{url}/feedback", json=body, headers=headers, timeout=20)


def test_a_session_is_its_clients_feedback_and_the_operators_included(tmp_path, log_at):
    keys = tmp_path / "clients.json"
    keys.write_text(f'{{"alice": "{ALICE}", "bob": "{BOB}"}}')
    config = {"client_keys": keys, "feedback_key": OPERATOR_KEY}
    with fake_proxy(tmp_path / "home", log_at, **config) as (url, _, _):
        alices = _ask(url, ALICE, "alice asks", "sess-alice")
        bobs = _ask(url, BOB, "bob asks, later, in alice's session", "sess-alice")
        wait_logged(url, 2, key=ALICE)
        # bob on alice's row: the 404 a missing row gets; by her session id: his own row
        by_id = _feedback(url, BOB, id=alices, thumb="down")
        missing = _feedback(url, BOB, id="no-such-row", thumb="down")
        by_session = _feedback(url, BOB, session_id="sess-alice", thumb="down")
        # the operator by session must say whose; then it lands on that client's row
        unnamed = _feedback(url, OPERATOR_KEY, session_id="sess-alice", reference="x")
        named = _feedback(
            url, OPERATOR_KEY, session_id="sess-alice", client="alice", reference="right"
        )
        own = _feedback(url, ALICE, session_id="sess-alice", thumb="up")
    assert (by_id.status_code, missing.status_code) == (404, 404)
    said = [r.json()["error"]["message"] for r in (by_id, missing)]
    assert said[0].replace(alices, "ID") == said[1].replace("no-such-row", "ID")  # no oracle
    assert by_session.status_code == 200 and by_session.json()["id"] == bobs
    assert unnamed.status_code == 400 and "client" in unnamed.json()["error"]["message"]
    assert named.status_code == 200 and named.json()["id"] == alices
    assert own.status_code == 200 and own.json()["id"] == alices
    log = TaskLog(log_at)
    bob_fb, fb = log.get(bobs).feedback, log.get(alices).feedback
    assert (bob_fb.thumb, bob_fb.giver, bob_fb.reference) == ("down", "bob", None)
    assert (fb.reference, fb.thumb) == ("right", "up") and fb.trusted_for("reference")
    # bob's row is a session of its own: never a step of alice's episode
    kept = collapse_sessions(log.query(LogFilter(project="demo", newest_first=False)))
    assert {it.id for it in kept} == {alices, bobs}


def test_a_session_id_sent_by_two_clients_collapses_apart():
    """bob's row continues alice's conversation under her session id: without the client in
    the session's key, alice's episode would end in bob's reply (and take her feedback)."""
    asked = [{"role": "user", "content": "q"}]
    alice = Interaction(asked, "a", project="p", source="proxy", created_at=1)
    bob = Interaction(
        [*asked, {"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}],
        "b",
        project="p",
        source="proxy",
        created_at=2,
    )
    alice.session_id = bob.session_id = "sess-alice"
    alice.client, bob.client = "alice", "bob"
    assert [it.id for it in collapse_sessions([alice, bob])] == [alice.id, bob.id]


# ---- 7. the night's own calls never come back as traffic -----------------------------------


def test_a_night_pointed_at_the_proxy_never_logs_its_replays(tmp_path, monkeypatch, log_at):
    home = tmp_path / "home"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(log_at))
    runner = CliRunner()
    with FakeUpstream(answer) as upstream:
        fill(log_at, upstream=f"{upstream.base_url}#fake-model")
        config = ProxyConfig(
            upstream=f"{upstream.base_url}#fake-model",
            project="demo",
            port=0,
            log_path=log_at,
            home=home,
        )
        with proxy_in_background(config) as (url, _):
            before = TaskLog(log_at).count()
            night = runner.invoke(app, ["sleep", "run", "--model", f"{url}#fake-model",
                                        "--max-tokens", "32"])  # fmt: skip
            assert night.exit_code == 0, night.output
            night_calls = sum(call["method"] == "POST" for call in upstream.calls)
            adopted = runner.invoke(app, ["sleep", "adopt", "--project", "demo"])
            assert adopted.exit_code == 0, adopted.output
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
            raw = json.dumps(body).encode()
            headers = {"content-type": "application/json"}
            marked = {**headers, **mark(replay_key(home), "/v1/chat/completions", "demo", raw)}
            forged = {**headers, REPLAY_HEADER: "0" * 64}
            for extra in (marked, forged, headers):
                answered = loopback.post(f"{url}/chat/completions", content=raw, headers=extra)
                assert answered.status_code == 200, answered.text
            health = wait_logged(url, 2)
    assert night_calls > 0 and health["night_replays"] == night_calls + 1
    # the night's calls and the marked one: relayed, never logged; the forged and the plain
    # request are traffic
    assert TaskLog(log_at).count() == before + 2
    sent = [json.dumps(call["body"]) for call in upstream.calls[-3:]]
    assert "rule alpha" not in sent[0] and "rule alpha" in sent[1] and "rule alpha" in sent[2]
    assert not any(REPLAY_HEADER in map(str.lower, call["headers"]) for call in upstream.calls)
    assert oct((home / "replay.key").stat().st_mode & 0o777) == "0o600"
