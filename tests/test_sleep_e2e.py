"""The issue's done-when scenario with the embedded model and real processes: `selftaught serve`
(SmolLM2-135M), `selftaught proxy` in front of it, the official openai client sending plain and
streamed requests, `selftaught sleep log` showing them redacted, feedback attached, an adopted
skill injected; and the proxy with `--upstream local` (the model in the proxy's process)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from selftaught import cli
from selftaught.runs import atomic_write_text
from selftaught.sleep.log import TaskLog
from selftaught.sleep.paths import adopted_dir

pytestmark = pytest.mark.local
SRC = str(Path(__file__).resolve().parents[1] / "src")
SECRET = "sk-proj-" + "Qx7" * 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        if proc.poll() is not None:
            pytest.fail(f"process exited: {proc.stderr.read().decode()[-2000:]}")
        assert time.monotonic() < deadline, "did not start in time"
        time.sleep(0.2)


@pytest.fixture
def embedded_available():
    pytest.importorskip("transformers")
    from selftaught.models.embedded import EmbeddedModelMissing, embedded_model_dir

    try:
        embedded_model_dir()
    except EmbeddedModelMissing as err:
        pytest.skip(f"embedded model unavailable: {err}")


@pytest.mark.slow  # two model processes: ~30 s on 2 busy cores
def test_serve_proxy_openai_client_log_feedback(tmp_path, monkeypatch, embedded_available):
    home, log_path = tmp_path / "home", tmp_path / "log.db"
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "HF_HUB_OFFLINE": "1",
        "SELFTAUGHT_HOME": str(home),
        "SELFTAUGHT_LOG": str(log_path),
    }
    serve_port, proxy_port = _free_port(), _free_port()
    procs = []
    try:
        serve_cmd = ["serve", "--model", "local", "--port", str(serve_port)]
        serve = subprocess.Popen(
            [sys.executable, "-m", "selftaught", *serve_cmd],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        procs.append(serve)
        upstream = f"http://127.0.0.1:{serve_port}/v1#SmolLM2-135M-Instruct"
        proxy_cmd = [
            "proxy",
            "--upstream",
            upstream,
            "--port",
            str(proxy_port),
            "--project",
            "demo",
        ]
        proxy = subprocess.Popen(
            [sys.executable, "-m", "selftaught", *proxy_cmd],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        procs.append(proxy)
        _wait_up(f"http://127.0.0.1:{serve_port}", serve)
        _wait_up(f"http://127.0.0.1:{proxy_port}", proxy)
        url = f"http://127.0.0.1:{proxy_port}/v1"
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)

        plain = client.chat.completions.with_raw_response.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": f"Key {SECRET}. Say hi."}],
            max_tokens=8,
            temperature=0,
        )
        plain_text = plain.parse().choices[0].message.content
        assert plain_text.strip()
        # adopt a skill the way part 2 will: the next request carries it, no restart
        folder = adopted_dir("demo", home)
        atomic_write_text(folder / "skill.md", "Answer in one short sentence.")
        atomic_write_text(folder / "version", "1\n")
        with client.chat.completions.with_streaming_response.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": "Name a color."}],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        ) as raw:
            streamed_id = raw.headers["x-selftaught-interaction-id"]
            chunks = list(raw.parse())
        streamed_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed_text.strip() and chunks[-1].usage.completion_tokens > 0

        health = {}
        for _ in range(100):
            health = httpx.get(f"http://127.0.0.1:{proxy_port}/health").json()
            if health["log"]["logged"] == 2:
                break
            time.sleep(0.1)
        assert health["log"]["logged"] == 2 and health["adopted_version"] == "1"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)

    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(log_path))
    monkeypatch.setattr(cli.out, "width", 250)
    runner = CliRunner()
    shown = runner.invoke(cli.app, ["sleep", "log", "--project", "demo"])
    text = " ".join(shown.output.split())
    assert shown.exit_code == 0 and "2 rows match" in text and "skill v1" in text
    assert SECRET not in text and "[REDACTED:openai_key]" in text
    fb = runner.invoke(cli.app, ["sleep", "feedback", streamed_id[:8], "--thumbs", "up"])
    assert fb.exit_code == 0, fb.output

    log = TaskLog(log_path)
    first = log.get(plain.headers["x-selftaught-interaction-id"])
    assert first.reply == plain_text and first.skill_version is None and first.redactions == 1
    second = log.get(streamed_id)
    assert second.reply == streamed_text and second.skill_version == "1"
    assert second.messages == [{"role": "user", "content": "Name a color."}]  # skill not logged
    assert second.feedback.thumb == "up" and second.completion_tokens > 0
    assert SECRET not in json.dumps([first.to_dict(), second.to_dict()])


def test_proxy_with_the_model_in_process(tmp_path, embedded_available):
    from selftaught.sleep.proxy import ProxyConfig, proxy_in_background

    config = ProxyConfig(upstream="local", port=0, log_path=tmp_path / "log.db", home=tmp_path)
    with proxy_in_background(config) as (url, app):
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct"]
        kwargs = {"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 6}
        plain = client.chat.completions.create(model="any-name", temperature=0, **kwargs)
        stream = client.chat.completions.create(
            model="any-name", temperature=0, stream=True, **kwargs
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert streamed == plain.choices[0].message.content  # greedy: the same reply both ways
        assert app.state.proxy.writer.flush(30)
    rows = TaskLog(tmp_path / "log.db").query()
    assert len(rows) == 2 and all(r.reply == streamed and r.is_task for r in rows)
