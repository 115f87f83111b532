"""What selftaught's local HTTP servers (`selftaught serve`, `selftaught proxy`) accept.

A server on loopback is reachable by every web page the user opens: a `text/plain` POST is a
CORS "simple request" that no preflight stops, and DNS rebinding gives a page a foreign name
that resolves to 127.0.0.1. So, unless the server was started with `allow_remote`:

- the `Host` header must be a loopback name (127.0.0.1 or any 127.x address, localhost,
  [::1]) and an optional port, nothing else (`loopback_host`: no userinfo, no text after the
  name or port), else 403; an `Origin` header, when sent, must be `http(s)://` and such a
  host, nothing else (403);
- a POST / PUT / PATCH must say `Content-Type: application/json` (415); browsers cannot send
  that across origins without a preflight, which these servers never answer;

and always:

- with `routes` (the proxy), a request whose method and path are not exactly one of them is a
  404 before anything else is read: the raw path must equal the decoded one (no `%2E`, `%2F`
  or other escapes) and match a route exactly (no `//`, `.` or `..` segments, no trailing
  slash), so no path reaches an app that normalises it into another route;
- a body is at most `max_body_bytes` (413), checked on `Content-Length` and while reading;
- a non-empty body must be a JSON object nested at most `MAX_JSON_DEPTH` deep, with no number
  JSON cannot spell (`strict_json`: NaN, ±Infinity, 1e400) (400: bad JSON of any shape is the
  client's error, never a 500).

`strip_credentials` takes `user:password@` out of URLs before a server shows or logs them (up
to the last `@` of the URL: a password may hold `/` or `?` unescaped), and
`bearer_token` reads an `Authorization` header whatever the scheme's case.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from selftaught.errors import ConfigError, InputError

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
LOOPBACK = "127.0.0.1"
"""Where servers bind unless told otherwise: reachable from this machine only."""
MAX_JSON_DEPTH = 100  # OpenAI bodies (tools with JSON schemas included) nest far less
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_URL_TOKEN = re.compile(r"[^\s\"'<>]+")
_URL_SCHEME = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]{0,30}://")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def strip_credentials(text: str) -> str:
    """`text` with the `user:password@` part of every URL in it removed: everything between
    `scheme://` and the last `@` of the URL (a password's `/` or `?` does not end it; an `@`
    in a path or query costs what precedes it, the safe side). One pass per word: linear."""

    def word(match: re.Match[str]) -> str:
        token = match.group(0)
        scheme = _URL_SCHEME.search(token)
        at = token.rfind("@")
        if scheme is None or at < scheme.end():
            return token
        return token[: scheme.end()] + token[at + 1 :]

    return _URL_TOKEN.sub(word, text)


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header (any case of `Bearer`)."""
    scheme, _, token = (header or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def is_loopback_name(host: str) -> bool:
    """A host name or address (no port) that means this machine."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# RFC 9110's Host: a name or IPv4 address, or an IPv6 address in brackets, then an optional
# port; one parser for Host and Origin, so no spelling is read two ways.
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::([0-9]{1,5}))?")
_ORIGIN = re.compile(r"(?i:https?)://(.+)")


def loopback_host(value: str) -> bool:
    """Whether a `Host` header value is a loopback name with an optional port, and nothing
    else: `[::1].evil.example`, `127.0.0.1:80@evil.example`, `user@localhost`, a port past
    65535 or any text after it are not."""
    match = _HOST_PORT.fullmatch(value.strip())
    if match is None or (match.group(2) is not None and int(match.group(2)) > 65535):
        return False
    host = match.group(1)
    if host.startswith("["):  # only an IPv6 address goes in brackets
        try:
            return ipaddress.IPv6Address(host[1:-1]).is_loopback
        except ValueError:
            return False
    return is_loopback_name(host)


def _origin_is_loopback(origin: str) -> bool:
    """An `Origin` that is `http(s)://` and a loopback host (`loopback_host`), nothing else."""
    match = _ORIGIN.fullmatch(origin.strip())
    return match is not None and loopback_host(match.group(1))


def _not_a_number(name: str) -> Any:
    raise InputError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise InputError(f"the number {shown} is too large for a float")
    return value


def strict_json(data: bytes | str) -> Any:
    """`json.loads` for what a client sends: the numbers JSON has no spelling for, which
    Python reads anyway (NaN, Infinity, -Infinity, and a float too large, as 1e400 reads as
    infinity), are an InputError (a ValueError) naming them, so no such number is ever stored or
    echoed."""
    return json.loads(data, parse_constant=_not_a_number, parse_float=_finite)


def json_body_problem(body: bytes) -> str | None:
    """Why `body` is not a JSON object the servers accept; None when it is."""
    try:
        value = strict_json(body)
    except RecursionError:
        return f"the request body is nested deeper than {MAX_JSON_DEPTH} levels"
    except ValueError as err:  # UnicodeDecodeError included
        return f"the request body is not valid JSON: {err}"
    if not isinstance(value, dict):
        return "the request body must be a JSON object"
    if _depth(value) > MAX_JSON_DEPTH:
        return f"the request body is nested deeper than {MAX_JSON_DEPTH} levels"
    return None


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


class LocalServerGuard:
    """ASGI middleware enforcing the rules above; add it with `install_guard`."""

    def __init__(
        self,
        app: Any,
        *,
        allow_remote: bool,
        max_body_bytes: int,
        routes: frozenset[tuple[str, str]] | None = None,
    ) -> None:
        if max_body_bytes < 1:
            raise ConfigError(f"max_body_bytes must be positive, got {max_body_bytes}")
        self.app = app
        self.allow_remote = allow_remote
        self.max_body_bytes = max_body_bytes
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._check_headers(scope["method"], headers)
        if refusal is None and self.routes is not None:
            refusal = self._check_route(scope)
        if refusal is None and scope["method"] in _BODY_METHODS:
            body, refusal = await self._read_body(receive)
            if refusal is None and body:
                problem = json_body_problem(body)
                refusal = (400, problem) if problem else None
            if refusal is None:
                receive = _replay(body, receive)
        if refusal is not None:
            await _refuse(send, *refusal)
            return
        await self.app(scope, receive, send)

    def _check_headers(self, method: str, headers: dict[str, str]) -> tuple[int, str] | None:
        if not self.allow_remote:
            host = headers.get("host")
            if host is not None and not loopback_host(host):
                return 403, (
                    f"the Host header {host!r} is not a loopback name; this server answers "
                    "only requests to 127.0.0.1, localhost or [::1] unless started with "
                    "--allow-remote"
                )
            origin = headers.get("origin")
            if origin is not None and not _origin_is_loopback(origin):
                return 403, (
                    f"requests from the web origin {origin!r} are refused; this server "
                    "answers only local clients unless started with --allow-remote"
                )
        if method in _BODY_METHODS:
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json" and not media.endswith("+json"):
                return (
                    415,
                    "the request body must be JSON (Content-Type: application/json), got "
                    f"{media or 'none'!r}",
                )
            length = headers.get("content-length", "0")
            if not length.isdigit():
                return 400, f"bad Content-Length {length!r}"
            if int(length) > self.max_body_bytes:
                return 413, self._too_large()
        return None

    def _check_route(self, scope: Scope) -> tuple[int, str] | None:
        path = scope.get("path", "")
        raw = scope.get("raw_path")
        raw_text = raw.decode("latin-1").split("?", 1)[0] if isinstance(raw, bytes) else path
        if raw_text == path and (scope["method"], path) in (self.routes or ()):
            return None
        shown = raw_text if len(raw_text) <= 200 else raw_text[:200] + "..."
        return 404, f"no route {scope['method']} {shown} on this server"

    def _too_large(self) -> str:
        return f"the request body is larger than this server's limit of {self.max_body_bytes} bytes"

    async def _read_body(self, receive: Receive) -> tuple[bytes, tuple[int, str] | None]:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", (400, "the client went away before sending its body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return b"", (413, self._too_large())
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the app the body already read, then the real channel (through
    which the app hears of a disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> MutableMapping[str, Any]:
        return pending.pop() if pending else await receive()

    return replayed


async def _refuse(send: Send, status: int, message: str) -> None:
    kind = {403: "permission_error", 404: "not_found_error"}.get(status, "invalid_request_error")
    payload = {"error": {"message": message, "type": kind, "code": status, "param": None}}
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install_guard(
    app: Any,
    *,
    allow_remote: bool,
    max_body_bytes: int,
    routes: frozenset[tuple[str, str]] | None = None,
) -> None:
    """Put `LocalServerGuard` in front of a Starlette / FastAPI app (`routes`: the only
    (method, path) pairs it may see)."""
    app.add_middleware(
        LocalServerGuard, allow_remote=allow_remote, max_body_bytes=max_body_bytes, routes=routes
    )
