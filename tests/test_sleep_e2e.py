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
from selftaught.sleep.intake.log import TaskLog
from selftaught.sleep.paths import adopted_dir
from tests import loopback

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
            if loopback.get(url + "/health", timeout=2).status_code == 200:
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
            health = loopback.get(f"http://127.0.0.1:{proxy_port}/health").json()
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
    from selftaught.sleep.intake.proxy import ProxyConfig, proxy_in_background

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


@pytest.mark.slow  # the embedded model answers ~30 requests: about a minute on 2 busy cores
def test_a_night_through_the_proxy_adopt_and_rollback(tmp_path, monkeypatch, embedded_available):
    """Part 2's done-when scenario: the embedded model behind the proxy, requests with
    feedback, `sleep run`, the staged report, `sleep adopt`, the next request carries the
    skill, `sleep rollback` removes it. The analyst is a deterministic loopback server (the
    135M model rarely writes valid edits) and the gate is off, so a proposal is certain; the
    replays are the embedded model's own."""
    from selftaught.sleep.intake.proxy import ProxyConfig, proxy_in_background
    from tests.fake_upstream import FakeUpstream

    home, log_path = tmp_path / "home", tmp_path / "log.db"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    monkeypatch.setenv("SELFTAUGHT_LOG", str(log_path))
    monkeypatch.setattr(cli.out, "width", 250)
    rule = "Reply with only the final number."
    edit = json.dumps({"edits": [{"op": "append", "content": rule, "rationale": "terse"}]})
    config = ProxyConfig(upstream="local", port=0, project="demo", log_path=log_path, home=home)
    runner = CliRunner()
    with FakeUpstream(lambda _: edit) as analyst, proxy_in_background(config) as (url, app):
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)

        def ask(a: int, b: int) -> str:
            raw = client.chat.completions.with_raw_response.create(
                model="m",
                messages=[{"role": "user", "content": f"What is {a} + {b}?"}],
                max_tokens=16,
                temperature=0,
            )
            return raw.headers["x-selftaught-interaction-id"]

        ids = [ask(a, a + 3) for a in range(1, 9)]
        assert app.state.proxy.writer.flush(30)
        for a, iid in zip(range(1, 9), ids, strict=True):
            loopback.post(
                f"{url}/feedback", json={"id": iid, "thumb": "down", "reference": str(2 * a + 3)}
            )
        night = runner.invoke(
            cli.app,
            [
                "sleep",
                "run",
                "--optimizer-model",
                f"{analyst.base_url}#fake-model",
                "--gate",
                "off",
                "--documents",
                "skill",
                "--max-tokens",
                "16",
                "--concurrency",
                "4",
            ],
        )
        assert night.exit_code == 0, night.output
        text = " ".join(night.output.split())
        assert "demo: staged" in text and "gate off" in text
        report_md = Path(text.split("report: ")[1].split()[0])
        assert "**OFF**" in report_md.read_text() and f"+{rule}" in report_md.read_text()
        report = json.loads((report_md.parent / "report.json").read_text())
        assert report["models"]["target"] == "local"  # the upstream the proxy logged
        assert report["mining"]["tasks"] == 8 and report["usage"]["target"]["calls"] > 0

        adopted = runner.invoke(cli.app, ["sleep", "adopt", "--project", "demo"])
        assert adopted.exit_code == 0 and "as version 1" in adopted.output
        with_skill = ask(20, 22)
        rolled = runner.invoke(cli.app, ["sleep", "rollback", "--project", "demo"])
        assert rolled.exit_code == 0 and "version 0 is adopted again" in rolled.output
        without = ask(20, 22)
        assert app.state.proxy.writer.flush(30)
        assert loopback.get(url.removesuffix("/v1") + "/health").json()["adopted_version"] == "0"
    log = TaskLog(log_path)
    assert log.get(with_skill).skill_version == "1"  # the next request carried the new skill
    assert log.get(without).skill_version is None  # and after the rollback it is gone


