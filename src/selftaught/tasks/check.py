"""A task line's `check`: a command run on the files the agent left, in the sandbox.

The workspace (after the agent) is packed into a tar file, copied into the sandbox
(`selftaught.tasks.sandbox`, bubblewrap: no network, no files of the host but the system's
programs and the Python interpreter, resource limits), unpacked in its private working folder,
and the command runs there. `python` / `python3` are that interpreter (its standard library,
no site-packages: `python -m unittest`, not pytest); `sh` and the programs of /usr/bin are the
system's. The command's argv is run as given, not through a shell (`sh -c '...'` when a
pipeline is wanted; the check is the operator's text, not the model's).

Exit 0 is solved (1.0), any other exit is not (0.0), and the command's output is the feedback.
A check that cannot start (no such program), that times out, or a sandbox that fails, is an
error (`CheckError`): the rollout records it and it is never a score of 0.

Symlinks in the workspace travel only when they point inside it; other files than regular
ones (devices, sockets) are left out."""

from __future__ import annotations

import json
import os
import shlex
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftaught.tasks.base import Score, TaskError
from selftaught.tasks.sandbox import TAIL_CHARS, WORKDIR_BYTES, Sandbox
from selftaught.workspace import entries

DEFAULT_CHECK_TIMEOUT_S = 60.0
DEFAULT_CHECK_MEMORY_MB = 2048
MAX_WORKSPACE_BYTES = WORKDIR_BYTES // 2  # unpacked in the sandbox's tmpfs, beside the tar
REPORT_MARK = "\x00selftaught-check-report\x00"
OUTPUT_CHARS = 1500  # of the check's output, its end: the feedback


class CheckError(TaskError):
    """The check could not give a verdict: it did not start, timed out, or the sandbox
    failed. An error of the rollout, never a score."""


@dataclass(frozen=True)
class Check:
    """A command (argv, run without a shell) and its limits."""

    argv: tuple[str, ...]
    timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    memory_mb: int = DEFAULT_CHECK_MEMORY_MB

    def describe(self) -> str:
        return shlex.join(self.argv)


def parse_check(value: Any, where: str) -> tuple[str, ...]:
    """`check` as written on a line: a command string (split as a shell would split it) or a
    list of arguments."""
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as err:
            raise TaskError(f"{where}: `check` cannot be split into arguments ({err})") from None
    elif isinstance(value, list) and all(isinstance(a, str) for a in value):
        argv = list(value)
    else:
        raise TaskError(f"{where}: `check` must be a command string or a list of strings")
    if not argv or not argv[0]:
        raise TaskError(f"{where}: `check` is empty")
    return tuple(argv)


# Runs inside the sandbox (see sandbox._BOOTSTRAP): unpack, run the command, report.
_RUNNER = """\
import json, os, signal, subprocess, sys, tarfile
here = os.path.dirname(os.path.abspath(__file__))
work = os.path.join(os.getcwd(), "workspace")
tools = os.path.join(os.getcwd(), ".check-bin")
os.mkdir(work)
os.mkdir(tools)
for name in ("python", "python3"):
    os.symlink(sys.executable, os.path.join(tools, name))
with tarfile.open(os.path.join(here, "workspace.tar")) as archive:
    if hasattr(tarfile, "data_filter"):
        archive.extractall(work, filter="data")
    else:
        archive.extractall(work)
env = {{
    "PATH": tools + ":/usr/local/bin:/usr/bin:/bin",
    "HOME": os.getcwd(),
    "TMPDIR": os.getcwd(),
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}}
log_path = os.path.join(os.getcwd(), ".check-output")
report = {{}}
with open(log_path, "wb") as log:
    try:
        proc = subprocess.Popen({argv!r}, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as err:
        report["error"] = "could not start: " + (err.strerror or str(err))
    else:
        report["returncode"] = proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what it left running
        except OSError:
            pass
with open(log_path, "rb") as log:
    log.seek(0, 2)
    log.seek(max(0, log.tell() - {chars} * 4))
    output = log.read().decode("utf-8", "replace")
n = {chars}
while True:  # the host reads the last {limit} characters of stdout: the report must fit
    report["output"] = output[-n:] if n else ""
    line = {mark!r} + json.dumps(report, ensure_ascii=False)
    if len(line) <= {limit} or n == 0:
        break
    n = n * 3 // 4
sys.stdout.write(line)
"""


def pack_workspace(root: Path, target: Path) -> int:
    """Write the workspace's files into the tar `target`; returns their bytes."""
    total = 0
    real_root = os.path.realpath(root)
    with tarfile.open(target, "w") as archive:
        for dirpath, dirs, _files in os.walk(root):  # folders first: empty ones travel too
            for name in dirs:
                full = os.path.join(dirpath, name)
                if not os.path.islink(full):
                    archive.add(full, arcname=os.path.relpath(full, root), recursive=False)
        for full, rel in entries(root):
            if os.path.islink(full):
                resolved = os.path.realpath(full)
                if not (resolved == real_root or resolved.startswith(real_root + os.sep)):
                    continue  # a link out of the workspace brings nothing in
            elif os.path.isfile(full):
                total += os.path.getsize(full)
            else:
                continue  # a device, a socket, a fifo
            archive.add(full, arcname=rel, recursive=False)
    return total


def run_check(sandbox: Sandbox, check: Check, workspace: Path) -> Score:
    """Run `check` on the files in `workspace` (left as they are): 1.0 when it exits 0."""
    from selftaught.tasks.humaneval import sandbox_feedback

    with tempfile.TemporaryDirectory(prefix="selftaught-check-") as tmp:
        tar = Path(tmp) / "workspace.tar"
        size = pack_workspace(workspace, tar)
        if size > MAX_WORKSPACE_BYTES:
            return Score(
                0.0,
                0.0,
                f"the workspace holds {size / 2**20:.1f} MiB of files, more than the "
                f"{MAX_WORKSPACE_BYTES / 2**20:.0f} MiB a check can take",
            )
        runner = _RUNNER.format(
            argv=list(check.argv),
            chars=OUTPUT_CHARS,
            limit=TAIL_CHARS - 100,
            mark=REPORT_MARK,
        )
        result = sandbox.run(
            runner,
            timeout_s=check.timeout_s,
            memory_mb=check.memory_mb,
            allow_subprocesses=True,
            files={"workspace.tar": tar},
            system_tools=True,
        )
    if result.timed_out:
        raise CheckError(f"the check `{check.describe()}` timed out after {check.timeout_s:g}s")
    report = _report(result.stdout_tail) if result.passed else None
    if report is None:
        raise CheckError(
            f"the check `{check.describe()}` did not run to its end ({result.summary()})"
        )
    if "error" in report:
        raise CheckError(f"the check `{check.describe()}` {report['error']}")
    code = report.get("returncode")
    output = str(report.get("output", "")).strip()
    if code == 0:
        return Score(1.0, 1.0, sandbox_feedback(f"check passed: {output}".strip()))
    said = f"check failed (exit {code})" + (f": {output}" if output else "")
    return Score(0.0, 0.0, sandbox_feedback(said))


def _report(stdout: str) -> dict[str, Any] | None:
    _, mark, tail = stdout.rpartition(REPORT_MARK)
    if not mark:
        return None
    try:
        report = json.loads(tail)
    except json.JSONDecodeError:
        return None
    return report if isinstance(report, dict) else None
