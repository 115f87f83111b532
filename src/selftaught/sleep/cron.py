"""Nightly runs from the user's crontab, through the `crontab` command.

`schedule("03:17", args)` adds (or replaces) one line per project, marked so it can be found
again:

    17 3 * * * cd /work && SELFTAUGHT_HOME=... /usr/bin/python3 -m selftaught sleep run \
        --project demo ... >> <home>/cron.log 2>&1 # selftaught-sleep project=demo

Only `SELFTAUGHT_*` and `PYTHONPATH` are carried into the line: never an API key (cron does not
see your shell's environment; put a remote model's key in the crontab yourself if you must).
With `SELFTAUGHT_AGENT_LOGIN` set, so are the agent CLIs' folder and their config folders
(`CLAUDE_CONFIG_DIR`, `CODEX_HOME`): a night's agents then sign in with your own login. A
`$SELFTAUGHT_LOG` URL with a password is carried as a read of `<home>/hook-log-url` (0600).
Without a `crontab` command the functions raise `ScheduleError` saying what to do instead.

A crontab is one command per line and cron turns `%` into a newline, so a value holding a
newline, a carriage return or `%` (the project, an option such as `--preferences`, the folder,
a carried variable) is refused: quoting cannot keep it on its line. Multi-line preferences go in
a file (`--preferences FILE`). The line runs under `umask 077`, so cron.log is private too.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from selftaught.errors import InputError, MissingDependency, RunError
from selftaught.sleep.paths import check_project

MARK = "# selftaught-sleep"
ALL_PROJECTS = "*"
_AT = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")
_LINE = re.compile(rf"^(\d+) (\d+) \* \* \* (.*) {re.escape(MARK)} project=(\S+)$")
CARRIED_ENV = ("SELFTAUGHT_HOME", "SELFTAUGHT_LOG", "SELFTAUGHT_CACHE", "PYTHONPATH")
# a night whose agents use the user's own CLI login (`SELFTAUGHT_AGENT_LOGIN`) needs no key in
# the crontab: the opt-in, where the CLIs are and where their logins are (paths, no secret)
AGENT_ENV = ("SELFTAUGHT_AGENT_LOGIN", "SELFTAUGHT_AGENT_CLIS", "CLAUDE_CONFIG_DIR", "CODEX_HOME")


class ScheduleError(RunError):
    """The schedule cannot be read or written; the message says why and what to do."""


class NoCrontab(ScheduleError, MissingDependency):
    """There is no `crontab` command here."""

    exit_code = MissingDependency.exit_code


@dataclass(frozen=True)
class Entry:
    project: str  # ALL_PROJECTS for every project
    hour: int
    minute: int
    command: str

    def next_run(self, now: dt.datetime | None = None) -> dt.datetime:
        now = now or dt.datetime.now()
        run = now.replace(hour=self.hour, minute=self.minute, second=0, microsecond=0)
        return run if run > now else run + dt.timedelta(days=1)


def parse_at(at: str) -> tuple[int, int]:
    m = _AT.match(at.strip())
    if m is None:
        raise InputError(f"--at must be HH:MM in 24-hour time (e.g. 03:17), got {at!r}")
    return int(m.group(1)), int(m.group(2))


def _crontab() -> str:
    path = shutil.which("crontab")
    if path is None:
        raise NoCrontab(
            "no `crontab` command on this machine: install cron (e.g. `apt-get install cron`) "
            "or run `selftaught sleep run` from your own scheduler (systemd timer, launchd, ...)"
        )
    return path


def read_crontab() -> str:
    proc = subprocess.run([_crontab(), "-l"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        if "no crontab" in (proc.stderr + proc.stdout).lower():
            return ""
        raise ScheduleError(f"`crontab -l` failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def _write_crontab(text: str) -> None:
    proc = subprocess.run(
        [_crontab(), "-"], input=text, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise ScheduleError(f"`crontab -` failed: {(proc.stderr or proc.stdout).strip()}")


def entries(text: str | None = None) -> list[Entry]:
    """The selftaught lines of the crontab."""
    found = []
    for line in (read_crontab() if text is None else text).splitlines():
        m = _LINE.match(line.strip())
        if m:
            found.append(Entry(m.group(4), int(m.group(2)), int(m.group(1)), m.group(3)))
    return found


_LINE_BREAKERS = ("\n", "\r", "%")


def check_cron_value(value: str, what: str) -> str:
    """`value` when it can stay on one crontab line; else an `InputError` naming `what`."""
    bad = [c for c in _LINE_BREAKERS if c in value]
    if bad:
        shown = ", ".join({"\n": "a newline", "\r": "a carriage return"}.get(c, "%") for c in bad)
        raise InputError(
            f"{what} holds {shown}, which would break the crontab line ({value!r:.60}); "
            "put multi-line text in a file and pass its path"
        )
    return value


def command_line(run_args: list[str], home: Path) -> str:
    names = CARRIED_ENV + (AGENT_ENV if os.environ.get("SELFTAUGHT_AGENT_LOGIN") else ())
    carried = {n: os.environ[n] for n in names if os.environ.get(n)}
    for arg in run_args:
        check_cron_value(arg, "an option of `sleep run`")
    cwd, log_path = check_cron_value(os.getcwd(), "the folder"), str(home / "cron.log")
    check_cron_value(log_path, "the sleep home")
    env = " ".join(_carried(name, value, home) for name, value in carried.items())
    run = shlex.join([sys.executable, "-m", "selftaught", "sleep", "run", *run_args])
    log = shlex.quote(log_path)
    # umask 077: cron.log holds the night's output and is created by this line, not by us
    return f"umask 077 && cd {shlex.quote(cwd)} && {env + ' ' if env else ''}{run} >> {log} 2>&1"


def _carried(name: str, value: str, home: Path) -> str:
    """`NAME=value` for the crontab line; a log URL with a password is read from a 0600 file
    at run time instead (a crontab is listed, copied and backed up)."""
    from selftaught.sleep.intake.hook_install import stash_log_url
    from selftaught.sleep.store import is_url, url_password

    if name == "SELFTAUGHT_LOG" and is_url(value) and url_password(value):
        path = str(stash_log_url(value, home).resolve())
        return f'{name}="$(cat {shlex.quote(check_cron_value(path, "the sleep home"))})"'
    return f"{name}={shlex.quote(check_cron_value(value, f'${name}'))}"


def schedule(at: str, project: str | None, run_args: list[str], home: Path) -> Entry:
    """Add or replace the project's nightly line; returns it."""
    hour, minute = parse_at(at)
    if project is not None:
        check_project(project)
    key = project or ALL_PROJECTS
    # --scheduled: a project whose schedule `--patience` paused is skipped (`sleep/pause.py`)
    args = ([] if project is None else ["--project", project]) + list(run_args) + ["--scheduled"]
    entry = Entry(key, hour, minute, command_line(args, home))
    kept = [ln for ln in read_crontab().splitlines() if not _is_ours(ln, key)]
    line = f"{minute} {hour} * * * {entry.command} {MARK} project={key}"
    _write_crontab("\n".join([*kept, line]) + "\n")
    return entry


def unschedule(project: str | None, every: bool = False) -> int:
    """Remove the project's line (every selftaught line with `every`); returns how many."""
    if project is not None:
        check_project(project)
    lines = read_crontab().splitlines()
    kept = [
        ln
        for ln in lines
        if not (_is_ours(ln, None) if every else _is_ours(ln, project or ALL_PROJECTS))
    ]
    if len(kept) != len(lines):
        _write_crontab("\n".join(kept) + "\n" if kept else "")
    return len(lines) - len(kept)


def _is_ours(line: str, project: str | None) -> bool:
    m = _LINE.match(line.strip())
    return m is not None and (project is None or m.group(4) == project)
