"""Install, remove and show the session-end hooks that harvest an agent's session at once.

    claude-code  ~/.claude/settings.json ($CLAUDE_CONFIG_DIR/settings.json when set), or the
                 project's .claude/settings.json (`scope="project"`): one `SessionEnd` command
                 hook, {"hooks": {"SessionEnd": [{"hooks": [{"type": "command", ...}]}]}}, and
                 the same command as a `SessionStart` hook (it records the repository's
                 commit and uncommitted changes, `repo_state.py`)
    codex        $CODEX_HOME/config.toml (~/.codex): the top-level `notify` program, run after
                 every finished turn. Codex 0.169 also has a `SessionEnd` hook, but a hook
                 runs only once the user has reviewed and trusted it in Codex's /hooks, and
                 Codex gives it a few seconds; `notify` runs as configured and harvests each
                 turn as it ends (harvesting is idempotent).

Our entry is the one whose command runs `selftaught.sleep.intake.hooks` (`HOOK_MODULE`).
Installing replaces it (twice leaves one entry), uninstalling removes only it, and every other
setting is kept: the JSON is parsed and rewritten, the TOML is edited as text (one line added
or removed) and checked by parsing it again. The first install backs the file up once beside
it (`<file>.selftaught-backup`); an uninstall that leaves the settings as they were in the
backup puts the backup's bytes back. Writes are atomic; a symlinked settings file is written
through (the link stays). Codex's single `notify` is never taken from another program.

The command carries where the hook writes: a log file's absolute path, a postgresql:// URL as
a URL, and a URL with a password never (other programs read an agent's settings): that URL
goes to `<home>/hook-log-url` (0600) and the command names the file (`--log-from`).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from selftaught.errors import ConfigError, InputError, read_text, writing_to
from selftaught.runs import atomic_write_text
from selftaught.sleep.intake.hooks import AGENTS, HOOK_MODULE, check_agent
from selftaught.sleep.paths import ENV_HOME, ENV_LOG, check_project, private_home, sleep_home
from selftaught.sleep.store import is_url, url_password

Scope = Literal["user", "project"]
BACKUP_SUFFIX = ".selftaught-backup"
CLAUDE_EVENT = "SessionEnd"
CLAUDE_START_EVENT = "SessionStart"  # records the repository's state (`repo_state.py`)
CLAUDE_EVENTS = (CLAUDE_EVENT, CLAUDE_START_EVENT)
CLAUDE_TIMEOUT_S = 30  # Claude Code gives a SessionEnd hook 1.5 s unless it asks for more
LOG_URL_FILE = "hook-log-url"  # in the sleep home, 0600: a log URL that holds a password


@dataclass
class HookState:
    """One agent's hook as a settings file has it."""

    agent: str
    scope: str
    path: Path
    installed: bool
    command: str | None = None  # our entry's command, as written
    other: str | None = None  # Codex: another program holds `notify`
    backup: Path | None = None
    runnable: bool | None = None  # the Python our command names still exists
    records_start: bool | None = None  # Claude Code: our SessionStart hook is there too

    def describe(self) -> str:
        if not self.installed:
            held = f" (notify is another program's: {self.other})" if self.other else ""
            return f"{self.agent} ({self.scope}): not installed in {self.path}{held}"
        broken = "" if self.runnable else " — its Python is gone: install it again"
        if self.records_start is False:
            broken += (
                f" — no {CLAUDE_START_EVENT} hook (the workspace is not recorded): install again"
            )
        return f"{self.agent} ({self.scope}): installed in {self.path}{broken}\n  {self.command}"


@dataclass
class Change:
    path: Path
    changed: bool
    backup: Path | None = None
    restored: bool = False  # uninstall put the backed-up original back


# ---- where ---------------------------------------------------------------------------------


def settings_path(agent: str, scope: Scope = "user", folder: Path | None = None) -> Path:
    check_agent(agent)
    if scope not in ("user", "project"):
        raise ConfigError(f"unknown scope {scope!r}; valid: user, project")
    if agent == "codex":
        if scope == "project":
            raise ConfigError("codex takes --scope user only (its notify lives in CODEX_HOME)")
        base = os.environ.get("CODEX_HOME")
        return (Path(base).expanduser() if base else Path.home() / ".codex") / "config.toml"
    if scope == "project":
        return (folder or Path.cwd()) / ".claude" / "settings.json"
    base = os.environ.get("CLAUDE_CONFIG_DIR")
    return (Path(base).expanduser() if base else Path.home() / ".claude") / "settings.json"


