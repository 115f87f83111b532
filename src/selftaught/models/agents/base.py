"""A coding agent as the model: each call runs the agent's CLI once, non-interactively, in a
fresh workspace, with the skill written where that agent reads it.

The messages the policy builds become two things, since a CLI takes one prompt: the system
message (skill rules, memory) and any earlier user/assistant turns (worked examples) are
written to the agent's instruction file in the workspace (`CLAUDE.md`, `AGENTS.md`), and the
last user message is the prompt. The agent's final message is the reply; its tool calls with
their results (as OpenAI-shaped turns) and the files it changed go into `Completion.extra`.

Each run gets its own temporary HOME (and the CLI's config folder in it, holding only a copy
of the user's CLI config file), a process group killed when the run ends, and an environment
of the agent's own settings only: nothing else of the user's environment reaches a tool the
agent runs. The values of secret-looking variables are scrubbed from everything recorded.

Errors follow the API models' rule (`models/errors.py`): a missing or outdated CLI, a refused
key, an unknown model are fatal (the run stops, in the agent's own words); a timeout, a 429 or
5xx, a lost connection are transient and retried, each retry in a clean workspace."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selftaught.demos import Demo, demo_section
from selftaught.errors import ConfigError, InputError
from selftaught.models.agents.login import Login
from selftaught.models.agents.process import ProcessResult, run_process
from selftaught.models.agents.settings import CLIS_ENV, AgentSettings, CliInfo, parse_version
from selftaught.models.base import AsyncChatModel, Completion, GenerationParams, Message
from selftaught.models.errors import (
    CALL_TIMEOUT_S,
    FatalBackendError,
    RetryPolicy,
    TransientBackendError,
    with_retries,
)
from selftaught.workspace import Workspace, changes, current_workspace, snapshot

# What of the user's environment reaches an agent: its own settings, locale, proxies and
# certificates; plus the names in $SELFTAUGHT_AGENT_ENV.
PASSED_NAMES = frozenset(
    {
        "PATH", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "SHELL",
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
        "http_proxy", "https_proxy", "no_proxy", "all_proxy",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE",
    }
)  # fmt: skip
PASSED_PREFIXES = ("LC_", "ANTHROPIC_", "CLAUDE_", "OPENAI_", "CODEX_", "DISABLE_")
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL|COOKIE", re.I)
MIN_SECRET_CHARS = 6
SCRUBBED = "[REDACTED:env]"
VERSION_TIMEOUT_S = 60.0
SKILL_FILES = ".skill"  # where a skill package's files go in an agent's workspace
_VERSIONS: dict[str, str] = {}  # program path -> its checked version
_VERSIONS_LOCK = threading.Lock()


class AgentNotInstalled(FatalBackendError):
    """The agent's CLI is not installed where selftaught looks (the message says how)."""


class AgentOutdated(FatalBackendError):
    """The agent's CLI is older than the version selftaught supports."""


# ---- from messages to what the agent reads ----------------------------------------------


@dataclass(frozen=True)
class AgentBrief:
    """What one run gives the agent: the instruction file's text and the prompt."""

    instructions: str
    prompt: str


def content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return "" if content is None else str(content)


def refuse_tools() -> None:
    raise ConfigError(
        "a CLI agent brings its own tools: a task whose episodes offer tools (or replay tool "
        "results) cannot run on one"
    )


def brief_from_messages(messages: Sequence[Message]) -> AgentBrief:
    """System turns and earlier user/assistant pairs (worked examples, rendered as the
    system prompt's "Worked examples" section) go to the instruction file; the last user
    message is the prompt."""
    if any(m.get("role") == "tool" or m.get("tool_calls") for m in messages):
        refuse_tools()
    system = [content_text(m.get("content")) for m in messages if m.get("role") == "system"]
    turns = [m for m in messages if m.get("role") != "system"]
    last = max((i for i, m in enumerate(turns) if m.get("role") == "user"), default=None)
    if last is None:
        raise InputError("the messages hold no user message for the agent to act on")
    demos: list[Demo] = []
    asked: list[str] = []
    for m in turns[:last]:
        text = content_text(m.get("content"))
        if m.get("role") == "user":
            asked.append(text)
        elif asked:  # a reply closes a worked example
            demos.append(Demo.of(f"example-{len(demos) + 1}", "\n".join(asked), text, "turns"))
            asked = []
    prompt = "\n\n".join([*asked, content_text(turns[last].get("content"))])
    parts = [s.strip() for s in system if s.strip()] + ([demo_section(demos)] if demos else [])
    return AgentBrief("\n\n".join(parts), prompt)


