"""Harvest one agent session the moment it ends: what a coding agent's session-end hook runs.

`selftaught sleep hook install` (`hook_install.py`) registers this module as a hook:

    claude-code   a `SessionEnd` command hook; Claude Code writes the hook's JSON on stdin:
                  {"session_id", "transcript_path", "cwd", "hook_event_name", "reason"}
                  (and a `SessionStart` one: the same fields, `source` for `reason`)
    codex         the `notify` program of config.toml; Codex appends one JSON argument after
                  each finished turn: {"type": "agent-turn-complete", "thread-id", "turn-id",
                  "cwd", "input-messages", "last-assistant-message"} (the thread id is the
                  session id in the rollout file's name)

and it runs as `python -m selftaught.sleep.intake.hooks AGENT [--project P] [--log L |
--log-from FILE] [--home H] [--folder F] [PAYLOAD]` (`--log-from`: a 0600 file holding a
log URL with a password, kept out of the agent's settings; `--folder`: a project-scope hook
harvests only sessions that ran in its project's folder). It imports only the harvesters and
the log (no CLI, ~0.3 s), reads that one session's transcript and stores its turns
(idempotent: a turn already stored is skipped), and it never fails the agent: it exits 0
whatever happens and writes one line per run, an error included, to `<home>/hooks.log`.

The same command records the repository the session works in (`record_workspace`,
`repo_state.py`: its commit and uncommitted changes, for a night's workspace tasks): Claude
Code's `SessionStart` hook (installed beside `SessionEnd`) records the start, its `SessionEnd`
the end; Codex has no session-start hook, so its first `notify` records the start (after the
first turn: changes made in that turn are already in it) and every `notify` the end. A folder
that is not a git repository is noted and skipped.

`harvest_session` is also what the MCP server (`selftaught.sleep.mcp_server`) calls to bring a live
session into the log before attaching feedback to it; there the turn still running (the one
calling the tool) is left out, so it is not stored half-done (a stored turn is never updated).

A project is a wall: given a `folder` (the MCP server's, or a project-scope hook's), a
transcript whose session ran in another folder is not harvested (`SessionHarvest.elsewhere`),
and `last_answered_turn` looks in one project only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from selftaught.errors import InputError
from selftaught.runs import private_dirs
from selftaught.sleep.intake.harvest import HarvestConfig, HarvestReport, harvesters
from selftaught.sleep.intake.log import Interaction, LogFilter, TaskLog
from selftaught.sleep.intake.sessions import check_session_id
from selftaught.sleep.paths import ENV_HOME, sleep_home

AGENTS = ("claude-code", "codex")
HOOK_MODULE = "selftaught.sleep.intake.hooks"
HOOK_LOG = "hooks.log"
HOOK_LOG_MAX_BYTES = 1 << 20  # then it is renamed to hooks.log.1 (one old copy kept)
CODEX_SETTLE_S = 5.0  # Codex calls notify before its rollout file has the turn's end


def check_agent(agent: str) -> str:
    if agent not in AGENTS:
        raise InputError(f"unknown agent {agent!r}; valid: {', '.join(AGENTS)}")
    return agent


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
    elsewhere: bool = False  # the session ran outside the folder asked for: nothing stored
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
    folder: Path | None = None,
) -> SessionHarvest:
    """Store one session's turns: its transcript file, else the file found by session id.
    `leave_open_turn` leaves out a last turn that has no answer yet (the session is live);
    with `folder`, a session that ran anywhere else is not stored (`elsewhere`)."""
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
    if folder is not None and not (rows and same_folder(rows[0].meta.get("cwd"), folder)):
        result.elsewhere = True
        return result
    if leave_open_turn and rows and not rows[-1].meta.get("answered"):
        rows, result.left_open = rows[:-1], True
    rows = rows[-config.max_tasks :]
    if rows:
        result.session_id = rows[-1].session_id
    result.found = len(rows)
    result.inserted = log.add_many(rows)
    return result


def same_folder(cwd: Any, folder: Path) -> bool:
    """A session's working folder (as its transcript records it) is `folder`."""
    if not isinstance(cwd, str) or not cwd:
        return False
    return os.path.realpath(os.path.expanduser(cwd)) == os.path.realpath(folder)


class SessionAmbiguous(InputError):
    """A session id that several proxy clients logged rows under (none of it is harvested)."""


