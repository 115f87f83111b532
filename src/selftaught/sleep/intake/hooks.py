"""Harvest one agent session the moment it ends: what a coding agent's session-end hook runs.

`selftaught sleep hook install` (`hook_install.py`) registers this module as a hook:

    claude-code   a `SessionEnd` command hook; Claude Code writes the hook's JSON on stdin:
                  {"session_id", "transcript_path", "cwd", "hook_event_name", "reason"}
                  (and a `SessionStart` one: the same fields, `source` for `reason`)
    codex         the `notify` program of config.toml; Codex appends one JSON argument after
                  each finished turn: {"type": "agent-turn-complete", "thread-id", "turn-id",
                  "cwd", "input-messages", "last-assistant-message"} (the thread id is the
                  session id in the rollout file's name)

and it runs as `python -m selftaught.sleep.intake.hooks AGENT [--project P] [--log L]
[--home H] [PAYLOAD]`. It imports only the harvesters and the log (no CLI, ~0.3 s), reads
that one session's transcript and stores its turns (idempotent: a turn already stored is
skipped), and it never fails the agent: it exits 0 whatever happens and writes one line per
run, an error included, to `<home>/hooks.log`.

The same command records the repository the session works in (`record_workspace`,
`repo_state.py`: its commit and uncommitted changes, for a night's workspace tasks): Claude
Code's `SessionStart` hook (installed beside `SessionEnd`) records the start, its `SessionEnd`
the end; Codex has no session-start hook, so its first `notify` records the start (after the
first turn: changes made in that turn are already in it) and every `notify` the end. A folder
that is not a git repository is noted and skipped.

`harvest_session` is also what the MCP server (`selftaught.mcp_server`) calls to bring a live
session into the log before attaching feedback to it; there the turn still running (the one
calling the tool) is left out, so it is not stored half-done (a stored turn is never updated).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from selftaught.errors import InputError
from selftaught.sleep.intake.harvest import HarvestConfig, HarvestReport, harvesters
from selftaught.sleep.intake.log import Interaction, LogFilter, TaskLog
from selftaught.sleep.paths import ENV_HOME, sleep_home

AGENTS = ("claude-code", "codex")
HOOK_MODULE = "selftaught.sleep.intake.hooks"
HOOK_LOG = "hooks.log"
HOOK_LOG_MAX_BYTES = 1 << 20  # then it is renamed to hooks.log.1 (one old copy kept)
CODEX_SETTLE_S = 5.0  # Codex calls notify before its rollout file has the turn's end
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_agent(agent: str) -> str:
    if agent not in AGENTS:
        raise InputError(f"unknown agent {agent!r}; valid: {', '.join(AGENTS)}")
    return agent


def check_session_id(session_id: str) -> str:
    """A session id names a file: letters, digits, '.', '_', '-' only (no path, no glob)."""
    if not isinstance(session_id, str) or not _SESSION_ID.match(session_id):
        raise InputError(
            f"invalid session id {session_id!r}: letters, digits, '.', '_' or '-' only"
        )
    return session_id


# ---- one session ---------------------------------------------------------------------------


@dataclass
class SessionHarvest:
    """What harvesting one session did."""

    agent: str
    session_id: str | None
    transcript: str
    found: int = 0  # turns in the transcript (less the one still running, when left out)
    inserted: int = 0  # new rows; the rest were stored before
    left_open: bool = False  # the last turn was still running and was not stored
    malformed: list[str] = field(default_factory=list)


def find_transcript(agent: str, session_id: str, root: Path | None = None) -> Path | None:
    """The transcript file of a session, by its id, under the agent's folder (or `root`)."""
    harvester = harvesters()[check_agent(agent)]
    root = Path(root).expanduser() if root else harvester.default_root()
    sid = check_session_id(session_id)
    if agent == "claude-code":
        found = [p for p in root.glob(f"*/{sid}.jsonl") if p.is_file()]
    else:
        found = [
            p
            for sub in ("sessions", "archived_sessions")
            for p in (root / sub).rglob(f"rollout-*-{sid}.jsonl")
            if p.is_file()
        ]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def harvest_session(
    agent: str,
    log: TaskLog,
    *,
    session_id: str | None = None,
    transcript: str | Path | None = None,
    project: str | None = None,
    root: Path | None = None,
    leave_open_turn: bool = False,
) -> SessionHarvest:
    """Store one session's turns: its transcript file, else the file found by session id.
    `leave_open_turn` leaves out a last turn that has no answer yet (the session is live)."""
    path = Path(transcript).expanduser() if transcript else None
    if path is None:
        if not session_id:
            raise InputError("give a session id or a transcript path")
        path = find_transcript(agent, session_id, root)
        if path is None:
            raise InputError(f"no {agent} transcript for session {session_id!r}")
    if not path.is_file():
        raise InputError(f"the {agent} transcript {path} does not exist")
    config = HarvestConfig(project=project)
    report = HarvestReport(agent, str(path.parent))
    rows = harvesters()[check_agent(agent)].read_session(path, config, report)
    result = SessionHarvest(agent, session_id, str(path), malformed=report.malformed)
    if leave_open_turn and rows and not rows[-1].meta.get("answered"):
        rows, result.left_open = rows[:-1], True
    rows = rows[-config.max_tasks :]
    if rows:
        result.session_id = rows[-1].session_id
    result.found = len(rows)
    result.inserted = log.add_many(rows)
    return result


