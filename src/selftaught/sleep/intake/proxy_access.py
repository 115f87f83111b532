"""Who may use the proxy, who they are in the log, and what the proxy relays.

- **Keys.** A client's key is read from `Authorization: Bearer KEY` or `x-api-key: KEY`
  (Claude Code sends the latter). `--require-key KEY` and `--client-keys FILE` (a JSON or TOML
  mapping `label = "key"`) make a key necessary; any listed key is accepted.
- **Client ids.** Every logged row records who sent it, never the secret: the label of a
  `--client-keys` key, else `key:<first 12 hex of sha256(key)>` for the key the client sent,
  else `anonymous`. Without a required key the id is what the client claims (any key gives a
  new id): only `--require-key` / `--client-keys` make it an identity.
- **Routes.** Only exact routes are relayed (`RELAYED`): the model APIs the proxy logs, and
  `GET /v1/models`; `POST /v1/embeddings` only with `--forward-embeddings`. Anything else,
  an encoded or dotted path included (`/v1/%2E%2E/metrics`, `//v1/...`), is a 404 from the
  proxy itself (`http_guard` checks the raw path). The upstream URL is built from the route,
  never from the client's path. The operator's upstream key goes only with the requests the
  proxy logs; `openai-organization` / `openai-project` only with `--forward-org-headers`.
- **Feedback rate.** Each client's feedback is a token bucket (`RateLimit`): a full bucket
  holds `per_minute` feedbacks and refills at that rate; an empty one is a 429 with
  `Retry-After`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from selftaught.errors import InputError
from selftaught.http_guard import bearer_token, strict_json

ANONYMOUS = "anonymous"
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
MIN_KEY_CHARS = 8

LOGGED_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
}
"""The model APIs the proxy forwards and logs: path → wire format (`proxy_wire.WIRES`)."""
OWN_ROUTES = {
    ("GET", "/health"),
    ("GET", "/ready"),
    ("GET", "/v1/selftaught/stats"),
    ("POST", "/v1/feedback"),
}
EMBEDDINGS = ("POST", "/v1/embeddings")


def relayed_routes(forward_embeddings: bool) -> frozenset[tuple[str, str]]:
    """Every (method, path) the proxy answers; everything else is a 404."""
    routes = {("POST", path) for path in LOGGED_ROUTES} | {("GET", "/v1/models")} | OWN_ROUTES
    if forward_embeddings:
        routes.add(EMBEDDINGS)
    return frozenset(routes)


class AccessError(InputError):
    """A key file or key setting the proxy cannot use."""


def key_id(key: str) -> str:
    """The id a key is logged under: never the key itself."""
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:12]


def presented_keys(headers: Any) -> list[str]:
    """The keys a request carries (`Authorization: Bearer`, then `x-api-key`)."""
    keys = [bearer_token(headers.get("authorization")), headers.get("x-api-key")]
    return [k.strip() for k in keys if isinstance(k, str) and k.strip()]


def read_client_keys(path: Path) -> dict[str, str]:
    """`label → key` from a JSON object or a TOML table of strings."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise AccessError(f"cannot read the client keys file {path}: {err.strerror}") from None
    try:
        if Path(path).suffix.lower() == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # the `tomli` dependency (the same parser) on Python 3.10
                import tomli as tomllib

            data: Any = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ImportError:
        raise AccessError(f"{path}: TOML needs Python 3.11 or `tomli`; write it as JSON") from None
    except ValueError as err:  # json and tomllib errors both derive from ValueError
        raise AccessError(f"the client keys file {path} is not valid: {err}") from None
    if not isinstance(data, dict) or not data:
        raise AccessError(f"the client keys file {path} must map labels to keys")
    return check_client_keys(data, str(path))


def check_client_keys(data: dict[str, Any], where: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    for label, key in data.items():
        if not isinstance(label, str) or not _LABEL.fullmatch(label) or label == ANONYMOUS:
            raise AccessError(
                f"{where}: client label {label!r} must be 1-64 letters, digits, . _ @ - "
                f"(and not {ANONYMOUS!r})"
            )
        if not isinstance(key, str) or len(key.strip()) < MIN_KEY_CHARS:
            raise AccessError(f"{where}: the key of {label!r} must be a string of 8+ characters")
        if key.strip() in keys:
            raise AccessError(f"{where}: {label!r} and {keys[key.strip()]!r} share one key")
        keys[key.strip()] = label
    return keys


class Clients:
    """Which keys are accepted and what each is called in the log."""

    def __init__(
        self,
        require_key: str | None = None,
        client_keys: dict[str, str] | None = None,  # key → label
        feedback_key: str | None = None,
    ):
        self.labels = dict(client_keys or {})
        if require_key:
            self.labels.setdefault(require_key, key_id(require_key))
        self.required = bool(self.labels)
        self.feedback_key = feedback_key

    def identify(self, headers: Any) -> str | None:
        """The client id of a request; None when a key is required and it has none."""
        keys = presented_keys(headers)
        for key in keys:
            for known, label in self.labels.items():
                if hmac.compare_digest(key.encode(), known.encode()):
                    return label
        if self.required:
            return None
        return key_id(keys[0]) if keys else ANONYMOUS

    def is_operator(self, headers: Any) -> bool:
        """The request carries the operator's `--feedback-key`."""
        if not self.feedback_key:
            return False
        wanted = self.feedback_key.encode()
        return any(hmac.compare_digest(k.encode(), wanted) for k in presented_keys(headers))

    def own_key(self, key: str | None) -> bool:
        """`key` is one of the proxy's own (never passed upstream)."""
        if not key:
            return False
        return key in self.labels or key == self.feedback_key


class RateLimit:
    """A token bucket per client: `per_minute` tokens, refilled continuously. Remembers at
    most `max_clients` buckets (the least recently used is forgotten: a full bucket)."""

    def __init__(self, per_minute: float, max_clients: int = 10_000):
        self.capacity = float(per_minute)
        self.rate = float(per_minute) / 60.0
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, client: str, now: float | None = None) -> float:
        """0 when `client` may go on (a token is taken), else the seconds until it may."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, then = self._buckets.pop(client, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - then) * self.rate)
            wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
            self._buckets[client] = (tokens - 1 if wait == 0 else tokens, now)
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        return wait


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


# ---- answers the proxy gives itself ---------------------------------------------------------


def error_body(message: str, kind: str, status: int) -> dict[str, Any]:
    """An error in OpenAI's shape (what every client of the proxy reads)."""
    return {"error": {"message": message, "type": kind, "code": status, "param": None}}


def error_response(
    status: int, message: str, kind: str, iid: str | None = None, **headers: str
) -> Any:
    from fastapi.responses import JSONResponse

    from selftaught.sleep.intake.proxy_wire import ID_HEADER

    extra = {**({ID_HEADER: iid} if iid else {}), **headers}
    return JSONResponse(error_body(message, kind, status), status_code=status, headers=extra)


def unauthorized() -> Any:
    return error_response(
        401,
        "missing or wrong API key for this proxy (--require-key / --client-keys)",
        "authentication_error",
    )


async def read_json_body(request: Any) -> tuple[bytes, dict[str, Any] | str]:
    """The raw body and its JSON object, or why it is not one."""
    raw = await request.body()
    try:
        body = strict_json(raw)
    except (ValueError, RecursionError) as err:
        return raw, f"the request body is not valid JSON: {err}"
    if not isinstance(body, dict):
        return raw, "the request body must be a JSON object"
    return raw, body
