"""`selftaught proxy` against a fake OpenAI server on loopback, driven by the official openai
client: forwarding (plain and streamed), skill injection picked up without a restart, logging
(redacted, without the injected skill), errors passed through, feedback, keys, hosts, a
logging failure that never reaches the client, 200 concurrent requests, kill -9 mid-stream.
Tests on the `env` fixture run on both log backends (SQLite, Postgres: tests/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests import loopback

pytest.importorskip("fastapi")

from selftaught.runs import atomic_write_text  # noqa: E402
from selftaught.sleep.adoption.inject import inject_adopted, strip_injected, strip_injected_messages  # noqa: E402
from selftaught.sleep.intake.log import LogFilter, TaskLog  # noqa: E402
from selftaught.sleep.intake.proxy import ID_HEADER, ProxyConfig, ProxyError, proxy_in_background  # noqa: E402
from selftaught.sleep.paths import Adopted, adopted_dir, read_adopted  # noqa: E402
from tests.fake_upstream import FakeUpstream, fake_proxy  # noqa: E402

SRC = str(Path(__file__).resolve().parents[1] / "src")


def adopt(home: Path, project: str, skill: str, memory: str, version: str) -> None:
    """What part 2's `adopt` does: each file replaced atomically, `version` last (with a
    Postgres log: the version's row, then the pointer)."""
    from selftaught.sleep.paths import shared_url
    from selftaught.sleep.store import versions

    if (db := versions.store(shared_url())) is not None:
        db.write_version(project, Adopted(skill, memory, version), {}, None)
        db.point(project, int(version))
        return
    folder = adopted_dir(project, home)
    atomic_write_text(folder / "skill.md", skill)
    atomic_write_text(folder / "memory.md", memory)
    atomic_write_text(folder / "version", version + "\n")


def wait_logged(base_url: str, n: int, timeout_s: float = 30.0, key: str | None = None) -> dict:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + timeout_s
    while True:
        stats = loopback.get(base_url.removesuffix("/v1") + "/health", headers=headers).json()
        log = stats["log"]
        if log["logged"] + log["failures"] + log["dropped"] >= n or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


@pytest.fixture
def env(tmp_path, log_at):
    with fake_proxy(tmp_path / "home", log_at) as (url, app, upstream):
        client = openai.OpenAI(base_url=url, api_key="client-key", max_retries=0, timeout=20)
        yield {
            "url": url,
            "client": client,
            "upstream": upstream,
            "log": TaskLog(log_at),
            "home": tmp_path / "home",
            "app": app,
        }


def test_plain_request_is_forwarded_untouched_and_logged(env):
    client, upstream = env["client"], env["upstream"]
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model",
        messages=[{"role": "user", "content": "hello there"}],
        temperature=0.3,
        max_tokens=11,
        extra_body={"custom_field": {"kept": True}},
    )
    reply = raw.parse()
    assert reply.choices[0].message.content == "echo: hello there"
    iid = raw.headers[ID_HEADER]
    sent = upstream.requests[-1]
    assert sent["messages"] == [{"role": "user", "content": "hello there"}]  # nothing adopted
    assert sent["temperature"] == 0.3 and sent["max_tokens"] == 11
    assert sent["custom_field"] == {"kept": True}
    assert upstream.headers[-1]["authorization"] == "Bearer client-key"  # no key of our own
    wait_logged(env["url"], 1)
    row = env["log"].get(iid)
    assert row.source == "proxy" and row.project == "demo" and row.is_task
    assert row.messages == [{"role": "user", "content": "hello there"}]
    assert row.reply == "echo: hello there" and row.skill_version is None
    assert (row.prompt_tokens, row.completion_tokens) == (7, 3)
    assert row.meta["request"]["temperature"] == 0.3 and row.latency_s > 0


def test_the_client_bytes_go_upstream_unchanged_when_nothing_is_injected(env, tmp_path):
    raw = b'{ "model" :"fake-model",  "messages": [{"role":"user","content":"caf\\u00e9"}] }'
    json_type = {"content-type": "application/json"}
    response = loopback.post(env["url"] + "/chat/completions", content=raw, headers=json_type)
    assert response.status_code == 200 and env["upstream"].raw[-1] == raw
    adopt(env["home"], "demo", "Be kind.", "", "1")
    loopback.post(env["url"] + "/chat/completions", content=raw, headers=json_type)
    sent = env["upstream"].requests[-1]
    assert sent["messages"][0]["role"] == "system" and sent["messages"][1]["content"] == "café"


