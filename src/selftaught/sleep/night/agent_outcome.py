"""The agent's own test runs as labels: a verdict on its episode, and a workspace task.

**Signals.** `read_outcomes` reads each coding agent's row (`sessions.is_agent_session`: a
harvested Claude Code / Codex turn, or a proxy session collapsed into its episode) with
`outcomes.read_session`: a row whose last test run (or build) passed after a red one is
**solved** (a `Signal` of kind `solved`, thumbs up), one whose last run is red **ended red**
(`ended_red`, thumbs down). The signal's source is "agent", its words the command and the
runner's summary line (redacted); it is merged into the row's `Feedback` by the same rule as
the conversation's signals (`signals.merge_signal`: a value the explicit feedback set wins)
and trusted as the row's client is (`signals.words_trusted`). The row keeps what was read in
`meta["outcome"]`. The operator may reject one like any signal (`--reject-signal`).

**Workspace tasks.** A solved row of a session the hooks recorded (`repo_state`: the
repository's commit and uncommitted changes at the session's start and end) becomes a
workspace task (issue #29's `workspace` + `check`, `WorkspaceMiner`): the repository as the
session found it, checked by the test command that proved the fix, run **in the sandbox**
(bubblewrap, `tasks.check.run_check`; never outside it: it is logged text). It is kept only
when the check is two-sided, proven at mining time: it fails on the session's start and
passes on its end. Otherwise the row stays a plain task, and the report counts why
(`WorkspaceMiner.counted`: `AgentRunsRecord.not_workspace`). The start folder is kept under
the project (`<home>/projects/<p>/workspaces/<key>/files`, 0700) so a recalled task finds it
again.

The check is the runner's command only (`check_argv`): a `cd DIR &&` before it sets the folder,
`VAR=value` words before it become `env` arguments, redirections and pipes after it are
dropped; a command that needs a shell otherwise (variables, globs, substitutions, several
commands) is not a check. In the sandbox, `python` is the interpreter with its standard
library only and `/usr/bin` the system's: a test suite that needs installed packages (pytest,
node_modules) fails there on both sides, and the row stays a plain task.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shlex
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from selftaught.errors import TaskError
from selftaught.redact import redact_for_model
from selftaught.runs import atomic_write_json, make_private, private_dirs
from selftaught.sleep.intake.log import Interaction
from selftaught.sleep.intake.repo_state import RepoState, RepoStateError, load_record, materialise
from selftaught.sleep.intake.sessions import is_agent_session, task_turns
from selftaught.sleep.night.mine import (
    MineConfig,
    MinedTask,
    client_label,
    new_task,
    redact_messages,
    task_checks,
)
from selftaught.sleep.night.outcomes import (
    CommandOutcome,
    SessionOutcome,
    find_runner,
    read_session,
    split_command,
)
from selftaught.sleep.night.signals import Signal, SignalKind, merge_signal, words_trusted
from selftaught.sleep.night.trust import row_reference
from selftaught.sleep.paths import project_dir
from selftaught.sleep.records import AgentRunsRecord, WorkspaceCheck
from selftaught.tasks.base import Score
from selftaught.tasks.check import DEFAULT_CHECK_TIMEOUT_S, MAX_WORKSPACE_BYTES, Check, run_check
from selftaught.tasks.sandbox import Sandbox, SandboxError, open_sandbox

SOURCE = "agent"
WORKSPACES_DIR = "workspaces"
# why a solved row stayed a plain task (the report's keys)
NO_RECORD = "no session record (no SessionStart hook, or not a git repository)"
NO_START = "no record of the session's start"
NO_END = "no record of the session's end"
NEEDS_SHELL = "the test command needs a shell (several commands, variables, globs)"
NO_SANDBOX = "no sandbox (bubblewrap) to run the check in"
NOT_REBUILT = "the recorded repository state cannot be rebuilt"
CHECK_ERROR = "the check cannot run in the sandbox"
FIXED_FAILS = "the check fails on the session's end state in the sandbox"
START_PASSES = "the check already passes on the session's start state"
NO_REQUEST = "no user request to replay"
OVER_BUDGET = "over the night's proofs (MAX_PROOFS)"
MAX_PROOFS = 20  # sessions proven per night (two sandboxed checks each); a proof is kept
_SHELL_CHARS = re.compile(r"[$`*?\[\]{}()<>|;&~\\!]")
_REDIRECT = re.compile(r"^\d*(?:>>?|<|>&|&>)\S*$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=[^$`]*$")


# ---- signals --------------------------------------------------------------------------------


def outcome_signal(it: Interaction, outcome: SessionOutcome) -> Signal | None:
    last = outcome.last
    if outcome.verdict == "none" or last is None:
        return None
    kind: SignalKind = "solved" if outcome.verdict == "solved" else "ended_red"
    key = f"{it.id}#agent"
    return Signal(
        id="s-" + hashlib.sha256(key.encode()).hexdigest()[:12],
        kind=kind,
        words=redact_for_model(f"{last.command} → {last.summary}"),
        thread=it.id,
        turn=last.step,
        row_id=it.id,
        giver=client_label(it),
        trusted=words_trusted(it),
        at=it.created_at,
        source=SOURCE,
    )


def _outcome_meta(outcome: SessionOutcome) -> dict[str, Any]:
    def run(r: CommandOutcome) -> dict[str, Any]:
        said = {"command": redact_for_model(r.command), "summary": redact_for_model(r.summary)}
        return {**asdict(r), **said}

    return {"verdict": outcome.verdict, "runs": [run(r) for r in outcome.runs]}


def read_outcomes(
    rows: list[Interaction], rejected: set[str] | None = None
) -> tuple[list[Interaction], list[Signal], AgentRunsRecord]:
    """`rows` with each agent row's outcome read (`meta["outcome"]`, a signal merged into its
    feedback when solved or ended red), the signals, and what the runs said (the workspace
    tasks are `WorkspaceMiner.counted`'s)."""
    rejected = rejected or set()
    agent_rows = [it for it in rows if it.is_task and is_agent_session(it)]
    outcomes = read_session(agent_rows)
    signals: list[Signal] = []
    runs: Counter[str] = Counter()
    read = with_runs = dropped = 0
    out = []
    for it in rows:
        outcome = outcomes.get(it.id)
        if outcome is None:
            out.append(it)
            continue
        read += 1
        with_runs += bool(outcome.runs)
        runs.update(r.status for r in outcome.runs)
        meta = {**it.meta, "outcome": _outcome_meta(outcome)}
        signal = outcome_signal(it, outcome)
        if signal is not None and signal.id in rejected:
            dropped += 1
            meta["outcome"]["verdict"] = "none"
            signal = None
        if signal is None:
            out.append(replace(it, meta=meta))
            continue
        signals.append(signal)
        meta["signals"] = [*meta.get("signals", []), signal.to_dict()]
        if outcome.check is not None:
            meta["outcome"]["check"] = outcome.check.command  # raw: the sandbox runs it
        out.append(replace(it, meta=meta, feedback=merge_signal(it.feedback, signal)))
    record = AgentRunsRecord(
        rows=read,
        with_runs=with_runs,
        runs=dict(runs),
        signals=dict(Counter(s.kind for s in signals)),
        rejected_by_operator=dropped,
    )
    return out, signals, record


# ---- the check --------------------------------------------------------------------------------


def _words(segment: str) -> list[str] | None:
    try:
        return shlex.split(segment)
    except ValueError:
        return None


def check_argv(command: str, root: str, cwd: str) -> tuple[str, ...] | None:
    """The argv that reruns `command`'s test run from the repository's top folder (`cwd`: the
    session's folder in it), or None when it needs a shell (see the module docstring)."""
    found = find_runner(command)
    if found is None:
        return None
    segments = split_command(command)
    at = found[2]
    folder = PurePosixPath(cwd)
    for segment, sep in segments[:at]:
        words = _words(segment)
        if not words or words[0] != "cd" or len(words) != 2 or sep != "&&":
            return None
        target = PurePosixPath(words[1])
        if target.is_absolute():
            try:
                target = target.relative_to(root)
            except ValueError:
                return None
            folder = target
        else:
            folder = folder / target
    words = _words(segments[at][0])
    if not words:
        return None
    words = [w for w in words if not _REDIRECT.match(w)]
    env = []
    while words and _ASSIGNMENT.match(words[0]):
        env.append(words.pop(0))
    if not words or any(_SHELL_CHARS.search(w) for w in words):
        return None
    parts = [p for p in folder.parts if p != "."]
    if ".." in parts or folder.is_absolute():
        return None
    argv = (["env", *env] if env else []) + words
    if parts:
        sub = "/".join(parts)
        return ("sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", sub, *argv)
    return tuple(argv)


# ---- workspace tasks ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Proof:
    start: Score
    end: Score


class WorkspaceMiner:
    """Turns solved rows with a session record into workspace tasks (the module docstring),
    counting those it made and why others stayed plain tasks (`counted`); the sandbox is
    opened at the first candidate. A night makes one."""

    def __init__(
        self,
        project: str,
        home: Path,
        *,
        sandbox: Sandbox | None = None,
        timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
        max_proofs: int = MAX_PROOFS,
        scratch: Path | None = None,
    ):
        self.folder = project_dir(project, home) / WORKSPACES_DIR
        # new proofs go here instead (`sleep plan` keeps none); the project's are still read
        self.scratch = scratch
        self.home = Path(home)
        self.made = 0  # workspace tasks
        self.not_workspace: Counter[str] = Counter()  # solved, but a plain task: why
        self.notes: list[str] = []  # the first few reasons in full
        self.timeout_s = timeout_s
        self._sandbox = sandbox
        self._no_sandbox: str | None = None
        self.max_proofs = max_proofs
        self.proofs = 0

    def sandbox(self) -> Sandbox | None:
        if self._sandbox is None and self._no_sandbox is None:
            try:
                self._sandbox = open_sandbox()  # never the unsafe mode: it is logged text
            except SandboxError as err:
                self._no_sandbox = str(err)
        return self._sandbox

    def mine(self, it: Interaction, config: MineConfig) -> MinedTask | None:
        """The workspace task of `it`, or None (not solved; or why is counted)."""
        outcome = it.meta.get("outcome") if isinstance(it.meta, dict) else None
        if not isinstance(outcome, dict) or not outcome.get("check") or not it.session_id:
            return None
        record = load_record(it.session_id, self.home)
        if record is None or (record.start is None and record.end is None):
            self._fell_back(NO_RECORD)
            return None
        if record.start is None:
            self._fell_back(NO_START)
            return None
        if record.end is None:
            self._fell_back(NO_END)
            return None
        start, end = record.start, record.end
        argv = check_argv(str(outcome["check"]), start.root, start.cwd)
        if argv is None:
            self._fell_back(NEEDS_SHELL, str(outcome["check"]))
            return None
        sandbox = self.sandbox()
        if sandbox is None:
            self._fell_back(NO_SANDBOX, self._no_sandbox)
            return None
        check = Check(argv, self.timeout_s)
        folder = self._proven(it.session_id, start, end, check, sandbox)
        if folder is None:
            return None
        return self._task(it, config, folder, check, start)

    def _fell_back(self, why: str, detail: str | None = None) -> None:
        self.not_workspace[why] += 1
        if detail and len(self.notes) < 5:  # logged text: redacted, clipped
            self.notes.append(f"{why}: {redact_for_model(detail)[-300:]}")

    def counted(self, runs: AgentRunsRecord) -> AgentRunsRecord:
        """`runs` (`read_outcomes`'s) with the workspace tasks made and why solved rows stayed
        plain tasks: the mining report's `agent` section."""
        return runs.but(
            workspace_tasks=self.made,
            not_workspace=dict(self.not_workspace),
            notes=tuple(self.notes),
        )

    def _key(self, session_id: str, start: RepoState, end: RepoState, check: Check) -> str:
        raw = json.dumps([session_id, start.commit, start.diff, end.commit, end.diff, check.argv])
        return hashlib.sha256(raw.encode("utf-8", "replace")).hexdigest()[:16]

    def _proven(
        self, session_id: str, start: RepoState, end: RepoState, check: Check, sandbox: Sandbox
    ) -> Path | None:
        """The start's files, kept under the project, when the check is two-sided."""
        key = self._key(session_id, start, end, check)
        kept = self.folder / key
        if (kept / "proof.json").is_file() and (kept / "files").is_dir():
            return kept / "files"
        home = (self.scratch or self.folder) / key
        if self.proofs >= self.max_proofs:
            self._fell_back(OVER_BUDGET)
            return None
        self.proofs += 1
        with tempfile.TemporaryDirectory(prefix="selftaught-proof-") as tmp:
            before, after = Path(tmp) / "start", Path(tmp) / "end"
            try:
                materialise(start, before, MAX_WORKSPACE_BYTES)
                materialise(end, after, MAX_WORKSPACE_BYTES)
            except RepoStateError as err:
                self._fell_back(NOT_REBUILT, str(err))
                return None
            try:
                proof = _Proof(run_check(sandbox, check, before), run_check(sandbox, check, after))
            except TaskError as err:  # CheckError: no verdict
                self._fell_back(CHECK_ERROR, f"{check.describe()}: {err}")
                return None
            if not proof.end.hard:
                self._fell_back(FIXED_FAILS, f"{check.describe()}: {proof.end.feedback}")
                return None
            if proof.start.hard:
                self._fell_back(START_PASSES, check.describe())
                return None
            private_dirs(home)
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(home / "files")
            shutil.move(str(before), home / "files")
            make_private(home / "files")  # the repository's folders, made under a umask
        atomic_write_json(
            home / "proof.json",
            {
                "session": session_id,
                "check": list(check.argv),
                "start": {"commit": start.commit, "score": proof.start.hard},
                "end": {"commit": end.commit, "score": proof.end.hard},
                "start_feedback": redact_for_model(proof.start.feedback)[-600:],
            },
        )
        return home / "files"

    def _task(
        self, it: Interaction, config: MineConfig, folder: Path, check: Check, start: RepoState
    ) -> MinedTask | None:
        turns = task_turns(it)  # up to the last request: the agent redoes what followed
        last = max((i for i, m in enumerate(turns) if m.get("role") == "user"), default=-1)
        messages = redact_messages(turns[: last + 1])
        if not messages or messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
            self._fell_back(NO_REQUEST)
            return None
        if sum(len(m["content"]) for m in messages) > config.max_prompt_chars:
            self._fell_back(f"longer than {config.max_prompt_chars} characters")
            return None
        checks = task_checks(it, messages, row_reference(it), config, other_check=True)
        if isinstance(checks, str):  # not with other_check; kept for the type
            self._fell_back(checks)
            return None
        state, reference = checks
        workspace = WorkspaceCheck(
            path=str(folder),
            check=tuple(check.argv),
            timeout_s=check.timeout_s,
            session=it.session_id,
            commit=start.commit,
        )
        state = state.but(workspace=workspace)
        self.made += 1
        return new_task(it, messages, reference, state)


# ---- replaying them ---------------------------------------------------------------------------


def workspace_of(state: Mapping[str, Any]) -> tuple[Path, Check] | None:
    """(the start folder, the check) of a workspace example's state, else None."""
    ws = state.get("workspace")
    if not isinstance(ws, dict):
        return None
    return Path(ws["path"]), Check(tuple(ws["check"]), float(ws.get("timeout_s", 60.0)))


def for_target(tasks: list[MinedTask], agent: bool) -> tuple[list[MinedTask], list[MinedTask]]:
    """(the tasks the night's target can be checked on, the others): a workspace task needs
    an agent target (a chat model edits no files) unless it has an answer check too, and its
    start folder (a recalled task's may have been removed)."""
    kept: list[MinedTask] = []
    left: list[MinedTask] = []
    for task in tasks:
        ws = task.state.workspace
        if ws is None:
            kept.append(task)
            continue
        checkable = Path(ws.path).is_dir() if agent else task.state.has_answer_check
        (kept if checkable else left).append(task)
    return kept, left
