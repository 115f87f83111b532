"""What `selftaught serve` and `selftaught proxy` accept, seen from a web page's side: foreign
`Host` and `Origin`, cross-origin "simple requests" (text/plain POSTs), oversized bodies, bad
JSON of every shape; and the proxy's key, `/health` and URLs without their passwords. Each
case runs against both servers, real uvicorn on loopback."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests import loopback

pytest.importorskip("fastapi")

from selftaught.http_guard import (  # noqa: E402
    MAX_JSON_DEPTH,
    bearer_token,
    is_loopback_name,
    loopback_host,
    strip_credentials,
)
from selftaught.serve import serve_in_background  # noqa: E402
from selftaught.sleep.intake.log import TaskLog  # noqa: E402
from selftaught.sleep.intake.proxy import ProxyConfig, proxy_in_background  # noqa: E402
from tests.fake_upstream import FakeUpstream  # noqa: E402
from tests.test_serve import EchoModel  # noqa: E402

LIMIT = 64 * 1024
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
BODY = json.dumps(CHAT)
JSON = {"content-type": "application/json"}


class Server:
    """One running server and a way to count what reached the model behind it."""

    def __init__(self, kind: str, url: str, calls: Any) -> None:
        self.kind = kind
        self.url = url  # http://127.0.0.1:PORT/v1
        self.port = int(url.rsplit(":", 1)[1].split("/")[0])
        self.calls = calls

    def post(self, body: bytes | str, headers: dict[str, str] | None = None) -> httpx.Response:
        content = body.encode() if isinstance(body, str) else body
        return loopback.post(f"{self.url}/chat/completions", content=content, headers=headers)


@pytest.fixture(scope="module", params=["serve", "proxy"])
def server(request, tmp_path_factory) -> Iterator[Server]:
    if request.param == "serve":
        model = EchoModel()
        with serve_in_background(model, "fake-model", max_body_bytes=LIMIT) as url:
            yield Server("serve", url, lambda: len(model.messages))
        return
    tmp = tmp_path_factory.mktemp("proxy")
    with FakeUpstream() as upstream:
        config = ProxyConfig(
            upstream=f"{upstream.base_url}#fake-model",
            port=0,
            log_path=tmp / "log.db",
            home=tmp / "home",
            max_body_bytes=LIMIT,
        )
        with proxy_in_background(config) as (url, _):
            yield Server("proxy", url, lambda: len(upstream.requests))


def refused(server: Server, response: httpx.Response, status: int, before: int) -> None:
    assert response.status_code == status, response.text
    assert "error" in response.json()
    assert server.calls() == before  # nothing reached the model or the upstream


def test_a_well_formed_local_request_is_answered(server):
    assert server.post(BODY, JSON).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "192.168.1.5", "0.0.0.0"])
def test_a_foreign_host_is_refused(server, host):
    before = server.calls()
    response = server.post(BODY, {**JSON, "host": host})
    refused(server, response, 403, before)
    assert "Host" in response.json()["error"]["message"]
    assert loopback.get(server.url + "/models", headers={"host": host}).status_code == 403


# Spellings a lax parser reads as loopback (issue 63: `[::1].evil.example` and
# `127.0.0.1:80@evil.example` were answered), each refused by `loopback_host`.
NOT_LOOPBACK_HOSTS = [
    "[::1].evil.example",
    "127.0.0.1:80@evil.example",
    "[::1]:80@evil.example",
    "user@127.0.0.1",
    "user:pw@localhost:8080",
    "localhost:80:80",
    "localhost:http",
    "127.0.0.1:99999",
    "[127.0.0.1]",
    "[::1]x",
    "localhost#.evil.example",
    "127.0.0.1/evil",
    "localhost\\evil.example",
    "",
]


@pytest.mark.parametrize("host", NOT_LOOPBACK_HOSTS)
def test_host_is_parsed_strictly(server, host):
    before = server.calls()
    refused(server, server.post(BODY, {**JSON, "host": host}), 403, before)


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example@127.0.0.1",
        "http://127.0.0.1:80@evil.example",
        "http://[::1].evil.example",
        "http://localhost/x",
        "file://localhost",
        "http://localhost:8080 junk",
    ],
)
def test_origin_is_parsed_strictly(server, origin):
    before = server.calls()
    refused(server, server.post(BODY, {**JSON, "origin": origin}), 403, before)


def test_the_host_parser_names_what_it_accepts():
    assert all(
        map(loopback_host, ["127.0.0.1", "127.0.0.1:8011", "LOCALHOST:1", "[::1]", "[::1]:80"])
    )
    assert all(map(loopback_host, ["a.localhost", "127.9.9.9:65535", " localhost "]))
    assert not any(map(loopback_host, NOT_LOOPBACK_HOSTS))


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost:{port}", "[::1]:{port}", "127.0.0.2"])
def test_loopback_hosts_with_any_port_are_accepted(server, host):
    headers = {**JSON, "host": host.format(port=server.port)}
    assert server.post(BODY, headers).status_code == 200


def test_a_cross_origin_simple_request_is_refused(server):
    """What `fetch(url, {method: 'POST', mode: 'no-cors', body})` sends from any page."""
    before = server.calls()
    body = BODY
    text_plain = {"content-type": "text/plain;charset=UTF-8", "origin": "https://evil.example"}
    refused(server, server.post(body, text_plain), 403, before)
    refused(server, server.post(body, {"content-type": "text/plain"}), 415, before)
    form = {"content-type": "application/x-www-form-urlencoded"}
    refused(server, server.post(body, form), 415, before)
    refused(server, server.post(body, {**JSON, "origin": "null"}), 403, before)
    local_page = {**JSON, "origin": f"http://localhost:{server.port}"}
    assert server.post(body, local_page).status_code == 200


def test_bodies_over_the_cap_are_refused(server):
    before = server.calls()
    big = '{"messages": [{"role": "user", "content": "' + "x" * LIMIT + '"}]}'
    refused(server, server.post(big, JSON), 413, before)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap holds while reading
        for i in range(0, len(big), 4096):
            yield big[i : i + 4096].encode()

    response = loopback.post(f"{server.url}/chat/completions", content=chunks(), headers=JSON)
    refused(server, response, 413, before)


BAD_JSON = {
    "deeply_nested": "[" * 30_000 + "]" * 30_000,  # under the size cap
    "nested_past_the_cap": '{"a": ' * (MAX_JSON_DEPTH + 5) + "1" + "}" * (MAX_JSON_DEPTH + 5),
    "a_list": '[{"role": "user", "content": "hi"}]',
    "a_string": '"hello"',
    "null": "null",
    "a_number": "1e999",
    "truncated": '{"messages": [',
    "not_utf8": b'{"messages": "\xff\xfe"}',
    # numbers JSON cannot spell, which Python's json reads anyway (issue 63, class 8)
    "nan_inside": '{"messages": [], "max_tokens": NaN}',
    "infinity_inside": '{"messages": [], "temperature": Infinity}',
    "minus_infinity_inside": '{"messages": [], "temperature": -Infinity}',
    "overflow_inside": '{"messages": [], "top_p": 1e400}',
}


@pytest.mark.parametrize("shape", sorted(BAD_JSON))
def test_bad_json_of_any_shape_is_a_400(server, shape):
    before = server.calls()
    refused(server, server.post(BAD_JSON[shape], JSON), 400, before)


WRONG_TYPES = [
    {"messages": "hi"},
    {"messages": [1, 2]},
    {"messages": [{"role": "user", "content": {"text": "hi"}}]},
    {"messages": [{"role": ["user"], "content": "hi"}]},
    {"model": 5, "messages": [{"role": "user", "content": "hi"}]},
    {**CHAT, "max_tokens": 1e300},
    {**CHAT, "stream": "yes", "stream_options": []},
    {**CHAT, "stop": [None]},
    {**CHAT, "tools": "none", "n": "1"},
]


@pytest.mark.parametrize("body", WRONG_TYPES, ids=range(len(WRONG_TYPES)))
def test_wrong_types_are_never_a_500(server, body):
    """serve answers 400; the proxy forwards a well-formed JSON object and reports what the
    upstream made of it (the fake one breaks off: 502), never failing itself (500)."""
    response = server.post(json.dumps(body), JSON)
    if server.kind == "serve":
        assert response.status_code == 400, response.text
    else:
        assert response.status_code != 500, response.text


# ---- the proxy's own ------------------------------------------------------------------------


@pytest.fixture
def keyed_proxy(tmp_path) -> Iterator[tuple[str, FakeUpstream, TaskLog]]:
    with FakeUpstream() as upstream:
        port = upstream.base_url.rsplit(":", 1)[1]
        config = ProxyConfig(
            upstream=f"http://alice:hunter2pw@127.0.0.1:{port}#fake-model",
            port=0,
            log_path=tmp_path / "log.db",
            home=tmp_path / "home",
            require_key="proxy-key",
        )
        with proxy_in_background(config) as (url, _):
            yield url, upstream, TaskLog(tmp_path / "log.db")


def test_health_needs_the_key_and_never_shows_a_password(keyed_proxy):
    url, _, _ = keyed_proxy
    health = url.removesuffix("/v1") + "/health"
    assert loopback.get(health).json() == {"status": "ok"}
    assert loopback.get(health, headers={"authorization": "Bearer wrong"}).json() == {
        "status": "ok"
    }
    full = loopback.get(health, headers={"authorization": "Bearer proxy-key"}).json()
    assert "log" in full and "hunter2pw" not in str(full) and "alice" not in str(full)
    assert full["upstream"].startswith("http://127.0.0.1:")


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_bearer_scheme_is_case_insensitive(keyed_proxy, scheme):
    url, upstream, _ = keyed_proxy
    headers = {**JSON, "authorization": f"{scheme} proxy-key"}
    response = loopback.post(f"{url}/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 200, response.text
    wrong = {**JSON, "authorization": f"{scheme} other-key"}
    assert loopback.post(f"{url}/chat/completions", json=CHAT, headers=wrong).status_code == 401


def test_the_logged_row_and_errors_carry_no_url_password(keyed_proxy):
    url, _, log = keyed_proxy
    headers = {"authorization": "Bearer proxy-key"}
    response = loopback.post(f"{url}/chat/completions", json=CHAT, headers=headers)
    iid = response.headers["x-selftaught-interaction-id"]
    deadline = time.monotonic() + 10
    while log.count() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    row = log.get(iid)
    assert "hunter2pw" not in str(row.to_dict()) and "127.0.0.1" in row.meta["upstream"]


def test_an_unreachable_upstream_error_shows_no_password(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    config = ProxyConfig(
        upstream=f"http://bob:s3cretpw@127.0.0.1:{port}/v1#m",
        port=0,
        log_path=tmp_path / "log.db",
        home=tmp_path / "home",
    )
    with proxy_in_background(config) as (url, _):
        response = loopback.post(f"{url}/chat/completions", json=CHAT)
    assert response.status_code == 502 and "s3cretpw" not in response.text


def test_remote_hosts_are_answered_with_allow_remote(tmp_path):
    model = EchoModel()
    with serve_in_background(model, "fake-model", allow_remote=True) as url:
        response = loopback.post(
            f"{url}/chat/completions", json=CHAT, headers={"host": "gpu-box.lan:8000"}
        )
    assert response.status_code == 200


def test_helpers():
    assert strip_credentials("see https://u:p@h.example/x and ftp://:pw@h") == (
        "see https://h.example/x and ftp://h"
    )
    assert strip_credentials("http://h:80/v1#m") == "http://h:80/v1#m"
    assert bearer_token("bEaReR  tok ") == "tok" and bearer_token("Basic x") is None
    assert all(map(is_loopback_name, ["localhost", "127.9.9.9", "[::1]", "a.localhost"]))
    assert not any(map(is_loopback_name, ["evil.example", "10.0.0.1", "localhost.evil.com"]))
