"""The proxy relays only what it should (issue #30, items 3 and 4), each attack reproduced:

- routes the proxy does not log (vLLM's LoRA loading, file deletion, metrics) never reach the
  upstream, however the path is spelled (dots, escapes, double slashes);
- the operator's upstream key goes only with the requests the proxy logs; a client's
  `openai-organization` / `openai-project` headers are dropped unless the operator asks;
- every row records which client sent it (a key id, a label, `anonymous`), never the key;
- feedback: a full id only (no prefix oracle), this project's rows only, bodies and
  comments capped, a rate limit per client, stored as the client's (untrusted) unless it
  carries the operator's feedback key; probation counts only trusted feedback, so one
  client's thumbs cannot roll a good version back."""

from __future__ import annotations

import http.client
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import loopback

pytest.importorskip("fastapi")

from selftaught.sleep.adoption import staging  # noqa: E402
from selftaught.sleep.intake.log import Feedback, Interaction, LogFilter, TaskLog  # noqa: E402
from selftaught.sleep.intake.probation import Lineage, ProbationConfig, evaluate  # noqa: E402
from selftaught.sleep.intake.proxy import ID_HEADER, ProxyConfig, proxy_in_background  # noqa: E402
from selftaught.sleep.intake.proxy_access import key_id  # noqa: E402
from selftaught.sleep.replay_mark import MARK_TTL_S, NightMarks, mark, replay_key  # noqa: E402
from tests.fake_upstream import FakeUpstream  # noqa: E402
from tests.test_probation import PROJECT, ask, proxy_config, scripted_upstream, stage  # noqa: E402
from tests.test_sleep_proxy import wait_logged  # noqa: E402

OPERATOR_KEY = "sk-operator-" + "Q7" * 16


def config_for(upstream: FakeUpstream, tmp_path: Path, **kw: Any) -> ProxyConfig:
    return ProxyConfig(
        upstream=f"{upstream.base_url}#fake-model",
        project="demo",
        port=0,
        log_path=tmp_path / "log.db",
        home=tmp_path / "home",
        **kw,
    )


@pytest.fixture
def proxy(tmp_path):
    with FakeUpstream() as upstream:
        with proxy_in_background(config_for(upstream, tmp_path, api_key=OPERATOR_KEY)) as (
            url,
            app,
        ):
            yield {"url": url, "upstream": upstream, "app": app, "log": tmp_path / "log.db"}


def raw_request(url: str, method: str, path: str, body: bytes | None = None) -> int:
    """Send `path` byte for byte (httpx would normalise dots and escapes away)."""
    host = url.removeprefix("http://").split("/")[0]
    conn = http.client.HTTPConnection(host, timeout=20)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn.request(method, path, body=body, headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def chat(url: str, headers: dict[str, str] | None = None, text: str = "hi") -> httpx.Response:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
    return loopback.post(f"{url}/chat/completions", json=body, headers=headers or {}, timeout=20)


# ---- item 3: relay only the routes the proxy logs -------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/v1/unload_lora_adapter"),
        ("DELETE", "/v1/files/file-123"),
        ("POST", "/v1/fine_tuning/jobs"),
        ("GET", "/v1/files"),
        ("POST", "/v1/embeddings"),  # only with --forward-embeddings
    ],
)
def test_routes_the_proxy_does_not_log_never_reach_the_upstream(proxy, method, path):
    body = json.dumps({"lora_name": "evil", "lora_path": "/tmp/evil"}).encode()
    status = raw_request(proxy["url"], method, path, body if method == "POST" else None)
    assert status == 404
    assert proxy["upstream"].calls == []


@pytest.mark.parametrize(
    "path",
    [
        "/v1/%2E%2E/metrics",
        "/v1/../metrics",
        "/v1/models/../load_lora_adapter",
        "//v1/chat/completions",
        "/v1//chat/completions",
        "/v1/chat/completions/",
        "/v1/chat%2Fcompletions",
        "/v1/./chat/completions",
        "/V1/chat/completions",
    ],
)
def test_a_path_that_is_not_exactly_an_allowed_route_is_a_404(proxy, path):
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "x"}]})
    assert raw_request(proxy["url"], "POST", path, body.encode()) == 404
    assert raw_request(proxy["url"], "GET", path) == 404
    assert proxy["upstream"].calls == []


