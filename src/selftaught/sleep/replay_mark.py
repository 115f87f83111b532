"""The night's mark on its own model calls, so that a proxy in front of the night's model
relays them as they are: never logged as new traffic (the next night would mine its own
replays), never given the adopted skill on top of the candidate being tried.

The mark is a header, `x-selftaught-replay: HMAC-SHA256(key, body)`, keyed by
`<home>/replay.key` (32 random bytes, hex, 0600; made by whichever of the night and the proxy
runs first). Only who can read the sleep home can mark a request, so an end user cannot keep
their requests out of the log: a plain header anyone may send would be a silent-loss hole. What
an upstream sees (the MAC of one body) marks nothing but that same body. A night on another
host than the proxy marks with its own home's key: copy `replay.key` there, or its replays are
logged as before.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
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


def mark(key: bytes, body: bytes) -> dict[str, str]:
    """The header that marks `body` as the night's own."""
    return {REPLAY_HEADER: hmac.new(key, body, hashlib.sha256).hexdigest()}


def is_marked(key: bytes | None, headers: Mapping[str, Any], body: bytes) -> bool:
    """`body` came with the night's mark (made with `key`)."""
    given = headers.get(REPLAY_HEADER)
    if key is None or not isinstance(given, str):
        return False
    return hmac.compare_digest(given.strip().encode(), mark(key, body)[REPLAY_HEADER].encode())