def hook_argv(
    agent: str,
    project: str | None = None,
    log: str | Path | None = None,
    folder: Path | None = None,
) -> list[str]:
    """The command the hook runs: this Python, the light hook module, and where to write
    (the log and home this shell uses, when set, so the hook writes where the CLI reads).
    A project-scope hook names its `folder`: it harvests only sessions that ran there."""
    argv = [sys.executable, "-m", HOOK_MODULE, check_agent(agent)]
    if project:
        argv += ["--project", check_project(project)]
    if folder is not None:
        argv += ["--folder", str(Path(folder).expanduser().resolve())]
    argv += _log_argv(log if log is not None else os.environ.get(ENV_LOG) or None)
    if os.environ.get(ENV_HOME):
        argv += ["--home", str(Path(os.environ[ENV_HOME]).expanduser().resolve())]
    return argv


def _log_argv(log: str | Path | None) -> list[str]:
    """Where the hook writes. A file log: its absolute path. A postgresql:// URL stays a URL;
    one with a password is never written into an agent's settings (other programs read
    them, dotfiles repositories publish them): it goes to <home>/hook-log-url (0600) and the
    command names that file."""
    if log is None or (isinstance(log, str) and not log.strip()):
        return []
    if not is_url(log):
        return ["--log", str(Path(log).expanduser().resolve())]
    url = str(log).strip()
    if not url_password(url):
        return ["--log", url]
    return ["--log-from", str(stash_log_url(url).resolve())]


def stash_log_url(url: str, home: Path | None = None) -> Path:
    """`<home>/hook-log-url` (0600) holding `url`: where a command line that others may read
    (an agent's settings, a crontab) names a log URL with a password instead of spelling it."""
    home = home or sleep_home()
    private_home(home)
    path = home / LOG_URL_FILE
    with writing_to(path, "the log URL"):
        atomic_write_text(path, url + "\n")
        os.chmod(path, 0o600)  # a file that was there keeps its mode otherwise
    return path


def _ours(command: Any) -> bool:
    text = " ".join(command) if isinstance(command, list) else str(command or "")
    return HOOK_MODULE in text


def _runnable(command: str | list[str]) -> bool:
    first = command[0] if isinstance(command, list) else (shlex.split(command) or [""])[0]
    return Path(first).is_file() and os.access(first, os.X_OK)


# ---- files ---------------------------------------------------------------------------------


def _target(path: Path) -> Path:
    """Write through a symlinked settings file (a dotfiles link stays a link)."""
    return path.resolve() if path.is_symlink() else path


def _backup_once(path: Path) -> Path | None:
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    if path.exists() and not backup.exists():
        with writing_to(backup, "the backup"):
            shutil.copy2(path, backup)
    return _existing_backup(path)


def _existing_backup(path: Path) -> Path | None:
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    return backup if backup.exists() else None


def _write(path: Path, text: str, what: str) -> None:
    with writing_to(path, what):
        atomic_write_text(_target(path), text)