def test_the_operator_key_goes_only_with_logged_requests(tmp_path):
    with FakeUpstream() as upstream:
        config = config_for(upstream, tmp_path, api_key=OPERATOR_KEY, forward_embeddings=True)
        with proxy_in_background(config) as (url, _):
            assert chat(url).status_code == 200
            client_key = {"authorization": "Bearer sk-client-own-key-1"}
            loopback.post(f"{url}/embeddings", json={"input": "x"}, headers=client_key)
            loopback.get(f"{url}/models", headers=client_key)
    sent = {(c["method"], c["path"]): c["headers"] for c in upstream.calls}
    assert sent[("POST", "/v1/chat/completions")]["authorization"] == f"Bearer {OPERATOR_KEY}"
    assert ("POST", "/v1/embeddings") in sent  # the operator asked for it
    for route in (("POST", "/v1/embeddings"),):
        assert OPERATOR_KEY not in json.dumps(sent[route])
    # /v1/models with a pinned model and the operator's key is answered by the proxy
    assert ("GET", "/v1/models") not in sent


def test_the_models_route_answers_the_pinned_model_without_the_upstream(proxy):
    models = loopback.get(f"{proxy['url']}/models").json()
    assert [m["id"] for m in models["data"]] == ["fake-model"]
    assert proxy["upstream"].calls == []


def test_org_headers_are_dropped_unless_the_operator_forwards_them(proxy, tmp_path):
    org = {"openai-organization": "org-attacker", "openai-project": "proj-attacker"}
    assert chat(proxy["url"], org).status_code == 200
    sent = {k.lower(): v for k, v in proxy["upstream"].calls[-1]["headers"].items()}
    assert "openai-organization" not in sent and "openai-project" not in sent
    with FakeUpstream() as upstream:
        config = config_for(upstream, tmp_path / "b", forward_org_headers=True)
        with proxy_in_background(config) as (url, _):
            assert chat(url, org).status_code == 200
    sent = {k.lower(): v for k, v in upstream.calls[-1]["headers"].items()}
    assert sent["openai-organization"] == "org-attacker"


# ---- item 4: client identity ---------------------------------------------------------------


def test_every_row_records_its_client_and_never_its_key(tmp_path):
    with FakeUpstream() as upstream:
        with proxy_in_background(config_for(upstream, tmp_path)) as (url, _):
            a = chat(url, {"authorization": "Bearer sk-client-alpha-0001"}, "from a")
            b = chat(url, {"x-api-key": "sk-client-beta-0002"}, "from b")
            anon = chat(url, {}, "from nobody")
            wait_logged(url, 3)
    log = TaskLog(tmp_path / "log.db")
    assert log.get(a.headers[ID_HEADER]).client == key_id("sk-client-alpha-0001")
    assert log.get(b.headers[ID_HEADER]).client == key_id("sk-client-beta-0002")
    assert log.get(anon.headers[ID_HEADER]).client == "anonymous"
    assert key_id("x").startswith("key:") and len(key_id("x")) == 4 + 12
    db = b"".join(p.read_bytes() for p in tmp_path.glob("log.db*"))
    assert b"sk-client-alpha-0001" not in db and b"sk-client-beta-0002" not in db


def test_client_keys_toml_reads_with_tomli_on_python_310(tmp_path, monkeypatch):
    # Python 3.10 has no tomllib; `tomli` (a dependency there) is the same parser. Simulated
    # here: the version says 3.10, `import tomllib` fails, `tomli` is the stdlib module.
    import sys

    from selftaught.sleep.intake.proxy_access import read_client_keys

    tomllib = pytest.importorskip("tomllib")
    toml = tmp_path / "clients.toml"
    toml.write_text('carol = "carol-secret-key"\n')
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", tomllib)
    assert read_client_keys(toml) == {"carol-secret-key": "carol"}


