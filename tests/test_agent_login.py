"""The user's own CLI login instead of a key (`SELFTAUGHT_AGENT_LOGIN=1`,
`models/agents/login.py`), with the real pinned CLIs against the scripted upstream.

What the CLIs do with a login, measured here: Claude Code sends a sign-in's access token (from
`.credentials.json` or `CLAUDE_CODE_OAUTH_TOKEN`) as `Authorization: Bearer`; Codex sends a
ChatGPT sign-in's access token with `chatgpt-account-id`, or the key `codex login
--with-api-key` stored, to a provider with `requires_openai_auth = true`. A run's copy of the
login holds no refresh token, the user's file is left as it was, and no token reaches the run
directory."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest

from tests.agent_upstream import (
    AgentUpstream,
    cli_dir,
    needs_cli,
    needs_skill,
    one_tool_then_answer,
    sandbox_ready,
)
from tests.test_agent_policy import qa_task, run_eval

MARKER = "MARKER-LOGIN-3J"
ACCESS = "sk-ant-oat01-access-token-from-the-login-7c1d"
REFRESH = "sk-ant-ort01-refresh-token-never-copied-4e9a"


def b64(value: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


def jwt(claims: dict) -> str:
    return f"{b64({'alg': 'none'})}.{b64(claims)}.signature-part"


@pytest.fixture
def agent_env(monkeypatch, tmp_path):
    """No key of the user's in the environment: only the login (when the test writes one)."""
    for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "CODEX_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SELFTAUGHT_AGENT_CLIS", str(cli_dir()))
    monkeypatch.setenv("SELFTAUGHT_AGENT_LOGIN", "1")
    if not sandbox_ready():
        monkeypatch.setenv("SELFTAUGHT_CLAUDE_SANDBOX", "0")
    return monkeypatch


def claude_credentials(config: Path, expires_in_s: float = 3600) -> Path:
    config.mkdir(parents=True, exist_ok=True)
    oauth = {
        "accessToken": ACCESS,
        "refreshToken": REFRESH,
        "expiresAt": int((time.time() + expires_in_s) * 1000),
        "scopes": ["user:inference", "user:profile"],
        "subscriptionType": "max",
    }
    path = config / ".credentials.json"
    path.write_text(json.dumps({"claudeAiOauth": oauth, "mcpOAuth": {"x": "other-secret-1234"}}))
    return path


def codex_home(home: Path, base_url: str, auth: dict) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        'model = "scripted-agent-model"\nmodel_provider = "scripted"\n'
        "[model_providers.scripted]\n"
        f'name = "scripted"\nbase_url = "{base_url}"\nwire_api = "responses"\n'
        "requires_openai_auth = true\nrequest_max_retries = 0\nstream_max_retries = 0\n"
    )
    path = home / "auth.json"
    path.write_text(json.dumps(auth))
    return path


def chatgpt_auth(expires_in_s: float = 3600) -> tuple[dict, str]:
    claims = {
        "exp": int(time.time() + expires_in_s),
        "https://api.openai.com/auth": {
            "chatgpt_plan_type": "plus",
            "chatgpt_account_id": "acct-9",
        },
    }
    access = jwt({**claims, "jti": "access-token-of-the-login"})
    tokens = {"id_token": jwt(claims), "access_token": access, "refresh_token": REFRESH}
    auth = {
        "auth_mode": "chatgpt",
        "OPENAI_API_KEY": None,
        "tokens": tokens | {"account_id": "acct-9"},
    }
    return auth | {"last_refresh": "2026-01-01T00:00:00Z"}, access


def headers(up: AgentUpstream) -> list[dict[str, str]]:
    return [
        {k.lower(): v for k, v in call["headers"].items()}
        for call in up.calls
        if call["path"].startswith(("/v1/messages", "/v1/responses"))
    ]


def no_token_in(run: Path, *tokens: str) -> None:
    for file in run.rglob("*"):
        if file.is_file():
            text = file.read_text(errors="replace")
            for token in tokens:
                assert token not in text, file


# ---- Claude Code ----------------------------------------------------------------------------


@needs_cli("claude-code")
def test_claude_code_runs_on_the_users_sign_in(tmp_path, agent_env):
    config = tmp_path / "user-claude"
    user_file = claude_credentials(config)
    before = user_file.read_bytes()
    run = tmp_path / "run"
    run.mkdir()
    # the agent prints the login its run was given: what a tool in the run could read
    command = 'cat "$CLAUDE_CONFIG_DIR/.credentials.json"; echo'
    with AgentUpstream(one_tool_then_answer(command)) as up:
        agent_env.setenv("ANTHROPIC_BASE_URL", up.root_url)
        agent_env.setenv("CLAUDE_CONFIG_DIR", str(config))
        result, rows = run_eval(qa_task(tmp_path, 1), "claude-code", run / "eval.jsonl")
    assert result.exit_code == 0, result.output
    assert {h.get("authorization") for h in headers(up)} == {f"Bearer {ACCESS}"}
    assert all(h.get("x-api-key") is None for h in headers(up))
    shown = rows[0]["trajectory"][1]["content"]
    seen, _ = json.JSONDecoder().raw_decode(shown[shown.index("{") :])
    assert seen["claudeAiOauth"]["accessToken"] == "[REDACTED:env]"  # scrubbed where recorded
    assert "refreshToken" not in seen["claudeAiOauth"] and "mcpOAuth" not in seen
    assert user_file.read_bytes() == before
    no_token_in(run, ACCESS, REFRESH)