def last_answered_turn(log: TaskLog, session_id: str) -> Interaction | None:
    """The newest turn of a session (any project) with an answer, else its newest turn;
    failed calls and shadow answers are never a turn."""
    turns = [it for it in log.query(LogFilter(session_id=session_id)) if it.is_task]
    answered = [it for it in turns if it.reply]
    return (answered or turns or [None])[0]


# ---- the hook ------------------------------------------------------------------------------


def payload_session(agent: str, payload: dict[str, Any]) -> tuple[str | None, str | None]:
    """(session id, transcript path) from the JSON an agent hands its hook: Claude Code's
    and Codex's hook input (`session_id`, `transcript_path`), Codex's notify (`thread-id`)."""
    sid = payload.get("session_id") or payload.get("thread-id") or payload.get("thread_id")
    transcript = payload.get("transcript_path")
    return (
        str(sid) if sid else None,
        str(transcript) if isinstance(transcript, str) and transcript else None,
    )


def wait_for_turn(path: Path, turn_id: str, timeout_s: float = CODEX_SETTLE_S) -> bool:
    """Wait until a Codex rollout records the end of `turn_id` (its `task_complete`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if any("task_complete" in line and turn_id in line for line in f):
                    return True
        except FileNotFoundError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _read_payload(agent: str, argument: str | None, stdin: TextIO) -> dict[str, Any]:
    """Claude Code writes the JSON on stdin; Codex's notify passes it as the last argument."""
    text = argument if argument is not None else ("" if stdin.isatty() else stdin.read())
    if not text.strip():
        raise InputError(f"the {agent} hook got no JSON (stdin or argument)")
    try:
        payload = json.loads(text)
    except ValueError:
        raise InputError(f"the {agent} hook's input is not JSON: {text[:80]!r}") from None
    if not isinstance(payload, dict):
        raise InputError(f"the {agent} hook's input is not a JSON object")
    return payload


def note(line: str, home: Path | None = None) -> None:
    """Append one line to <home>/hooks.log (0600); never raises."""
    try:
        folder = home or sleep_home()
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / HOOK_LOG
        if path.exists() and path.stat().st_size > HOOK_LOG_MAX_BYTES:
            os.replace(path, path.with_name(HOOK_LOG + ".1"))
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
    except OSError:
        pass


