"""Issue 63, class 7: an upstream that quotes the key it was sent (a 401 echoing the
Authorization / x-api-key / x-goog-api-key header) never gets that key shown or stored.

Scripted upstreams (tests/fake_upstream.py, tests/native_upstream.py: fault "echo-401") quote
the key bare and in its header; the key has no shape a redaction pattern knows, so only the
scrub of configured keys can hide it. Checked on stdout/stderr and on every file the command
leaves (eval's output, a night's folder: error.json, report.json, report.md, diagnostics), a
night on both log backends, and the proxy's relayed answer and logged row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.cli import app
from selftaught.models.errors import classify_status
from selftaught.sleep.intake.log import TaskLog
from tests import loopback
from tests.fake_upstream import FakeUpstream, fake_proxy
from tests.native_upstream import NativeServer
from tests.test_sleep_night_cli import fill

pytest.importorskip("anthropic")
pytest.importorskip("google.genai")

KEY = "plainkey4c7e9a1bzz"  # no vendor prefix, no telling name: only the scrub can hide it
WIRES = ("openai", "openai-env", "anthropic", "gemini")


def files_holding(root: Path, secret: str) -> list[str]:
    """Every file under `root` whose bytes hold `secret` (or its first 8 characters)."""
    needles = (secret.encode(), secret[:8].encode())
    return [
        str(p) for p in root.rglob("*") if p.is_file() and any(n in p.read_bytes() for n in needles)
    ]


@pytest.fixture
def echoing(monkeypatch, tmp_path):
    """Start a scripted upstream for `wire` that answers every call 401 quoting its key; the
    model spec and the CLI arguments that give it KEY (by --api-key, or a vendor variable)."""
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(cli.out, "width", 250)
    monkeypatch.setattr(cli.console, "width", 250)
    for vendor in ("OPENAI", "ANTHROPIC", "GEMINI", "GOOGLE", "SELFTAUGHT"):
        monkeypatch.delenv(f"{vendor}_API_KEY", raising=False)
        monkeypatch.delenv(f"{vendor}_BASE_URL", raising=False)
    servers: list = []

    def start(wire: str) -> tuple[str, list[str]]:
        if wire.startswith("openai"):
            server = FakeUpstream().__enter__()
            server.faults.extend(["echo-401"] * 100)
            servers.append(server)
            if wire == "openai-env":  # the user's OpenAI key, from the environment
                monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
                monkeypatch.setenv("OPENAI_API_KEY", KEY)
                return "openai:fake-model", []
            return f"{server.base_url}#fake-model", ["--api-key", KEY]
        native = NativeServer(wire).__enter__()
        native.faults.extend(["echo-401"] * 100)
        servers.append(native)
        monkeypatch.setenv(f"{wire.upper()}_BASE_URL", native.base_url)
        return f"{wire}:model-x", ["--api-key", KEY]

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


def test_an_echoed_key_is_cut_from_the_servers_message_before_it_is_shortened():
    """The server's message is cut to 300 characters: a key across the cut must not leave its
    first characters behind."""
    from selftaught.given_keys import add_secret

    add_secret(KEY)
    err = classify_status("openai-compatible x", 401, "x" * 290 + " " + KEY + " trailing")
    assert KEY[:8] not in str(err) and "[REDACTED" in str(err)


@pytest.mark.parametrize("wire", WIRES)
def test_eval_never_shows_or_stores_an_echoed_key(echoing, wire, tmp_path):
    spec, key_args = echoing(wire)
    code, output = invoke(
        "eval", "--task", "gym:basic_arithmetic", "--model", spec, "--limit", "2",
        "--timeout", "5", "--output", str(tmp_path / "eval.jsonl"), *key_args,
    )  # fmt: skip
    assert code == 1 and "the API key was rejected" in output, output
    assert KEY[:8] not in output
    assert files_holding(tmp_path, KEY) == []


@pytest.mark.parametrize("wire", WIRES)
def test_a_night_never_shows_or_stores_an_echoed_key(echoing, wire, tmp_path, monkeypatch, log_at):
    monkeypatch.setenv("SELFTAUGHT_LOG", str(log_at))
    fill(log_at)
    spec, key_args = echoing(wire)
    code, output = invoke("sleep", "run", "--model", spec, "--max-tokens", "32", *key_args)
    assert code == 1 and "backend_failed" in output and "rejected" in output, output
    assert KEY[:8] not in output
    night = next((tmp_path / "home" / "projects" / "demo" / "nights").iterdir())
    written = {p.name for p in night.iterdir()}
    assert {"error.json", "report.json", "report.md"} <= written, written
    assert "rejected" in json.loads((night / "report.json").read_text())["reason"]
    assert files_holding(tmp_path, KEY) == []


@pytest.mark.parametrize("own_key", [True, False], ids=["operator-key", "client-key"])
def test_the_proxy_never_relays_or_logs_an_echoed_key(tmp_path, log_at, own_key):
    """The operator's key (`--api-key`) never reaches a client through an upstream's echo;
    neither key, the operator's or a client's passed on, is stored in the row."""
    config = {"api_key": KEY} if own_key else {}
    headers = {} if own_key else {"authorization": f"Bearer {KEY}"}
    with fake_proxy(tmp_path / "home", log_at, **config) as (url, _, upstream):
        upstream.faults.append("echo-401")
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
        answer = loopback.post(f"{url}/chat/completions", json=body, headers=headers, timeout=20)
        sent = {k.lower(): v for k, v in upstream.headers[-1].items()}
        assert sent["authorization"] == f"Bearer {KEY}"  # what the upstream echoes
    assert answer.status_code == 401
    assert KEY[:8] not in answer.text
    rows = TaskLog(log_at).query()
    assert len(rows) == 1 and "401" in (rows[0].error or "")
    assert KEY[:8] not in json.dumps(rows[0].to_dict())
    assert files_holding(tmp_path, KEY) == []
