"""Nothing answered is lost, whatever runs beside the proxy.

A real `selftaught proxy` process with its background threads on (probation after every
request, `--auto-rollback`) answers requests while other processes read the log
(`sleep log`), write to it (`sleep import`, `sleep feedback`) and close their connections.
Every answered request must be a row. On the code before this test, closing a raw descriptor
of the database dropped the proxy's POSIX locks, a `sleep log` in another shell deleted the
WAL under the proxy, and its later rows went into a deleted file while `/health` said 0
failures."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai

from selftaught.sleep.intake.log import LogFilter, TaskLog
from tests import loopback
from tests.fake_upstream import FakeUpstream
from tests.test_sleep_proxy import wait_healthy

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _selftaught(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "selftaught", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_answers_are_rows_while_other_processes_read_and_write_the_log(tmp_path):
    log_path = tmp_path / "log.db"
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "SELFTAUGHT_HOME": str(tmp_path / "home"),
        "SELFTAUGHT_LOG": str(log_path),
    }
    imports = tmp_path / "import.jsonl"
    port = _free_port()
    with FakeUpstream() as upstream:
        args = ["--upstream", f"{upstream.base_url}#fake-model", "--port", str(port)]
        watch = ["--auto-rollback", "--probation-every", "1", "--project", "demo"]
        proxy = subprocess.Popen(
            [sys.executable, "-m", "selftaught", "proxy", *args, *watch],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}/v1"
        answered: list[str] = []
        try:
            wait_healthy(proxy, url)
            client = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=30)
            # each turn starts two CLI processes beside the proxy; the second turn's request
            # comes after the first turn's processes opened and closed the log
            for i in range(2):
                reply = client.chat.completions.with_raw_response.create(
                    model="fake-model", messages=[{"role": "user", "content": f"request {i}"}]
                )
                answered.append(reply.headers["x-selftaught-interaction-id"])
                time.sleep(0.3)  # the proxy's writer and probation thread have run
                # another process opens the log, reads it and closes it again
                listed = _selftaught(env, "sleep", "log", "--limit", "3")
                assert listed.returncode == 0, listed.stderr
                row = {"messages": [{"role": "user", "content": f"imported {i}"}], "reply": "ok"}
                imports.write_text(json.dumps(row) + "\n")
                imported = _selftaught(env, "sleep", "import", str(imports), "--project", "other")
                assert imported.returncode == 0, imported.stderr
            feedback = _selftaught(env, "sleep", "feedback", answered[0], "--thumbs", "up")
            assert feedback.returncode == 0, feedback.stderr
            health = loopback.get(url.removesuffix("/v1") + "/health").json()
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)
    assert health["log"]["failures"] == 0
    log = TaskLog(log_path)
    assert log.integrity_check() == "ok"
    logged = {r.id for r in log.query(LogFilter(project="demo"))}
    missing = [i for i in answered if i not in logged]
    assert not missing, f"{len(missing)} of {len(answered)} answered requests are not in the log"
    assert log.count(LogFilter(project="other")) == 2


def _load(
    url: str, stop: threading.Event, answered: list[str], lock: threading.Lock, n: int
) -> None:
    """Send requests until `stop` (streamed and not, alternately); keep the id of each answer
    that arrived whole."""
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=10)
    i = 0
    while not stop.is_set():
        i += 1
        messages = [{"role": "user", "content": f"load {n}.{i}"}]
        try:
            if i % 2:
                raw = client.chat.completions.with_raw_response.create(
                    model="fake-model", messages=messages
                )
                raw.parse()
                iid = raw.headers["x-selftaught-interaction-id"]
            else:
                with client.chat.completions.with_streaming_response.create(
                    model="fake-model", messages=messages, stream=True
                ) as raw:
                    chunks = list(raw.parse())
                    iid = raw.headers["x-selftaught-interaction-id"]
                if not chunks or chunks[-1].choices and not chunks[-1].choices[0].finish_reason:
                    continue  # cut off: not an answer
        except (openai.APIError, httpx.HTTPError):
            continue  # the proxy is gone: this request was never answered
        with lock:
            answered.append(iid)


def test_kill_9_under_load_leaves_no_answered_request_out_of_the_log(log_at, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "SELFTAUGHT_HOME": str(tmp_path / "home"),
        "SELFTAUGHT_LOG": str(log_at),
    }
    port = _free_port()
    with FakeUpstream(chunk_delay_s=0.001) as upstream:
        args = ["--upstream", f"{upstream.base_url}#fake-model", "--port", str(port)]
        proxy = subprocess.Popen(
            [sys.executable, "-m", "selftaught", "proxy", *args, "--project", "demo"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}/v1"
        answered: list[str] = []
        lock, stop = threading.Lock(), threading.Event()
        try:
            wait_healthy(proxy, url)
            clients = [
                threading.Thread(target=_load, args=(url, stop, answered, lock, n))
                for n in range(16)
            ]
            for t in clients:
                t.start()
            while len(answered) < 150:
                time.sleep(0.01)
            proxy.send_signal(signal.SIGKILL)  # mid-load: requests in every stage
            proxy.wait(timeout=30)
        finally:
            stop.set()
            proxy.kill()
            for t in clients:
                t.join(timeout=30)
    log = TaskLog(log_at)
    logged = {r.id for r in log.query(LogFilter(project="demo"))}
    missing = [i for i in answered if i not in logged]
    assert len(answered) >= 150
    assert not missing, f"{len(missing)} of {len(answered)} answered requests are not in the log"