def write_instructions(workspace: Path, name: str, text: str) -> None:
    """The instruction file: our text first, then what the workspace's own file said (a
    repository's conventions stay in force). No text: the file is left as it is."""
    if not text.strip():
        return
    from selftaught.runs import atomic_write_text

    path = workspace / name
    existing = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    atomic_write_text(path, text.rstrip() + "\n" + (f"\n{existing}" if existing.strip() else ""))


def place_files(workspace: Path, instructions: str) -> str:
    """A skill package's files (the file blocks of its text, `selftaught.skill_package`)
    written under `.skill/` in the workspace, no symlink followed, executable only where the
    user's own package had them so; the instructions name them in the blocks' place."""
    from selftaught.runs import Inside
    from selftaught.skill_package import split_files

    text, files = split_files(instructions)
    if not files:
        return instructions
    with Inside(workspace) as inside:
        for f in files:
            inside.create(
                f"{SKILL_FILES}/{f.path}", f.text.encode("utf-8"), executable=f.executable
            )
    listing = ", ".join(f"`{SKILL_FILES}/{f.path}`" for f in files)
    where = (
        f"## The skill's files\nThe skill's files are in `{SKILL_FILES}/` of this folder: "
        f"{listing}. A path the skill names (`scripts/...`, `references/...`) is there."
    )
    return f"{text.rstrip()}\n\n{where}\n" if text.strip() else where + "\n"


# ---- environment and secrets ------------------------------------------------------------


def agent_environment(
    environ: Mapping[str, str], extra_names: Sequence[str] = ()
) -> dict[str, str]:
    """The part of `environ` an agent may see (see PASSED_NAMES / PASSED_PREFIXES)."""
    wanted = set(extra_names)
    return {
        k: v
        for k, v in environ.items()
        if k in PASSED_NAMES or k.startswith(PASSED_PREFIXES) or k in wanted
    }


def secret_values(env: Mapping[str, str], names: Sequence[str] = ()) -> list[str]:
    """Values to scrub from anything recorded: variables whose name says secret, and `names`."""
    values = {
        v
        for k, v in env.items()
        if (_SECRET_NAME.search(k) or k in names) and len(v) >= MIN_SECRET_CHARS
    }
    return sorted(values, key=len, reverse=True)  # a longer secret first: no partial leftovers


def scrub(value: Any, secrets: Sequence[str]) -> Any:
    """`value` (a string, or JSON-like lists and dicts) with each secret replaced."""
    if not secrets:
        return value
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, SCRUBBED)
        return value
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    if isinstance(value, dict):
        return {k: scrub(v, secrets) for k, v in value.items()}
    return value


# ---- one run's parsed outcome -----------------------------------------------------------


@dataclass
class AgentRun:
    """What a CLI run produced: the final message, the trajectory (OpenAI-shaped assistant
    turns with tool_calls, tool turns, the final answer), tokens and the CLI's own facts."""

    text: str
    trajectory: list[Message] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    tool_errors: int = 0
    info: dict[str, Any] = field(default_factory=dict)