def test_client_keys_file_labels_clients_and_refuses_others(tmp_path):
    keys = tmp_path / "clients.json"
    keys.write_text(json.dumps({"alice": "alice-secret-key", "bob": "bob-secret-key-2"}))
    toml = tmp_path / "clients.toml"
    toml.write_text('carol = "carol-secret-key"\n')
    with FakeUpstream() as upstream:
        with proxy_in_background(config_for(upstream, tmp_path, client_keys=keys)) as (url, _):
            alice = chat(url, {"authorization": "Bearer alice-secret-key"})
            bob = chat(url, {"x-api-key": "bob-secret-key-2"})
            assert chat(url, {"authorization": "Bearer wrong-key-123"}).status_code == 401
            assert chat(url, {}).status_code == 401
            assert loopback.get(url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
            wait_logged(url, 2, key="alice-secret-key")
        config = config_for(upstream, tmp_path / "t", client_keys=toml)
        with proxy_in_background(config) as (url, _):
            carol = chat(url, {"authorization": "Bearer carol-secret-key"})
            wait_logged(url, 1, key="carol-secret-key")
    log = TaskLog(tmp_path / "log.db")
    assert log.get(alice.headers[ID_HEADER]).client == "alice"
    assert log.get(bob.headers[ID_HEADER]).client == "bob"
    assert TaskLog(tmp_path / "t" / "log.db").get(carol.headers[ID_HEADER]).client == "carol"
    assert not any("secret-key" in json.dumps(c["headers"]) for c in upstream.calls)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"alice": "short"}, "8+ characters"),
        ({"bad label!": "long-enough-key"}, "client label"),
        ({"a": "same-key-123", "b": "same-key-123"}, "share one key"),
        ([], "must map labels"),
    ],
)
def test_a_bad_client_keys_file_is_a_clear_error(tmp_path, content, message):
    from selftaught.sleep.intake.proxy import ProxyError, create_proxy_app

    path = tmp_path / "keys.json"
    path.write_text(json.dumps(content))
    config = ProxyConfig(upstream="http://127.0.0.1:9/v1#m", log_path=tmp_path / "l.db",
                         client_keys=path)  # fmt: skip
    with pytest.raises(ProxyError, match=re.escape(message)):
        create_proxy_app(config)


# ---- item 4: feedback ----------------------------------------------------------------------


