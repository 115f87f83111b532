"""What an agent run takes from the environment, in one place: where the CLIs are installed,
the pinned (minimum) versions, the tools and sandbox they run with, the concurrency cap, and
which environment variables reach them."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from selftaught.errors import ConfigError
from selftaught.models.embedded import cache_root

CLIS_ENV = "SELFTAUGHT_AGENT_CLIS"
WORKSPACE_ENV = "SELFTAUGHT_AGENT_WORKSPACE"
PASS_ENV = "SELFTAUGHT_AGENT_ENV"
CONCURRENCY_ENV = "SELFTAUGHT_AGENT_CONCURRENCY"
CLAUDE_TOOLS_ENV = "SELFTAUGHT_CLAUDE_TOOLS"
CODEX_SANDBOX_ENV = "SELFTAUGHT_CODEX_SANDBOX"
CLAUDE_SANDBOX_ENV = "SELFTAUGHT_CLAUDE_SANDBOX"
LOGIN_ENV = "SELFTAUGHT_AGENT_LOGIN"
CODEX_SANDBOXES = ("read-only", "workspace-write", "danger-full-access")
INSTALL_SCRIPT = "scripts/install-agent-clis.sh"


@dataclass(frozen=True)
class CliInfo:
    """An agent CLI selftaught drives: its name, program, npm package and pinned version (the
    oldest it is tested with, and the one the install script installs)."""

    title: str
    program: str
    package: str
    version: str

    def install_hint(self, clis_dir: Path) -> str:
        return (
            f"npm install --prefix {clis_dir} {self.package}@{self.version} (or {INSTALL_SCRIPT})"
        )


CLAUDE_CODE = CliInfo("Claude Code", "claude", "@anthropic-ai/claude-code", "2.1.328")
CODEX = CliInfo("Codex", "codex", "@openai/codex", "0.169.0")


@dataclass(frozen=True)
class AgentSettings:
    """Defaults for every agent run; `from_env` reads the overrides."""

    concurrency: int = 4
    """Agent processes at once per model (each is a heavy process: a node or native CLI)."""
    claude_tools: str = "Bash,Read,Glob,Grep,Edit(./**)"
    """Claude Code's --allowedTools: these run without asking; any other tool is refused.
    `Edit(./**)` lets its file tools (Edit, Write) write below the working folder only:
    measured with 2.1.328, a bare `Edit,Write` let Write create a file anywhere."""
    claude_sandbox: bool = True
    """Claude Code's own sandbox for its Bash tool (bubblewrap + socat): commands write in
    the workspace only and reach no network; required (the run fails if it is missing)."""
    codex_sandbox: str = "workspace-write"
    """Codex's --sandbox: its commands may write in the workspace only (bubblewrap)."""
    workspace: Path | None = None
    """A folder copied into each rollout's workspace when the task gives none (None: empty)."""
    pass_env: tuple[str, ...] = ()
    """More environment variables the agent may see, beyond its own settings."""
    clis_dir: Path | None = None
    """Where the CLIs were installed with npm --prefix (None: the default under the cache)."""
    login: bool = False
    """Copy the user's own CLI login (Claude Code's `.credentials.json`, Codex's `auth.json`)
    into each run's home, without its refresh token (`models.agents.login`)."""

    @property
    def install_dir(self) -> Path:
        return self.clis_dir or cache_root() / "agent-clis"

    @property
    def homes_dir(self) -> Path:
        """Per-rollout homes live here, not under /tmp: Codex refuses to set up its sandbox
        helpers in a home under the temporary folder."""
        return cache_root() / "agent-homes"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AgentSettings:
        env = os.environ if environ is None else environ
        defaults = cls()
        concurrency = _positive_int(env.get(CONCURRENCY_ENV), CONCURRENCY_ENV, defaults.concurrency)
        sandbox = env.get(CODEX_SANDBOX_ENV) or defaults.codex_sandbox
        if sandbox not in CODEX_SANDBOXES:
            raise ConfigError(
                f"{CODEX_SANDBOX_ENV}={sandbox!r} is not a Codex sandbox; use one of "
                + ", ".join(CODEX_SANDBOXES)
            )
        workspace = None
        if env.get(WORKSPACE_ENV):
            workspace = Path(env[WORKSPACE_ENV]).expanduser().resolve()
            if not workspace.is_dir():
                raise ConfigError(f"{WORKSPACE_ENV}={env[WORKSPACE_ENV]} is not a folder")
        names = tuple(n for n in re.split(r"[,\s]+", env.get(PASS_ENV, "")) if n)
        clis = env.get(CLIS_ENV)
        return cls(
            concurrency=concurrency,
            claude_tools=env.get(CLAUDE_TOOLS_ENV) or defaults.claude_tools,
            claude_sandbox=_switch(env, CLAUDE_SANDBOX_ENV, default=True),
            login=_switch(env, LOGIN_ENV, default=False),
            codex_sandbox=sandbox,
            workspace=workspace,
            pass_env=names,
            clis_dir=Path(clis).expanduser() if clis else None,
        )

    def find(self, program: str) -> str | None:
        """The program's path: in $SELFTAUGHT_AGENT_CLIS (its node_modules/.bin, or itself),
        on PATH, in the default install folder, or in ./node_modules/.bin; None if absent."""
        places: list[Path] = []
        if self.clis_dir is not None:
            places += [self.clis_dir / "node_modules" / ".bin", self.clis_dir]
        for place in places:
            found = shutil.which(program, path=str(place))
            if found:
                return found
        if os.sep in program:  # a path, not a name
            return program if os.path.isfile(program) and os.access(program, os.X_OK) else None
        found = shutil.which(program)
        if found:
            return found
        fallbacks = [self.install_dir / "node_modules" / ".bin", Path("node_modules") / ".bin"]
        for place in fallbacks:
            found = shutil.which(program, path=str(place))
            if found:
                return os.path.abspath(found)
        return None


def _switch(env: Mapping[str, str], name: str, *, default: bool) -> bool:
    raw = (env.get(name) or ("1" if default else "0")).strip().lower()
    if raw not in ("1", "0", "true", "false", "on", "off", "yes", "no"):
        raise ConfigError(f"{name} must be 1 or 0, got {raw!r}")
    return raw in ("1", "true", "on", "yes")


def _positive_int(raw: str | None, name: str, default: int) -> int:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {raw!r}")
    return value


def parse_version(text: str) -> tuple[int, ...] | None:
    """(2, 1, 328) from '2.1.328 (Claude Code)' or 'codex-cli 0.169.0'; None if none."""
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(g) for g in m.groups()) if m else None