class TrajectoryBuilder:
    """Collects an agent's steps as OpenAI-shaped turns: text said before a call rides on the
    assistant turn that makes the call; each result is a tool turn."""

    def __init__(self) -> None:
        self.turns: list[Message] = []
        self._text: list[str] = []
        self._calls: list[dict[str, Any]] = []
        self.tool_errors = 0

    def say(self, text: str) -> None:
        if text.strip():
            self._text.append(text)

    def call(self, call_id: str, name: str, arguments: str) -> None:
        self._calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )

    def result(self, call_id: str, content: str, *, error: bool = False) -> None:
        self._flush()
        self.turns.append({"role": "tool", "tool_call_id": call_id, "content": content})
        self.tool_errors += int(error)

    def _flush(self) -> None:
        if self._calls:
            text = "\n".join(self._text)
            self.turns.append({"role": "assistant", "content": text, "tool_calls": self._calls})
            self._text, self._calls = [], []

    def finish(self, answer: str) -> list[Message]:
        self._flush()
        return [*self.turns, {"role": "assistant", "content": answer}]


def status_error(backend: str, status: int | None, words: str) -> Exception:
    """A failed request the agent reported, in its words, classified like an API error:
    401/403, 404 and other 4xx stop the run; 408/409/425/429, 5xx and no status (a lost
    connection) are retried."""
    if status in (401, 403):
        return FatalBackendError(
            backend, f"HTTP {status}: the API key was refused ({words})", status=status
        )
    if status == 404:
        return FatalBackendError(
            backend, f"HTTP 404: model or endpoint not found ({words})", status=status
        )
    if status is not None and 400 <= status < 500 and status not in (408, 409, 425, 429):
        return FatalBackendError(backend, f"HTTP {status}: {words}", status=status)
    prefix = f"HTTP {status}: " if status is not None else ""
    return TransientBackendError(backend, prefix + words, status=status)


# ---- the model --------------------------------------------------------------------------