@needs_cli("claude-code")
def test_an_expired_claude_sign_in_stops_before_any_request(tmp_path, agent_env):
    config = tmp_path / "user-claude"
    claude_credentials(config, expires_in_s=-3600)
    with AgentUpstream(needs_skill(MARKER)) as up:
        agent_env.setenv("ANTHROPIC_BASE_URL", up.root_url)
        agent_env.setenv("CLAUDE_CONFIG_DIR", str(config))
        result, _ = run_eval(qa_task(tmp_path, 1), "claude-code", tmp_path / "out.jsonl")
        assert up.requests_seen == []
    assert result.exit_code == 1, result.output
    assert "expired" in result.output and "claude setup-token" in result.output
    assert ACCESS not in result.output


@needs_cli("claude-code")
def test_an_opted_in_login_that_is_not_there_says_where_it_looked(tmp_path, agent_env):
    agent_env.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "nothing"))
    result, _ = run_eval(qa_task(tmp_path, 1), "claude-code", tmp_path / "out.jsonl")
    assert result.exit_code == 1, result.output
    assert "no login at" in result.output and ".credentials.json" in result.output
    assert "Keychain" in result.output


@needs_cli("claude-code")
def test_claude_codes_long_lived_token_works_without_the_opt_in(tmp_path, agent_env):
    # `claude setup-token` prints a token for a year; CLAUDE_* variables reach the agent
    agent_env.setenv("SELFTAUGHT_AGENT_LOGIN", "0")
    agent_env.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "nothing"))
    run = tmp_path / "run"
    run.mkdir()
    with AgentUpstream(one_tool_then_answer("env | grep OAUTH; echo done")) as up:
        agent_env.setenv("ANTHROPIC_BASE_URL", up.root_url)
        agent_env.setenv("CLAUDE_CODE_OAUTH_TOKEN", ACCESS)
        result, rows = run_eval(qa_task(tmp_path, 1), "claude-code", run / "eval.jsonl")
    assert result.exit_code == 0, result.output
    assert {h.get("authorization") for h in headers(up)} == {f"Bearer {ACCESS}"}
    assert rows[0]["trajectory"][1]["content"] == "done"  # Claude Code keeps it from its tools
    no_token_in(run, ACCESS)


# ---- Codex ----------------------------------------------------------------------------------


@needs_cli("codex")
def test_codex_runs_on_the_users_chatgpt_sign_in(tmp_path, agent_env):
    auth, access = chatgpt_auth()
    run = tmp_path / "run"
    run.mkdir()
    command = 'cat "$CODEX_HOME/auth.json"; echo'
    with AgentUpstream(one_tool_then_answer(command)) as up:
        home = tmp_path / "user-codex"
        user_file = codex_home(home, up.base_url, auth)
        before = user_file.read_bytes()
        agent_env.setenv("CODEX_HOME", str(home))
        result, rows = run_eval(qa_task(tmp_path, 1), "codex", run / "eval.jsonl")
    assert result.exit_code == 0, result.output
    sent = headers(up)
    assert sent and {h.get("authorization") for h in sent} == {f"Bearer {access}"}
    assert {h.get("chatgpt-account-id") for h in sent} == {"acct-9"}
    shown = rows[0]["trajectory"][1]["content"]
    assert '"refresh_token": ""' in shown and REFRESH not in shown
    assert user_file.read_bytes() == before
    no_token_in(run, access, REFRESH, auth["tokens"]["id_token"])


@needs_cli("codex")
def test_codex_runs_on_the_key_codex_login_stored(tmp_path, agent_env):
    key = "sk-proj-key-from-codex-login-52b8"
    run = tmp_path / "run"
    run.mkdir()
    with AgentUpstream(one_tool_then_answer('cat "$CODEX_HOME/auth.json"; echo')) as up:
        home = tmp_path / "user-codex"
        codex_home(home, up.base_url, {"auth_mode": "apikey", "OPENAI_API_KEY": key})
        agent_env.setenv("CODEX_HOME", str(home))
        result, rows = run_eval(qa_task(tmp_path, 1), "codex", run / "eval.jsonl")
    assert result.exit_code == 0, result.output
    assert {h.get("authorization") for h in headers(up)} == {f"Bearer {key}"}
    assert "[REDACTED:env]" in rows[0]["trajectory"][1]["content"]
    no_token_in(run, key)


@needs_cli("codex")
def test_an_expired_chatgpt_sign_in_stops_before_any_request(tmp_path, agent_env):
    auth, access = chatgpt_auth(expires_in_s=-600)
    with AgentUpstream(needs_skill(MARKER)) as up:
        home = tmp_path / "user-codex"
        codex_home(home, up.base_url, auth)
        agent_env.setenv("CODEX_HOME", str(home))
        result, _ = run_eval(qa_task(tmp_path, 1), "codex", tmp_path / "out.jsonl")
        assert up.requests_seen == []
    assert result.exit_code == 1, result.output
    assert "expired" in result.output and "codex login" in result.output
    assert access not in result.output