def test_streaming_passes_through_and_is_accumulated_for_the_log(env):
    client = env["client"]
    with client.chat.completions.with_streaming_response.create(
        model="fake-model",
        messages=[{"role": "user", "content": "stream me please"}],
        stream=True,
        stream_options={"include_usage": True},
    ) as raw:
        iid = raw.headers[ID_HEADER]
        chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: stream me please"
    assert chunks[-1].usage.completion_tokens == 4
    wait_logged(env["url"], 1)
    row = env["log"].get(iid)
    assert row.reply == text and row.meta["stream"] is True and row.completion_tokens == 4
    assert row.meta["finish_reason"] == "stop" and row.is_task


def test_adopted_skill_is_injected_marked_and_picked_up_without_restart(env):
    client, upstream, home = env["client"], env["upstream"], env["home"]
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
    client.chat.completions.create(model="fake-model", messages=msgs)
    assert upstream.requests[-1]["messages"] == msgs
    adopt(home, "demo", "Always answer in French.", "The user is called Ada.", "1")
    first = client.chat.completions.with_raw_response.create(model="fake-model", messages=msgs)
    system = upstream.requests[-1]["messages"][0]["content"]
    assert system.startswith("<!-- selftaught:skill version=1 -->\nAlways answer in French.")
    assert "<!-- selftaught:memory version=1 -->\nThe user is called Ada." in system
    assert system.endswith("You are terse.") and strip_injected(system) == "You are terse."
    adopt(home, "demo", "Always answer in German.", "", "2")
    client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "no system here"}]
    )
    sent = upstream.requests[-1]["messages"]
    assert (
        sent[0]["role"] == "system"
        and "version=2 -->\nAlways answer in German." in sent[0]["content"]
    )
    assert "memory" not in sent[0]["content"]
    wait_logged(env["url"], 3)
    row = env["log"].get(first.headers[ID_HEADER])
    assert row.messages == msgs and row.skill_version == "1"  # logged without the skill


def test_adopted_demos_go_upstream_as_turns_and_the_log_keeps_the_client_messages(env):
    from selftaught.demos import Demo, join_skill

    client, upstream, home = env["client"], env["upstream"], env["home"]
    demos = [
        Demo("d1", "What is the capital of France?", "Paris", "correction"),
        Demo("d2", "How many legs has a spider?", "Eight", "correction"),
    ]
    adopt(home, "demo", join_skill("Answer in one word.", demos, "turns"), "", "4")
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
    sent = client.chat.completions.with_raw_response.create(model="fake-model", messages=msgs)
    got = upstream.requests[-1]["messages"]
    assert got[0]["content"].startswith("<!-- selftaught:skill version=4 turns=4 -->")
    assert "Answer in one word." in got[0]["content"] and '{"id"' not in got[0]["content"]
    assert got[1:5] == [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "How many legs has a spider?"},
        {"role": "assistant", "content": "Eight"},
    ]
    assert got[5:] == msgs[1:] and strip_injected_messages(got) == msgs
    wait_logged(env["url"], 1)
    row = env["log"].get(sent.headers[ID_HEADER])
    assert row.messages == msgs and row.skill_version == "4"  # logged as the client sent it


def test_upstream_errors_pass_through_and_are_logged_as_errors(env):
    client, upstream = env["client"], env["upstream"]
    upstream.faults.extend(["429", "500"])
    with pytest.raises(openai.RateLimitError, match="injected 429") as info:
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "x"}]
        )
    iid = info.value.response.headers[ID_HEADER]
    with pytest.raises(openai.InternalServerError, match="injected 500"):
        client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "y"}], stream=True
        )
    stats = wait_logged(env["url"], 2)
    assert stats["upstream_errors"] == 2
    row = env["log"].get(iid)
    assert not row.is_task and row.error_status == 429 and "injected 429" in row.error
    assert row.reply is None
    assert len(env["log"].query(LogFilter(errors=False))) == 0