def record_workspace(agent: str, payload: dict[str, Any]) -> tuple[bool, str]:
    """Record the repository the session works in (`repo_state`): Claude Code's SessionStart
    its start, its SessionEnd its end; Codex's first notify its start (it has no session-start
    hook: the first turn's changes are already in it), every notify its end. Never raises:
    returns whether it recorded anything and what it did, for the hook's log line."""
    from selftaught.sleep.intake.repo_state import RepoStateError, record_end, record_start

    session_id, _ = payload_session(agent, payload)
    cwd = payload.get("cwd")
    if not session_id or not isinstance(cwd, str) or not cwd:
        return False, "workspace not recorded: no session id or cwd"
    home = sleep_home()
    try:
        if agent == "claude-code" and payload.get("hook_event_name") == "SessionStart":
            started = record_start(session_id, Path(cwd), home)
            return bool(started), (
                "workspace start recorded" if started else "workspace start kept (resumed)"
            )
        said = []
        if agent == "codex" and record_start(session_id, Path(cwd), home) is not None:
            said.append("workspace start recorded (first notify)")
        record_end(session_id, Path(cwd), home)
        return True, ", ".join([*said, "workspace end recorded"])
    except (RepoStateError, OSError) as err:
        return False, f"workspace not recorded: {err}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m {HOOK_MODULE}", description="Harvest the session an agent just ended."
    )
    parser.add_argument("agent", choices=AGENTS)
    parser.add_argument("--project", help="put the rows in this project (default: the cwd's)")
    parser.add_argument("--log", help="the task log (default $SELFTAUGHT_LOG or <home>/log.db)")
    parser.add_argument("--home", help="the sleep home (default $SELFTAUGHT_HOME)")
    parser.add_argument("payload", nargs="?", help="the agent's JSON (Codex notify)")
    return parser


def _run(args: argparse.Namespace, stdin: TextIO) -> str:
    payload = _read_payload(args.agent, args.payload, stdin)
    if args.agent == "codex" and payload.get("type") not in (None, "agent-turn-complete"):
        return f"ignored codex notify {payload.get('type')!r}"
    session_id, transcript = payload_session(args.agent, payload)
    if session_id:
        check_session_id(session_id)
    if args.agent == "claude-code" and payload.get("hook_event_name") == "SessionStart":
        return f"claude-code session {session_id}: {record_workspace(args.agent, payload)[1]}"
    wrote, recorded = record_workspace(args.agent, payload)
    turn_id = payload.get("turn-id")
    if args.agent == "codex" and session_id and isinstance(turn_id, str) and not transcript:
        path = find_transcript("codex", session_id)
        if path is not None and not wait_for_turn(path, turn_id):
            note(f"codex session {session_id}: turn {turn_id} not in the rollout yet")
        transcript = str(path) if path else None
    try:
        with TaskLog(args.log) as log:
            done = harvest_session(
                args.agent, log, session_id=session_id, transcript=transcript, project=args.project
            )
    except Exception:
        if wrote:  # say what was recorded before the harvest failed
            note(f"ok {args.agent} session {session_id}: {recorded}")
        raise
    bad = f", {len(done.malformed)} malformed lines skipped" if done.malformed else ""
    return (
        f"{args.agent} session {done.session_id or session_id}: {done.inserted} new of "
        f"{done.found} turns ({done.transcript}){bad}; {recorded}"
    )


def main(argv: Sequence[str] | None = None, stdin: TextIO | None = None) -> int:
    """The hook: harvest the session, note the outcome, exit 0 whatever happened."""
    try:
        args = _parser().parse_intermixed_args(argv)
    except SystemExit:  # argparse printed why; a bad command line must not fail the agent
        note(f"error: bad hook command line {list(argv or sys.argv[1:])!r}")
        return 0
    if args.home:
        os.environ[ENV_HOME] = args.home
    try:
        note("ok " + _run(args, stdin or sys.stdin))
    except Exception as err:  # noqa: BLE001 (a hook never fails the agent; the log says why)
        note(f"error {args.agent}: {type(err).__name__}: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
