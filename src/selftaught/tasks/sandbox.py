"""Run untrusted Python in a child process with time and memory limits.

The child is `python -I` (isolated: no user site, no PYTHON* variables) with an empty
environment, in a fresh temporary directory that is deleted afterwards, in its own process
session (so a wall-clock timeout kills it and anything it spawned). Before the code runs, a
small bootstrap sets resource limits on the child itself: address space (RLIMIT_AS), CPU
seconds, no core dumps, file size, and no new processes.

The limits are set by the child's bootstrap rather than by `preexec_fn`, because `preexec_fn`
is unsafe when the parent has threads (rollouts score in worker threads) and can deadlock.

This is a resource sandbox, not a security boundary: the code can still read files the user
can read and open network sockets. Run untrusted models' code in a container if that matters.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TAIL_CHARS = 2000
MAX_OUTPUT_BYTES = 8 * 1024 * 1024  # a runaway print loop gets SIGXFSZ, not our memory

_BOOTSTRAP = """\
import resource, sys
def _limit(kind, value):
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass
_limit(resource.RLIMIT_AS, {memory_bytes})
_limit(resource.RLIMIT_CPU, {cpu_seconds})
_limit(resource.RLIMIT_CORE, 0)
_limit(resource.RLIMIT_FSIZE, {max_file_bytes})
if {block_processes}:
    _limit(resource.RLIMIT_NPROC, 0)
del _limit, resource
_path = {solution_path!r}
with open(_path, encoding="utf-8") as _f:
    _code = compile(_f.read(), _path, "exec")
del _f
exec(_code, {{"__name__": "__main__", "__file__": _path, "__builtins__": __builtins__}})
"""


@dataclass
class SandboxResult:
    """passed: exited 0 within the limits. The tails are the last characters of the output."""

    passed: bool
    stdout_tail: str
    stderr_tail: str
    timed_out: bool
    returncode: int | None
    duration_s: float = 0.0
    memory_exceeded: bool = False

    def summary(self, timeout_s: float | None = None) -> str:
        """One line saying why the run failed (or that it passed)."""
        if self.passed:
            return "passed"
        if self.timed_out:
            limit = f" after {timeout_s:g}s" if timeout_s is not None else ""
            return f"timed out{limit}"
        if self.memory_exceeded:
            return "ran out of memory (MemoryError under the sandbox memory limit)"
        detail = summarize_traceback(self.stderr_tail)
        if detail:
            return detail
        if self.returncode is not None and self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = str(-self.returncode)
            return f"killed by signal {name}"
        return f"exited with code {self.returncode}"


def summarize_traceback(stderr: str) -> str:
    """'AssertionError at `assert candidate(3) == 9`' from a traceback; '' when there is none."""
    lines = [ln for ln in stderr.rstrip().splitlines() if ln.strip()]
    if not lines:
        return ""
    # The exception line is the last unindented line; the line before it (indented) is the
    # source of the frame that raised.
    unindented = [i for i, ln in enumerate(lines) if not ln.startswith(" ")]
    exc_index = unindented[-1] if unindented else len(lines) - 1
    exception = lines[exc_index].strip()
    source = ""
    for ln in reversed(lines[:exc_index]):
        stripped = ln.strip()
        if stripped.startswith("File ") or set(stripped) <= set("^~ "):
            continue
        source = stripped
        break
    if len(exception) > 300:
        exception = exception[:297] + "..."
    return f"{exception} at `{source}`" if source else exception


def _read_tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4 * TAIL_CHARS))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")[-TAIL_CHARS:]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def run_python(
    code: str,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    *,
    allow_subprocesses: bool = False,
) -> SandboxResult:
    """Run `code` as a script in a limited child process and report how it ended."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if memory_mb <= 0:
        raise ValueError(f"memory_mb must be positive, got {memory_mb}")
    with tempfile.TemporaryDirectory(prefix="selftaught-sandbox-") as tmp:
        workdir = Path(tmp)
        solution = workdir / "solution.py"
        solution.write_text(code, encoding="utf-8")
        bootstrap = workdir / "_bootstrap.py"
        bootstrap.write_text(
            _BOOTSTRAP.format(
                memory_bytes=memory_mb * 1024 * 1024,
                cpu_seconds=math.ceil(timeout_s) + 1,
                max_file_bytes=MAX_OUTPUT_BYTES,
                block_processes=not allow_subprocesses,
                solution_path=str(solution),
            ),
            encoding="utf-8",
        )
        stdout_path, stderr_path = workdir / "stdout.txt", workdir / "stderr.txt"
        timed_out = False
        start = time.monotonic()
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                # -I: isolated (ignores PYTHON* variables and user site); -B: no .pyc files
                [sys.executable, "-I", "-B", str(bootstrap)],
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env={},  # nothing of the parent's environment (API keys) reaches the code
                start_new_session=True,
                close_fds=True,
            )
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                proc.wait()
            else:
                _kill_group(proc)  # reap anything it left running in its session
        duration = time.monotonic() - start
        stdout_tail, stderr_tail = _read_tail(stdout_path), _read_tail(stderr_path)
    returncode = proc.returncode
    if returncode == -signal.SIGXCPU:  # the CPU limit is the timeout's backstop
        timed_out = True
    error_lines = stderr_tail.strip().splitlines()
    memory_exceeded = bool(error_lines) and error_lines[-1].startswith("MemoryError")
    return SandboxResult(
        passed=returncode == 0 and not timed_out,
        stdout_tail=stdout_tail,
        stderr_tail=stderr_tail,
        timed_out=timed_out,
        returncode=None if timed_out and returncode is None else returncode,
        duration_s=duration,
        memory_exceeded=memory_exceeded,
    )