def feedback(url: str, body: Any, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return loopback.post(f"{url}/feedback", json=body, headers=headers, timeout=20)


def test_feedback_needs_the_full_id_of_a_row_of_this_project(tmp_path):
    other = Interaction(messages=[{"role": "user", "content": "x"}], reply="y", project="other")
    TaskLog(tmp_path / "log.db").add(other)
    with FakeUpstream() as upstream:
        with proxy_in_background(config_for(upstream, tmp_path)) as (url, _):
            iid = chat(url, {"authorization": "Bearer sk-client-alpha-0001"}).headers[ID_HEADER]
            wait_logged(url, 1)
            answers = {
                "prefix": feedback(url, {"id": iid[:8], "thumb": "down"}),
                "other project": feedback(url, {"id": other.id, "thumb": "down"}),
                "missing": feedback(url, {"id": "0" * 36, "thumb": "down"}),
            }
            messages = set()
            for why, answer in answers.items():
                assert answer.status_code == 404, why
                messages.add(answer.json()["error"]["message"].split("'")[0])
            assert len(messages) == 1  # one message whatever the reason: no oracle
            assert str(tmp_path) not in json.dumps([a.json() for a in answers.values()])
            ok = feedback(url, {"id": iid, "thumb": "down"}, key="sk-client-alpha-0001")
            assert ok.status_code == 200
    log = TaskLog(tmp_path / "log.db")
    assert log.get(other.id).feedback.empty()
    fb = log.get(iid).feedback
    assert fb.thumb == "down" and fb.giver == key_id("sk-client-alpha-0001") and not fb.trusted


def test_feedback_bodies_and_comments_are_capped(tmp_path):
    with FakeUpstream() as upstream:
        with proxy_in_background(config_for(upstream, tmp_path)) as (url, _):
            iid = chat(url).headers[ID_HEADER]
            wait_logged(url, 1)
            long_comment = feedback(url, {"id": iid, "comment": "x" * 4097})
            assert long_comment.status_code == 413
            assert "4096" in long_comment.json()["error"]["message"]
            huge = feedback(url, {"id": iid, "reference": "y" * 20_000})
            assert huge.status_code == 413
            assert feedback(url, {"id": iid, "comment": "x" * 4096}).status_code == 200
            bad = feedback(url, {"id": iid, "thumb": "up", "giver": "operator"})
            assert bad.status_code == 400
            assert feedback(url, {"id": iid, "trusted": True}).status_code == 400
    assert TaskLog(tmp_path / "log.db").get(iid).feedback.trusted is False


def test_feedback_is_rate_limited_per_client(tmp_path):
    with FakeUpstream() as upstream:
        config = config_for(upstream, tmp_path, feedback_per_minute=5)
        with proxy_in_background(config) as (url, _):
            iid = chat(url).headers[ID_HEADER]
            wait_logged(url, 1)
            a, b = "sk-client-alpha-0001", "sk-client-beta-0002"
            codes = [feedback(url, {"id": iid, "thumb": "down"}, a).status_code for _ in range(5)]
            assert codes == [200] * 5
            limited = feedback(url, {"id": iid, "thumb": "down"}, a)
            assert limited.status_code == 429
            assert 1 <= int(limited.headers["retry-after"]) <= 12
            assert feedback(url, {"id": iid, "thumb": "up"}, b).status_code == 200  # its own


def test_the_operator_feedback_key_gives_trusted_feedback(tmp_path):
    with FakeUpstream() as upstream:
        config = config_for(upstream, tmp_path, feedback_key="operator-feedback-key-1",
                            require_key="client-key-0001", feedback_per_minute=1)  # fmt: skip
        with proxy_in_background(config) as (url, _):
            iid = chat(url, {"authorization": "Bearer client-key-0001"}).headers[ID_HEADER]
            wait_logged(url, 1, key="client-key-0001")
            user = feedback(url, {"id": iid, "thumb": "up"}, "client-key-0001")
            assert user.status_code == 200
            assert feedback(url, {"id": iid, "thumb": "up"}, "client-key-0001").status_code == 429
            for _ in range(3):  # the operator is not rate limited
                op = feedback(url, {"id": iid, "thumb": "down"}, "operator-feedback-key-1")
                assert op.status_code == 200
            assert feedback(url, {"id": iid, "thumb": "down"}, "nobody-key-1").status_code == 401
            # the feedback key is not a client key: it cannot use the model
            assert chat(url, {"authorization": "Bearer operator-feedback-key-1"}).status_code == 401
    fb = TaskLog(tmp_path / "log.db").get(iid).feedback
    assert (fb.thumb, fb.giver, fb.trusted) == ("down", "operator", True)


def test_health_says_only_ok_without_a_key_and_more_with_one(tmp_path):
    with FakeUpstream() as upstream:
        config = config_for(upstream, tmp_path, require_key="client-key-0001",
                            auto_rollback=True)  # fmt: skip
        with proxy_in_background(config) as (url, _):
            root = url.removesuffix("/v1")
            assert loopback.get(f"{root}/health").json() == {"status": "ok"}
            full = loopback.get(f"{root}/health", headers={"x-api-key": "client-key-0001"}).json()
            assert full["status"] == "ok" and full["probation"]["auto_rollback"] is True


# ---- probation counts trusted feedback only ------------------------------------------------


def test_one_clients_thumbs_cannot_roll_back_a_good_version(tmp_path):
    """v1 answers wrong, v2 right; one end user thumbs up every wrong answer and down every
    right one. Counted, that would roll v2 back after 10 of its answers."""
    home = tmp_path / "home"
    stage(home, "n1", "BAD")
    staging.adopt(PROJECT, "n1", home=home)
    stage(home, "n2", "GOOD")
    config = proxy_config(tmp_path, auto_rollback=True, probation=ProbationConfig(10))
    with proxy_in_background(config, upstream=scripted_upstream()) as (url, app), \
            httpx.Client(timeout=30) as client:  # fmt: skip
        watch = app.state.proxy.watch

        def lie(iid: str, reply: str, i: int) -> None:
            right = reply == f"The answer is {2 * i + 1}."
            body = {"id": iid, "thumb": "down" if right else "up"}
            client.post(f"{url}/feedback", json=body, headers={"x-api-key": "attacker-1"})

        for i in range(12):
            lie(*ask(client, url, i), i)
        staging.adopt(PROJECT, "n2", home=home, force=True)
        for i in range(12, 30):
            lie(*ask(client, url, i), i)
            assert watch.wait_idle(30)
        assert staging.current_version(PROJECT, home) == 2  # not rolled back
        health = client.get(url.removesuffix("/v1") + "/health").json()
    assert health["probation"]["rollbacks"] == []
    assert not [e for e in staging.events(PROJECT, home) if e["event"] == "auto_rollback"]


def test_probation_counts_untrusted_feedback_only_when_asked():
    def rows(version: str, thumb: str, trusted: bool) -> list[Interaction]:
        fb = Feedback(thumb=thumb, giver="operator" if trusted else "key:abc", trusted=trusted)
        return [
            Interaction(
                messages=[{"role": "user", "content": "q"}],
                reply="a",
                project="p",
                source="proxy",
                skill_version=version,
                feedback=fb,
            )  # fmt: skip
            for _ in range(12)
        ]

    lineage = Lineage("2", "1")
    lying = rows("1", "up", False) + rows("2", "down", False)
    counted = evaluate(lying, lineage, ProbationConfig(10, untrusted=True), "p")
    assert counted.drop
    ignored = evaluate(lying, lineage, ProbationConfig(10), "p")
    assert not ignored.drop and ignored.adopted.verdict == "too_few"
    honest = rows("1", "up", True) + rows("2", "down", True)
    assert evaluate(honest, lineage, ProbationConfig(10), "p").drop


def test_the_cli_refuses_a_bad_keys_file_or_rate_in_one_sentence(tmp_path):
    from typer.testing import CliRunner

    from selftaught import cli

    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"alice": "short"}))
    base = ["proxy", "--upstream", "http://127.0.0.1:9", "--log", str(tmp_path / "l.db")]
    runner = CliRunner()
    for extra, message in (
        (["--client-keys", str(keys)], "must be a string of 8+ characters"),
        (["--client-keys", str(tmp_path / "none.json")], "cannot read the client keys file"),
        (["--feedback-per-minute", "0"], "feedback_per_minute must be > 0"),
    ):
        result = runner.invoke(cli.app, [*base, *extra])
        assert result.exit_code == 2 and message in result.output, result.output
        assert "Traceback" not in result.output