# ---- Claude Code: settings.json --------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    text = read_text(path, "Claude Code settings")
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError as err:
        raise InputError(f"Claude Code settings {path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise InputError(f"Claude Code settings {path} is not a JSON object")
    return data


def _claude_groups(settings: dict[str, Any], path: Path, event: str = CLAUDE_EVENT) -> list[Any]:
    hooks = settings.get("hooks", {})
    if not isinstance(hooks, dict):
        raise InputError(f"{path}: 'hooks' is not an object; fix it by hand first")
    groups = hooks.get(event, [])
    if not isinstance(groups, list):
        raise InputError(f"{path}: 'hooks.{event}' is not a list; fix it by hand first")
    return groups


def _claude_without_ours(settings: dict[str, Any], path: Path) -> tuple[dict[str, Any], int]:
    """The settings less our handlers, of every event we install (a group or event left
    empty by that goes too)."""
    out, removed = settings, 0
    for event in CLAUDE_EVENTS:
        out, n = _claude_event_without_ours(out, path, event)
        removed += n
    return out, removed


def _claude_event_without_ours(
    settings: dict[str, Any], path: Path, event: str
) -> tuple[dict[str, Any], int]:
    groups = _claude_groups(settings, path, event)
    kept, removed = [], 0
    for group in groups:
        handlers = group.get("hooks") if isinstance(group, dict) else None
        if not isinstance(handlers, list):
            kept.append(group)
            continue
        mine = [h for h in handlers if isinstance(h, dict) and _ours(h.get("command"))]
        removed += len(mine)
        rest = [h for h in handlers if h not in mine]
        if rest or not mine:
            kept.append({**group, "hooks": rest})
    if not removed:
        return settings, 0
    out = dict(settings)
    hooks = {k: v for k, v in settings["hooks"].items() if k != event}
    if kept:
        hooks[event] = kept
    if hooks:
        out["hooks"] = hooks
    else:
        out.pop("hooks")
    return out, removed


def _claude_ours(settings: dict[str, Any], path: Path, event: str = CLAUDE_EVENT) -> str | None:
    for group in _claude_groups(settings, path, event):
        for h in (group.get("hooks") or []) if isinstance(group, dict) else []:
            if isinstance(h, dict) and _ours(h.get("command")):
                return str(h["command"])
    return None


def _claude_install(path: Path, argv: list[str]) -> Change:
    settings = _read_json(path)
    entry = {"type": "command", "command": shlex.join(argv), "timeout": CLAUDE_TIMEOUT_S}
    base, _ = _claude_without_ours(settings, path)
    hooks = dict(base.get("hooks") or {})
    for event in CLAUDE_EVENTS:
        hooks[event] = [*_claude_groups(base, path, event), {"hooks": [entry]}]
    new = {**base, "hooks": hooks}
    if new == settings:
        return Change(path, changed=False, backup=_existing_backup(path))
    backup = _backup_once(path)
    _write(path, json.dumps(new, indent=2, ensure_ascii=False) + "\n", "Claude Code settings")
    return Change(path, changed=True, backup=backup)


def _claude_uninstall(path: Path) -> Change:
    settings = _read_json(path)
    new, removed = _claude_without_ours(settings, path)
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    if not removed:
        return Change(path, changed=False, backup=_existing_backup(path))
    if backup.exists() and _read_json(backup) == new:
        _write(path, read_text(backup, "the backup"), "Claude Code settings")
        return Change(path, changed=True, backup=backup, restored=True)
    if not new and not backup.exists():  # we created the file: leave none
        _target(path).unlink()
        return Change(path, changed=True, restored=True)
    _write(path, json.dumps(new, indent=2, ensure_ascii=False) + "\n", "Claude Code settings")
    return Change(path, changed=True, backup=_existing_backup(path))


# ---- Codex: config.toml ----------------------------------------------------------------------


def _toml_loads(text: str, path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the `tomli` dependency on Python 3.10
        import tomli as tomllib
    try:
        data: dict[str, Any] = tomllib.loads(text)
        return data
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"Codex config {path} is not valid TOML ({err})") from None


def _notify_line(argv: list[str]) -> str:
    # a JSON string is a TOML basic string (ASCII, with \\, \" and \uXXXX escapes)
    return f"notify = [{', '.join(json.dumps(a) for a in argv)}]  # selftaught sleep hook\n"


def _notify_lines(text: str) -> list[int]:
    """Indexes of top-level `notify = ...` lines before the first table (ours is one line)."""
    found = []
    for i, line in enumerate(text.splitlines(keepends=True)):
        stripped = line.strip()
        if stripped.startswith("["):
            break  # a table header (or an array's inner line: `_checked` catches a miss)
        if stripped.startswith("notify") and stripped[6:].lstrip().startswith("="):
            found.append(i)
    return found


def _checked(path: Path, before: dict[str, Any], text: str, notify: Any) -> str:
    """`text` parses to `before` with only `notify` changed, else nothing is written."""
    after = _toml_loads(text, path)
    expected = {k: v for k, v in before.items() if k != "notify"}
    if notify is not None:
        expected["notify"] = notify
    if after != expected:
        raise InputError(f"could not edit {path} safely (its layout is unusual): edit it by hand")
    return text


def _codex_state(path: Path) -> tuple[str, dict[str, Any]]:
    text = read_text(path, "Codex config") if path.exists() else ""
    return text, _toml_loads(text, path)


def _codex_install(path: Path, argv: list[str]) -> Change:
    text, config = _codex_state(path)
    current = config.get("notify")
    if current == argv:
        return Change(path, changed=False, backup=_existing_backup(path))
    if current is not None and not _ours(current):
        raise InputError(
            f"{path} already runs another notify program ({current!r}) and Codex runs only "
            f"one: remove it, or call `{shlex.join(argv)} <json>` from that program"
        )
    lines = text.splitlines(keepends=True)
    if current is not None:
        at = _notify_lines(text)
        if len(at) != 1:
            raise InputError(f"{path}: our notify spans several lines; edit it by hand")
        lines[at[0]] = _notify_line(argv)
    else:
        lines.insert(0, _notify_line(argv))  # top-level keys may always come first
    new = _checked(path, config, "".join(lines), argv)
    backup = _backup_once(path)
    _write(path, new, "Codex config")
    return Change(path, changed=True, backup=backup)


def _codex_uninstall(path: Path) -> Change:
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    text, config = _codex_state(path)
    if not _ours(config.get("notify")):
        return Change(path, changed=False, backup=_existing_backup(path))
    at = _notify_lines(text)
    if len(at) != 1:
        raise InputError(f"{path}: our notify spans several lines; edit it by hand")
    lines = text.splitlines(keepends=True)
    del lines[at[0]]
    new = _checked(path, config, "".join(lines), None)
    if backup.exists() and read_text(backup, "the backup") == new:
        restored = True
    elif not new.strip() and not backup.exists():  # we created the file: leave none
        _target(path).unlink()
        return Change(path, changed=True, restored=True)
    else:
        restored = False
    _write(path, new, "Codex config")
    return Change(path, changed=True, backup=_existing_backup(path), restored=restored)


# ---- the API the CLI wires -------------------------------------------------------------------


def install(
    agent: str,
    *,
    scope: Scope = "user",
    project: str | None = None,
    log: str | Path | None = None,
    folder: Path | None = None,
) -> Change:
    """Register (or re-register) the agent's session-end hook; idempotent."""
    path = settings_path(agent, scope, folder)
    argv = hook_argv(agent, project, log, (folder or Path.cwd()) if scope == "project" else None)
    return _codex_install(path, argv) if agent == "codex" else _claude_install(path, argv)


def uninstall(agent: str, *, scope: Scope = "user", folder: Path | None = None) -> Change:
    """Remove our hook (only ours); restores the backed-up file when nothing else changed."""
    path = settings_path(agent, scope, folder)
    return _codex_uninstall(path) if agent == "codex" else _claude_uninstall(path)


def state(agent: str, scope: Scope = "user", folder: Path | None = None) -> HookState:
    path = settings_path(agent, scope, folder)
    found = HookState(agent, scope, path, False, backup=_existing_backup(path))
    if agent == "codex":
        notify = _codex_state(path)[1].get("notify")
        if _ours(notify):  # a list as we write it; a string if someone edited it to one
            command = shlex.join(notify) if isinstance(notify, list) else str(notify)
            found.installed, found.command = True, command
        elif notify is not None:
            found.other = repr(notify)
    else:
        settings = _read_json(path)
        found.command = _claude_ours(settings, path)
        found.installed = found.command is not None
        found.records_start = _claude_ours(settings, path, CLAUDE_START_EVENT) is not None
    if found.command:
        found.runnable = _runnable(found.command)
    return found


def states(folder: Path | None = None) -> list[HookState]:
    """Every place a hook can be installed: each agent's user file, Claude Code's project."""
    scopes: list[tuple[str, Scope]] = [(a, "user") for a in AGENTS] + [("claude-code", "project")]
    return [state(agent, scope, folder) for agent, scope in scopes]


def last_runs(count: int = 5) -> list[str]:
    """The newest lines of <home>/hooks.log: what the hook did (or why it failed)."""
    from selftaught.sleep.intake.hooks import HOOK_LOG
    from selftaught.sleep.paths import sleep_home

    path = sleep_home() / HOOK_LOG
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return ["none yet (no hooks.log)"]
    return lines[-count:]
