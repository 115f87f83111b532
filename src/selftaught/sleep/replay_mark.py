"""The night's mark on its own model calls, so that a proxy in front of the night's model
relays them as they are: never logged as new traffic (the next night would mine its own
replays), never given the adopted skill on top of the candidate being tried.

The mark is a header, `x-selftaught-replay: EXPIRES.NONCE.MAC`, where MAC is
HMAC-SHA256(key, route, project, EXPIRES, NONCE, body) keyed by `<home>/replay.key` (32
random bytes, hex, 0600; made by whichever of the night and the proxy runs first). Only who
can read the sleep home can mark a request, so an end user cannot keep their requests out of
the log: a plain header anyone may send would be a silent-loss hole.

A mark is good for one request: the route it was made for (`/v1/chat/completions`, ...), the
project whose night made it (a proxy checks its own), until EXPIRES (`MARK_TTL_S` after it
was made: a night's call is sent at once), and once (the proxy remembers each nonce until it
expires). So a mark someone saw (an upstream, a log of headers) relays nothing again: not the
same body a second time, nor on another route, project or proxy of another project sharing
the home. A night on another host than the proxy marks with its own home's key: copy
`replay.key` there, or its replays are logged as before.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selftaught.errors import ConfigError
from selftaught.runs import sleep_home

REPLAY_HEADER = "x-selftaught-replay"
KEY_FILE = "replay.key"
_KEY_HEX_CHARS = 64


def replay_key(home: Path | None = None) -> bytes:
    """The home's replay key, made (complete, 0600, atomically) when there is none yet."""
    from selftaught.sleep.paths import private_home

    home = Path(home) if home is not None else sleep_home()
    private_home(home)
    path = home / KEY_FILE
    if not path.exists():
        tmp = home / f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(secrets.token_hex(_KEY_HEX_CHARS // 2) + "\n")
            os.link(tmp, path)  # appears whole, or another process's key won: read that one
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    text = path.read_text(encoding="ascii", errors="replace").strip()
    if len(text) != _KEY_HEX_CHARS:
        raise ConfigError(f"{path} is not a replay key: delete it and a new one is made")
    return text.encode("ascii")


MARK_TTL_S = 300.0
"""Seconds a mark is good for: it is made as the night's request leaves, so only clock skew
between the night's host and the proxy's needs more than a moment."""


def _mac(key: bytes, route: str, project: str, expires: int, nonce: str, body: bytes) -> str:
    head = f"{route}\n{project}\n{expires}\n{nonce}\n".encode("utf-8", "backslashreplace")
    return hmac.new(key, head + body, hashlib.sha256).hexdigest()


def mark(
    key: bytes, route: str, project: str, body: bytes, *, now: float | None = None
) -> dict[str, str]:
    """The header that marks `body`, sent to `route` (the URL's path) for `project`'s night,
    as the night's own: good once, for MARK_TTL_S seconds from `now`."""
    expires = int((time.time() if now is None else now) + MARK_TTL_S)
    nonce = secrets.token_hex(12)
    return {REPLAY_HEADER: f"{expires}.{nonce}.{_mac(key, route, project, expires, nonce, body)}"}


@dataclass
class NightMarks:
    """What a night signs its model calls with (`sign` of a model: the request's path and
    body → the header). `project` is the project whose night is running: the night sets it
    before each project's (projects run one after another)."""

    key: bytes
    project: str = ""

    def __call__(self, route: str, body: bytes) -> dict[str, str]:
        return mark(self.key, route, self.project, body)


@dataclass
class MarkChecker:
    """A proxy's check of the night's mark: a request is the night's own when its mark was
    made with `key` for this route, body and `project`, has not expired, and was not used
    before (nonces are remembered until they expire)."""

    key: bytes | None
    project: str
    _used: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def accepts(
        self, headers: Mapping[str, Any], route: str, body: bytes, now: float | None = None
    ) -> bool:
        given = headers.get(REPLAY_HEADER)
        if self.key is None or not isinstance(given, str):
            return False
        expires_text, _, rest = given.strip().partition(".")
        nonce, _, mac = rest.partition(".")
        now = time.time() if now is None else now
        if not expires_text.isdigit() or len(expires_text) > 12 or not nonce:
            return False
        expires = int(expires_text)
        if not now <= expires <= now + MARK_TTL_S + 60:  # expired, or made to outlive its use
            return False
        wanted = _mac(self.key, route, self.project, expires, nonce, body)
        if not hmac.compare_digest(mac.encode(), wanted.encode()):
            return False
        with self._lock:
            while self._used:  # oldest first (nonces come in about the order they expire)
                oldest = next(iter(self._used))
                if self._used[oldest] >= now:
                    break
                del self._used[oldest]
            if nonce in self._used:
                return False  # a mark seen before: relays nothing again
            self._used[nonce] = expires
        return True