def last_answered_turn(log: TaskLog, session_id: str, project: str) -> Interaction | None:
    """The newest turn of a session in `project` with an answer, else its newest turn;
    failed calls and shadow answers are never a turn. A session id is a client's: the rows
    harvested from this machine's transcripts when there are any, else its proxy rows, which
    must all be one client's (another client may have sent the same id: `SessionAmbiguous`)."""
    flt = LogFilter(project=project, session_id=session_id)
    turns = [it for it in log.query(flt) if it.is_task]
    harvested = [it for it in turns if it.source in AGENTS]
    if harvested:
        turns = harvested
    elif len({it.client for it in turns}) > 1:
        raise SessionAmbiguous(
            f"session {session_id} was logged by {len({it.client for it in turns})} proxy "
            f"clients in project {project}: give feedback on the row by its id instead "
            "(`selftaught sleep feedback ID`)"
        )
    answered = [it for it in turns if it.reply]
    return (answered or turns)[0] if turns else None


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
        private_dirs(folder)
        path = folder / HOOK_LOG
        if path.exists() and path.stat().st_size > HOOK_LOG_MAX_BYTES:
            os.replace(path, path.with_name(HOOK_LOG + ".1"))
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")
    except OSError:
        pass


def record_workspace(
    agent: str, payload: dict[str, Any], folder: Path | None = None
) -> tuple[bool, str]:
    """Record the repository the session works in (`repo_state`): Claude Code's SessionStart
    its start, its SessionEnd its end; Codex's first notify its start (it has no session-start
    hook: the first turn's changes are already in it), every notify its end. With `folder` (a
    project-scoped hook), a session working anywhere else is not recorded. Never raises:
    returns whether it recorded anything and what it did, for the hook's log line."""
    from selftaught.sleep.intake.repo_state import RepoStateError, record_end, record_start

    session_id, _ = payload_session(agent, payload)
    cwd = payload.get("cwd")
    if not session_id or not isinstance(cwd, str) or not cwd:
        return False, "workspace not recorded: no session id or cwd"
    if folder is not None and not same_folder(cwd, folder):
        return False, f"workspace not recorded: the session works outside {folder}"
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
    parser.add_argument("--log-from", help="a file holding the log's URL (one with a password)")
    parser.add_argument("--home", help="the sleep home (default $SELFTAUGHT_HOME)")
    parser.add_argument("--folder", help="harvest only sessions that ran in this folder")
    parser.add_argument("payload", nargs="?", help="the agent's JSON (Codex notify)")
    return parser


def _log_location(args: argparse.Namespace) -> str | None:
    """--log, else the URL in the --log-from file (kept out of the agent's settings)."""
    if args.log_from:
        url = Path(args.log_from).read_text(encoding="utf-8").strip()
        if not url:
            raise InputError(f"{args.log_from} holds no log URL")
        return url
    log: str | None = args.log  # --log: a string option
    return log


def _run(args: argparse.Namespace, stdin: TextIO) -> str:
    payload = _read_payload(args.agent, args.payload, stdin)
    if args.agent == "codex" and payload.get("type") not in (None, "agent-turn-complete"):
        return f"ignored codex notify {payload.get('type')!r}"
    session_id, transcript = payload_session(args.agent, payload)
    if session_id:
        check_session_id(session_id)
    folder = Path(args.folder) if args.folder else None
    if args.agent == "claude-code" and payload.get("hook_event_name") == "SessionStart":
        said = record_workspace(args.agent, payload, folder)[1]
        return f"claude-code session {session_id}: {said}"
    wrote, recorded = record_workspace(args.agent, payload, folder)
    turn_id = payload.get("turn-id")
    if args.agent == "codex" and session_id and isinstance(turn_id, str) and not transcript:
        path = find_transcript("codex", session_id)
        if path is not None and not wait_for_turn(path, turn_id):
            note(f"codex session {session_id}: turn {turn_id} not in the rollout yet")
        transcript = str(path) if path else None
    try:
        with TaskLog(_log_location(args)) as log:
            done = harvest_session(
                args.agent,
                log,
                session_id=session_id,
                transcript=transcript,
                project=args.project,
                folder=folder,
            )
    except Exception:
        if wrote:  # say what was recorded before the harvest failed
            note(f"ok {args.agent} session {session_id}: {recorded}")
        raise
    if done.elsewhere:
        return f"{args.agent} session {session_id}: ran outside {args.folder}; not harvested"
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