@pytest.mark.slow  # the embedded model replays ~60 short val / train requests
def test_a_night_on_the_embedded_model_learns_from_corrections_mechanics(
    tmp_path, embedded_available
):
    """A log of replies the user corrected; a night with the embedded model as target: the
    corrections become the demo pool (source correction, train only), the report lists the
    none / static / retrieved demo modes with their val and 95% intervals, and states the
    smallest gain its gate could accept. The mechanics, not a gain."""
    pytest.importorskip("bm25s")
    from selftaught.models import load_model
    from selftaught.skill.config import SkillOptConfig
    from selftaught.sleep.intake.log import Feedback, Interaction
    from selftaught.sleep.night.cycle import NightConfig, NightModels, run_night
    from selftaught.sleep.night.demo_modes import DemoModeConfig
    from tests.scripted import canned_analyst

    log = TaskLog(tmp_path / "log.db")
    for i in range(12):
        a, b = 2 * i + 1, 3 * i + 20
        log.add(
            Interaction(
                messages=[{"role": "user", "content": f"What is {a} + {b}?"}],
                reply="I think it is 7.",
                project="demo",
                source="proxy",
                feedback=Feedback(thumb="down", reference=str(a + b)),
            )
        )
    log.close()
    target = load_model("local")
    models = NightModels(target, "local", canned_analyst(), "local")
    config = NightConfig(
        home=tmp_path,
        log_path=tmp_path / "log.db",
        documents=("skill",),
        training=SkillOptConfig(epochs=1, batch_size=8, max_tokens=16, concurrency=4),
        demo_modes=DemoModeConfig("on", 2),
    )
    (night,) = run_night(config, models=models)
    assert night.status in ("staged", "no_proposal"), night.reason
    modes = night.phases["skill"].demo_modes
    assert set(modes.candidates) >= {"none", "static", "retrieved"}
    assert modes.sources == {"correction": night.splits.train}
    assert modes.leaks_refused == 0 and modes.winner in modes.candidates
    for c in modes.candidates.values():
        assert c.score.n == night.splits.val and len(c.to_dict()["hard_ci"]) == 2
    smallest = night.gate.smallest_gain
    assert smallest.n_val == night.splits.val and smallest.items == 3
    md = (night.night_dir / "report.md").read_text()
    assert "## Demonstrations" in md and "| retrieved |" in md and "Winner: **" in md
    assert "smallest gain the gate could accept: 3 net val items" in md


@pytest.mark.slow  # the embedded model replays ~20 short train requests
def test_a_no_val_night_on_the_embedded_model(tmp_path, embedded_available):
    """`sleep run --no-val` with the embedded model as target and analyst: every corrected
    request trains, none validates, the gate is off, the report says so at its top, and the
    version adopted from it is on probation with auto-rollback."""
    from selftaught.sleep.adoption import staging
    from selftaught.sleep.intake.log import Feedback, Interaction
    from selftaught.sleep.intake.probation import auto_rollback_on
    from selftaught.sleep.night.summary import NO_VAL_BANNER

    log = TaskLog(tmp_path / "log.db")
    for i in range(6):
        a, b = 2 * i + 1, 3 * i + 20
        log.add(Interaction(messages=[{"role": "user", "content": f"What is {a} + {b}?"}],
                            reply="I think it is 7.", project="demo", source="proxy",
                            feedback=Feedback(thumb="down", reference=str(a + b))))  # fmt: skip
    log.close()
    args = ["sleep", "run", "--project", "demo", "--log", str(tmp_path / "log.db"),
            "--model", "local", "--no-val", "--documents", "skill", "--epochs", "1",
            "--batch-size", "6", "--max-tokens", "16", "--demos-max", "2"]  # fmt: skip
    env = {"SELFTAUGHT_HOME": str(tmp_path / "home")}
    result = CliRunner().invoke(cli.app, args, env=env)
    assert result.exit_code == 0, result.output
    (night_dir,) = (tmp_path / "home" / "projects" / "demo" / "nights").iterdir()
    report = json.loads((night_dir / "report.json").read_text())
    assert report["splits"] == {"train": 6, "val": 0, "test": 0}
    assert report["gate"]["mode"] == "off" and report["gate"]["no_val"] is True
    assert (night_dir / "report.md").read_text().split("\n")[2] == NO_VAL_BANNER
    assert report["status"] == "staged", report["reason"]  # the corrections are demos
    done = staging.adopt("demo", home=tmp_path / "home")
    assert auto_rollback_on("demo", done.version, tmp_path / "home")
