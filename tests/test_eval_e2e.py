"""End to end, as the README says: `selftaught eval` on the embedded model, in process and
through `selftaught serve` over HTTP. Greedy decoding must give the same replies both ways."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from typer.testing import CliRunner

from selftaught.cli import app

pytestmark = pytest.mark.local
ARGS = ["--task", "gym:basic_arithmetic", "--limit", "4", "--max-tokens", "24"]


def _eval(model: str, out) -> tuple[str, list[dict]]:
    result = CliRunner().invoke(app, ["eval", *ARGS, "--model", model, "--output", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return result.output, rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_eval_local_prints_score_and_writes_jsonl(tmp_path):
    output, rows = _eval("local", tmp_path / "local.jsonl")
    assert re.search(r"hard accuracy\s+│\s+[01]\.\d{3}\s+\(95% CI", output)
    assert len(rows) == 4 and all(r["error"] is None for r in rows)
    assert all(r["messages"][-1]["role"] == "user" for r in rows)
    summary = json.loads((tmp_path / "local.summary.json").read_text())
    assert summary["n"] == 4 and summary["usage"]["target"]["calls"] == 4
    assert summary["hard"] == sum(r["score"]["hard"] for r in rows) / 4


@pytest.mark.slow
def test_eval_through_selftaught_serve_matches_in_process(tmp_path):
    _, local_rows = _eval("local", tmp_path / "local.jsonl")
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "selftaught", "serve", "--model", "local", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "selftaught serve did not come up"
                time.sleep(0.5)
        spec = f"http://127.0.0.1:{port}/v1#SmolLM2-135M-Instruct"
        _, http_rows = _eval(spec, tmp_path / "http.jsonl")
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert [r["reply"] for r in http_rows] == [r["reply"] for r in local_rows]
    assert [r["score"] for r in http_rows] == [r["score"] for r in local_rows]