# ---- issue 63: the night's mark is good once, for its route, project and a short time ------


def test_replay_mark_is_bound_to_route_project_and_time(tmp_path, log_at):
    """A mark relayed a body unlogged as often as it was sent, on any route and by the proxy
    of any project sharing the home. Now: once, on its route, for its project, until it
    expires; every other use is traffic (logged, the skill injected)."""
    home = tmp_path / "home"
    raw = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
    chat = "/v1/chat/completions"
    with FakeUpstream() as upstream:

        def config(project: str) -> ProxyConfig:
            return ProxyConfig(upstream=f"{upstream.base_url}#fake-model", project=project,
                               port=0, log_path=log_at, home=home)  # fmt: skip

        with proxy_in_background(config("demo")) as (demo, _):
            with proxy_in_background(config("other")) as (other, _):
                key = replay_key(home)
                night = NightMarks(key, "demo")  # what a night for project demo signs with

                def send(url: str, mark_headers: dict[str, str]) -> None:
                    headers = {"content-type": "application/json", **mark_headers}
                    answer = loopback.post(f"{url}/chat/completions", content=raw,
                                        headers=headers, timeout=30)  # fmt: skip
                    assert answer.status_code == 200, answer.text

                first = night(chat, raw.encode())
                send(demo, first)  # the night's own: relayed, never logged
                send(demo, first)  # the same mark again
                send(other, night(chat, raw.encode()))  # at another project's proxy
                send(demo, night("/v1/messages", raw.encode()))  # made for another route
                late = time.time() - MARK_TTL_S - 1
                send(demo, mark(key, chat, "demo", raw.encode(), now=late))  # expired
                far = time.time() + 3600
                send(demo, mark(key, chat, "demo", raw.encode(), now=far))  # made to outlive use
                send(demo, night(chat, raw.encode()))  # a fresh mark: the night's own again
                demo_health, other_health = wait_logged(demo, 4), wait_logged(other, 1)
    assert demo_health["night_replays"] == 2 and other_health["night_replays"] == 0
    with TaskLog(log_at) as log:
        assert log.count(LogFilter(project="demo")) == 4
        assert log.count(LogFilter(project="other")) == 1