def test_a_stream_the_upstream_breaks_is_logged_as_an_error(env):
    env["upstream"].faults.append("broken")
    chunks = list(
        env["client"].chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "a b c d"}], stream=True
        )
    )  # the client sees the stream stop early (the bytes are relayed as they came)
    assert all(c.choices[0].finish_reason is None for c in chunks)
    wait_logged(env["url"], 1)
    (row,) = env["log"].query()
    assert not row.is_task and "without a finish" in row.error and row.reply == "echo: "


def test_unreachable_upstream_is_a_502_never_an_invented_reply(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    config = ProxyConfig(
        upstream=f"http://127.0.0.1:{dead_port}/v1#m", port=0, log_path=tmp_path / "log.db"
    )
    with proxy_in_background(config) as (url, _):
        response = loopback.post(
            f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert response.status_code == 502
        assert "unreachable" in response.json()["error"]["message"]
        assert response.json().get("choices") is None
        wait_logged(url, 1)
    (row,) = TaskLog(tmp_path / "log.db").query()
    assert row.error_status == 502 and row.reply is None


def test_models_route_and_other_routes_pass_through(env):
    assert [m.id for m in env["client"].models.list().data] == ["fake-model"]
    assert loopback.get(env["url"] + "/nothing").status_code == 404


def test_secrets_are_redacted_in_the_log_but_forwarded_untouched(env):
    key = "sk-proj-" + "Zz9" * 20
    raw = env["client"].chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": f"my key is {key}"}]
    )
    assert env["upstream"].requests[-1]["messages"][0]["content"].endswith(key)
    wait_logged(env["url"], 1)
    row = env["log"].get(raw.headers[ID_HEADER])
    assert key not in json.dumps(row.to_dict()) and row.redactions == 2  # message and reply


def test_feedback_endpoint(env):
    raw = env["client"].chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "2+2?"}]
    )
    iid = raw.headers[ID_HEADER]
    post = lambda body: loopback.post(env["url"] + "/feedback", json=body)  # noqa: E731
    assert post({"id": iid[:8], "thumb": "down"}).status_code == 404  # the full id only
    ok = post({"id": iid, "thumb": "down", "reference": "4", "comment": "wrong"})
    assert ok.status_code == 200 and ok.json() == {"id": iid, "status": "ok"}
    fb = env["log"].get(iid).feedback
    assert (fb.thumb, fb.reference, fb.comment) == ("down", "4", "wrong")
    assert post({"id": "nope-nope-nope", "thumb": "up"}).status_code == 404
    assert post({"id": iid, "thumb": "sideways"}).status_code == 400
    assert post({"id": iid}).status_code == 400
    assert post({"thumb": "up"}).status_code == 400


def test_require_key(tmp_path):
    with FakeUpstream() as upstream:
        config = ProxyConfig(
            upstream=f"{upstream.base_url}#fake-model",
            port=0,
            log_path=tmp_path / "log.db",
            require_key="proxy-secret",
            api_key="upstream-secret",
        )
        with proxy_in_background(config) as (url, _):
            wrong = openai.OpenAI(base_url=url, api_key="guess", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                wrong.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": "x"}]
                )
            right = openai.OpenAI(base_url=url, api_key="proxy-secret", max_retries=0)
            right.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "x"}]
            )
            assert (
                loopback.post(url + "/feedback", json={"id": "x", "thumb": "up"}).status_code == 401
            )
            assert loopback.get(url + "/selftaught/stats").status_code == 401
        # the proxy's own key goes upstream, never the client's
        assert [h["authorization"] for h in upstream.headers] == ["Bearer upstream-secret"]
        config.api_key, config.log_path = None, tmp_path / "log2.db"
        with proxy_in_background(config) as (url, _):
            right = openai.OpenAI(base_url=url, api_key="proxy-secret", max_retries=0)
            right.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "x"}]
            )
        assert "authorization" not in upstream.headers[-1]  # the proxy key never leaves


def test_remote_hosts_need_allow_remote_and_bad_configs(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="refusing to bind 0.0.0.0"):
        with proxy_in_background(ProxyConfig(upstream="http://x/v1#m", host="0.0.0.0")):
            pass
    with pytest.raises(ProxyError, match="invalid project name"):
        ProxyConfig(upstream="http://x/v1#m", project="a/b")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ProxyError, match="needs an API key"):
        with proxy_in_background(
            ProxyConfig(upstream="openai:gpt-4o-mini", log_path=tmp_path / "l.db")
        ):
            pass


