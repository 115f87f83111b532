"""The user's own CLI login, for an agent run, when they opt in (`SELFTAUGHT_AGENT_LOGIN=1`).

Each run has a private home (`base.py`), so by default it holds no login: the agent signs in
with a key from the environment. With the opt-in, the run's home gets a copy of the login the
CLI itself stored, read where the CLI keeps it:

- Claude Code: `$CLAUDE_CONFIG_DIR/.credentials.json` (default `~/.claude`), what `claude`
  writes when you sign in with a Claude subscription (Linux and Windows; macOS keeps it in
  the Keychain, which selftaught does not read);
- Codex: `$CODEX_HOME/auth.json` (default `~/.codex`), what `codex login` writes: a ChatGPT
  sign-in or an API key (not with `cli_auth_credentials_store = "keyring"`).

The copy holds the access token and never the refresh token: a run can use the login, and
cannot renew it. Both CLIs rotate the refresh token when they renew (Codex says so: "your
refresh token was already used"), so a renewal inside a run's throwaway home would leave the
user's own login holding a spent token. A login whose access token has expired stops the run
before it starts, saying how to renew it; one that expires during a night stops that night's
next call the same way (resumable). The login's values are scrubbed from everything recorded,
as secret variables are."""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftaught.models.errors import FatalBackendError

LOGIN_MARGIN_S = 60.0  # an access token this close to its end counts as expired
CLAUDE_CREDENTIALS = ".credentials.json"
CODEX_AUTH = "auth.json"


class AgentLoginError(FatalBackendError):
    """The opted-in CLI login cannot be used: missing, unreadable or expired (the message
    says which and what to do)."""


@dataclass(frozen=True)
class Login:
    """What a run's home gets: the file's name in the CLI's config folder, its text, and the
    values to scrub from anything recorded."""

    file: str
    text: str
    secrets: tuple[str, ...]


def _read(backend: str, path: Path, how: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AgentLoginError(backend, f"no login at {path} ({how})") from None
    except (OSError, ValueError) as err:
        raise AgentLoginError(backend, f"the login at {path} cannot be read ({err})") from None
    if not isinstance(data, dict):
        raise AgentLoginError(backend, f"the login at {path} is not a JSON object")
    return data


def _check_time(backend: str, path: Path, expires: float | None, renew: str) -> None:
    if expires is not None and expires - LOGIN_MARGIN_S <= time.time():
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(expires))
        raise AgentLoginError(
            backend,
            f"the login at {path} expired at {when}; selftaught never renews it (a renewal "
            f"spends the refresh token your own CLI holds): {renew}",
        )


def claude_login(config_dir: Path) -> Login:
    """The Claude Code sign-in stored in `config_dir`, without its refresh token."""
    backend = "claude-code"
    path = config_dir / CLAUDE_CREDENTIALS
    how = "sign in with `claude` (a Claude subscription), or use `claude setup-token` and "
    how += "set CLAUDE_CODE_OAUTH_TOKEN instead; on macOS the login is in the Keychain"
    oauth = _read(backend, path, how).get("claudeAiOauth")
    if not isinstance(oauth, dict) or not isinstance(oauth.get("accessToken"), str):
        raise AgentLoginError(backend, f"{path} holds no Claude sign-in ({how})")
    expires = oauth.get("expiresAt")
    expires_s = expires / 1000 if isinstance(expires, (int, float)) else None
    renew = "run `claude` once (it renews the login), or for unattended runs use "
    renew += "`claude setup-token` (a token for a year) and CLAUDE_CODE_OAUTH_TOKEN"
    _check_time(backend, path, expires_s, renew)
    kept = {k: v for k, v in oauth.items() if k != "refreshToken"}
    return Login(CLAUDE_CREDENTIALS, json.dumps({"claudeAiOauth": kept}), (oauth["accessToken"],))


def jwt_expiry(token: str) -> float | None:
    """The `exp` claim of a JWT (its signature is not checked: only when it ends)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, (int, float)) else None


def codex_login(codex_home: Path) -> Login:
    """The Codex login stored in `codex_home`: an API key as it is, a ChatGPT sign-in
    without its refresh token."""
    backend = "codex"
    path = codex_home / CODEX_AUTH
    how = "sign in with `codex login` (a ChatGPT plan) or `codex login --with-api-key`; a "
    how += 'login kept in the keyring (cli_auth_credentials_store = "keyring") is not a file'
    auth = _read(backend, path, how)
    key = auth.get("OPENAI_API_KEY")
    tokens = auth.get("tokens")
    if isinstance(tokens, dict) and isinstance(tokens.get("access_token"), str):
        renew = "run Codex once (it renews the login) or sign in again with `codex login`"
        _check_time(backend, path, jwt_expiry(tokens["access_token"]), renew)
        kept = {**tokens, "refresh_token": ""}
        copy = {
            k: v for k, v in auth.items() if k in ("auth_mode", "OPENAI_API_KEY", "last_refresh")
        }
        secrets = [str(tokens[k]) for k in ("access_token", "id_token") if tokens.get(k)]
        secrets += [key] if isinstance(key, str) and key else []
        return Login(CODEX_AUTH, json.dumps({**copy, "tokens": kept}), tuple(secrets))
    if isinstance(key, str) and key:
        copy = {"auth_mode": auth.get("auth_mode", "apikey"), "OPENAI_API_KEY": key}
        return Login(CODEX_AUTH, json.dumps(copy), (key,))
    raise AgentLoginError(backend, f"{path} holds neither a ChatGPT sign-in nor an API key ({how})")


def place_login(login: Login, config_dir: Path) -> None:
    """Write `login` into a run's CLI config folder, readable by the run's user only."""
    path = config_dir / login.file
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(login.text)