class CliAgent(AsyncChatModel):
    """One agent CLI behind the chat protocol. Subclasses say how to call it (`command`),
    where its config lives (`home_env`), and how to read its output (`parse`)."""

    kind = "agent"
    cli: CliInfo | None = None
    instruction_file = "AGENTS.md"

    def __init__(
        self,
        model: str = "",
        *,
        timeout_s: float = CALL_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        settings: AgentSettings | None = None,
    ):
        self.model = model
        self.name = f"{self.kind}:{model}" if model else self.kind
        self.backend = self.name
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self.settings = settings or AgentSettings.from_env()
        self.program: str | None = None
        self.version = ""
        self._install_lock = threading.Lock()
        self._slots: weakref.WeakKeyDictionary[Any, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    @property
    def fingerprint(self) -> str:
        return f"{self.name}@{self.version}" if self.version else self.name

    # -- installation --

    async def preflight(self) -> None:
        """Find the CLI and check its version, once (fatal, in one sentence, if either fails);
        with `SELFTAUGHT_AGENT_LOGIN`, that the user's login can be used."""
        if self.program is None:
            await asyncio.to_thread(self._check_installed)
            if self.settings.login:
                await asyncio.to_thread(self.user_login)

    def _check_installed(self) -> None:
        with self._install_lock:
            if self.program is not None:
                return
            found = self.settings.find(self.program_name())
            if found is None:
                raise AgentNotInstalled(self.backend, self.not_installed())
            if self.cli is not None:
                with _VERSIONS_LOCK:  # once per program per process
                    if found not in _VERSIONS:
                        _VERSIONS[found] = self._version(found)
                    self.version = _VERSIONS[found]
            self.program = found

    def program_name(self) -> str:
        assert self.cli is not None
        return self.cli.program

    def not_installed(self) -> str:
        assert self.cli is not None
        return (
            f"the {self.cli.title} CLI (`{self.cli.program}`) is not installed: not on PATH, "
            f"nor in ${CLIS_ENV}/node_modules/.bin, {self.settings.install_dir}/node_modules/"
            f".bin or ./node_modules/.bin; install it with "
            f"{self.cli.install_hint(self.settings.install_dir)}"
        )

    def _version(self, program: str) -> str:
        assert self.cli is not None
        with tempfile.TemporaryDirectory(prefix="selftaught-agent-version-") as home:
            env = {**agent_environment(os.environ, self.settings.pass_env), "HOME": home}
            try:
                done = subprocess.run(
                    [program, "--version"],
                    capture_output=True,
                    text=True,
                    env=env,
                    cwd=home,
                    timeout=VERSION_TIMEOUT_S,
                    stdin=subprocess.DEVNULL,
                )
            except (OSError, subprocess.TimeoutExpired) as err:
                raise AgentNotInstalled(
                    self.backend, f"`{program} --version` could not run ({err})"
                ) from None
        said = (done.stdout or done.stderr).strip()
        found = parse_version(said)
        if done.returncode != 0 or found is None:
            raise AgentNotInstalled(
                self.backend,
                f"`{program} --version` failed (exit {done.returncode}: {said[-300:]!r})",
            )
        pinned = parse_version(self.cli.version)
        assert pinned is not None
        if found < pinned:
            raise AgentOutdated(
                self.backend,
                f"{self.cli.title} {'.'.join(map(str, found))} at {program} is older than "
                f"{self.cli.version}, the oldest version selftaught supports; update it with "
                f"{self.cli.install_hint(self.settings.install_dir)}",
            )
        return ".".join(map(str, found))

    # -- one call --

    def _slot(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._slots.get(loop)
        if sem is None:
            sem = self._slots[loop] = asyncio.Semaphore(self.settings.concurrency)
        return sem

    async def achat(self, messages: list[Message], params: GenerationParams) -> Completion:
        """One agent run on the prompt (sampling settings and max_tokens do not reach a CLI:
        it chooses its own). Runs in the workspace the rollout handed over, else in a fresh
        one of its own (a copy of $SELFTAUGHT_AGENT_WORKSPACE, or empty)."""
        if params.tools:
            refuse_tools()
        brief = brief_from_messages(messages)
        await self.preflight()
        async with self._slot():
            handed = current_workspace()
            workspace = (
                handed
                if handed is not None
                else await asyncio.to_thread(Workspace.create, self.settings.workspace)
            )
            try:
                return await self._with_retries(brief, workspace)
            finally:
                if handed is None:
                    await asyncio.to_thread(workspace.remove)

    async def _with_retries(self, brief: AgentBrief, workspace: Workspace) -> Completion:
        attempts = 0

        async def attempt() -> Completion:
            nonlocal attempts
            if attempts:  # a retry starts from the workspace as it was handed over
                await asyncio.to_thread(workspace.reset)
            attempts += 1
            return await self._run(brief, workspace.path)

        completion, retries = await with_retries(attempt, self.retry)
        completion.retries = retries
        return completion

    async def _run(self, brief: AgentBrief, workspace: Path) -> Completion:
        instructions = await asyncio.to_thread(place_files, workspace, brief.instructions)
        await asyncio.to_thread(write_instructions, workspace, self.instruction_file, instructions)
        before = await asyncio.to_thread(snapshot, workspace)
        home = await asyncio.to_thread(self._make_home)
        try:
            env = self._environment(home)
            secrets = secret_values(env, self.secret_names(home))
            if self.settings.login:  # the user's own sign-in, opted in: access token only
                login = await asyncio.to_thread(self._place_login, home)
                secrets = sorted({*secrets, *login}, key=len, reverse=True)
            argv, stdin_text = self.command(brief, workspace)
            try:
                result = await run_process(
                    argv,
                    cwd=workspace,
                    env=env,
                    stdin_text=stdin_text,
                    timeout_s=self.timeout_s,
                    watch=self.watch,
                )
            except OSError as err:  # the program went away, or may not be run
                raise FatalBackendError(
                    self.backend, f"could not start {argv[0]}: {err.strerror or err}"
                ) from None
        finally:
            await asyncio.to_thread(shutil.rmtree, home, True)
        if result.timed_out:
            raise TransientBackendError(
                self.backend, f"the agent timed out after {self.timeout_s:g}s (process killed)"
            )
        try:
            run = self.parse(result)
        except (FatalBackendError, TransientBackendError) as err:
            err.cause = scrub(err.cause, secrets)
            err.args = (scrub(str(err), secrets),)
            raise
        after = await asyncio.to_thread(snapshot, workspace)
        return self._completion(run, result, changes(before, after), secrets)

    def _completion(
        self, run: AgentRun, result: ProcessResult, changed: list[str], secrets: list[str]
    ) -> Completion:
        from selftaught.redact import default_redactor

        trajectory, _ = default_redactor().redact_value(scrub(run.trajectory, secrets))
        agent = {
            "cli": self.kind,
            "version": self.version,
            "seconds": round(result.seconds, 3),
            "files_changed": scrub(changed, secrets),
            "tool_calls": sum(len(t.get("tool_calls") or []) for t in run.trajectory),
            "tool_errors": run.tool_errors,
            **scrub(run.info, secrets),
        }
        extra: dict[str, Any] = {"agent": agent}
        if run.trajectory:
            extra["trajectory"] = trajectory
        return Completion(
            text=scrub(run.text, secrets),
            prompt_tokens=run.prompt_tokens,
            completion_tokens=run.completion_tokens,
            latency_s=result.seconds,
            finish_reason=run.finish_reason,
            model=self.name,
            extra=extra,
        )

    def _make_home(self) -> Path:
        root = self.settings.homes_dir
        root.mkdir(parents=True, exist_ok=True)
        home = Path(tempfile.mkdtemp(prefix=f"{self.kind}-", dir=root))
        for sub in (".config", ".cache", ".local/share", ".local/state"):
            (home / sub).mkdir(parents=True)
        return home

    def _place_login(self, home: Path) -> list[str]:
        """The user's login in the run's CLI config folder; its values, to scrub."""
        from selftaught.models.agents.login import place_login

        login = self.user_login()
        if login is None:
            return []
        place_login(login, self.login_dir(home))
        return [s for s in login.secrets if len(s) >= MIN_SECRET_CHARS]

    def _environment(self, home: Path) -> dict[str, str]:
        env = agent_environment(os.environ, (*self.settings.pass_env, *self.secret_names(home)))
        env.update(
            HOME=str(home),
            XDG_CONFIG_HOME=str(home / ".config"),
            XDG_CACHE_HOME=str(home / ".cache"),
            XDG_DATA_HOME=str(home / ".local/share"),
            XDG_STATE_HOME=str(home / ".local/state"),
        )
        env.update(self.home_env(home, env))
        return env

    # -- what each agent says --

    def command(self, brief: AgentBrief, workspace: Path) -> tuple[list[str], str | None]:
        """argv, and the text for its stdin (None: no stdin)."""
        raise NotImplementedError

    def home_env(self, home: Path, env: Mapping[str, str]) -> dict[str, str]:
        """Variables that point the CLI at its config inside `home` (copying the user's)."""
        return {}

    def secret_names(self, home: Path) -> tuple[str, ...]:
        """Variables holding the agent's key whose names do not say so (a Codex provider's
        `env_key`): passed to it, and scrubbed like any secret."""
        return ()

    def watch(self, line: str) -> str | None:
        """Reason to stop the CLI at once on this stdout line (a refused key it would retry)."""
        return None

    def user_login(self) -> Login | None:
        """The user's own CLI login, read where the CLI keeps it, for `SELFTAUGHT_AGENT_LOGIN`
        (None: this agent has none to copy); AgentLoginError when it cannot be used."""
        return None

    def login_dir(self, home: Path) -> Path:
        """Where the CLI reads its login inside a run's `home`."""
        return home

    def parse(self, result: ProcessResult) -> AgentRun:
        raise NotImplementedError


def json_events(lines: Sequence[str]) -> list[dict[str, Any]]:
    """The JSON objects among a CLI's output lines (other lines skipped)."""
    out = []
    for line in lines:
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def copy_user_file(source: Path, target: Path) -> None:
    """Copy the user's CLI config file into a run's home, when there is one."""
    if source.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            shutil.copyfile(source, target)