def test_a_logging_failure_never_reaches_the_client(env, monkeypatch):
    state = env["app"].state.proxy

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(state.log, "add_many", broken)
    monkeypatch.setattr(state.log, "add", broken)
    for i in range(3):
        reply = env["client"].chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": f"q{i}"}]
        )
        assert reply.choices[0].message.content == f"echo: q{i}"
    stats = wait_logged(env["url"], 3)
    assert stats["log"]["failures"] == 3 and stats["log"]["logged"] == 0


def test_inject_helpers_keep_the_client_messages_intact():
    adopted = Adopted("skill text", "", "7")
    parts = [{"role": "developer", "content": [{"type": "text", "text": "dev rules"}]}]
    out = inject_adopted(parts, adopted)
    assert out[0]["content"][0]["text"].startswith("<!-- selftaught:skill version=7 -->")
    assert out[0]["content"][1] == {"type": "text", "text": "dev rules"}
    assert parts[0]["content"] == [{"type": "text", "text": "dev rules"}]  # not mutated
    assert inject_adopted(parts, Adopted()) is parts
    injected = inject_adopted([{"role": "user", "content": "q"}], adopted)
    assert strip_injected_messages(injected) == [{"role": "user", "content": "q"}]


def test_read_adopted_sees_each_new_version(tmp_path, log_at):
    assert read_adopted("p", tmp_path) == Adopted()
    for v in range(1, 4):
        adopt(tmp_path, "p", f"skill {v}", f"memory {v}", str(v))
        assert read_adopted("p", tmp_path) == Adopted(f"skill {v}", f"memory {v}", str(v))


def test_two_hundred_concurrent_requests_all_answered_and_logged_once(env):
    async def main() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=env["url"], api_key="k", max_retries=0, timeout=60
        ) as client:

            async def one(i: int) -> str:
                kwargs = {"model": "fake-model", "messages": [{"role": "user", "content": f"n{i}"}]}
                if i % 2:
                    stream = await client.chat.completions.create(**kwargs, stream=True)
                    return "".join([c.choices[0].delta.content or "" async for c in stream])
                reply = await client.chat.completions.create(**kwargs)
                return reply.choices[0].message.content

            return await asyncio.gather(*(one(i) for i in range(200)))

    replies = asyncio.run(main())
    assert replies == [f"echo: n{i}" for i in range(200)]
    stats = wait_logged(env["url"], 200)
    assert stats["log"]["logged"] == 200 and stats["log"]["failures"] == 0
    rows = env["log"].query()
    assert len(rows) == 200 and len({r.id for r in rows}) == 200
    assert sorted(r.messages[0]["content"] for r in rows) == sorted(f"n{i}" for i in range(200))
    assert all(r.reply == "echo: " + r.messages[0]["content"] for r in rows)


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 60) -> None:
    """Until the proxy process at `url` (…/v1) answers /health; fails if it exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if loopback.get(url.removesuffix("/v1") + "/health").status_code == 200:
                return
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.1)


def test_kill_minus_nine_mid_stream_leaves_a_clean_log(tmp_path, log_at):
    log_path = log_at
    with FakeUpstream(lambda m: " ".join(["word"] * 400), chunk_delay_s=0.01) as upstream:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        args = ["--upstream", f"{upstream.base_url}#fake-model", "--port", str(port)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "selftaught", "proxy", *args, "--log", str(log_path)],
            env={**os.environ, "PYTHONPATH": SRC, "SELFTAUGHT_HOME": str(tmp_path / "home")},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}/v1"
        try:
            wait_healthy(proc, url)
            client = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=30)
            upstream.answer = lambda m: "short answer"
            for i in range(5):
                client.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": f"before {i}"}]
                )
            wait_logged(url, 5)
            upstream.answer = lambda m: " ".join(["word"] * 400)
            stream = client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "long"}], stream=True
            )
            for received, _chunk in enumerate(stream, 1):
                if received == 20:
                    os.kill(proc.pid, signal.SIGKILL)
                    break
        finally:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    log = TaskLog(log_path)
    assert log.integrity_check() == "ok"
    assert sorted(r.messages[0]["content"] for r in log.query()) == [
        f"before {i}" for i in range(5)
    ]
