"""Run one agent CLI process: its own process group, the prompt on stdin, stdout read line by
line (a watcher may stop it early), a timeout, and nothing of it left running afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LINE_LIMIT = 64 * 1024 * 1024  # one stdout line (a JSON event holding a whole file, say)
OUTPUT_LIMIT = 256 * 1024 * 1024  # all of stdout kept, at most
STDERR_TAIL = 8000
DRAIN_S = 2.0  # after the CLI exited: how long its pipes may still deliver


@dataclass
class ProcessResult:
    returncode: int | None
    lines: list[str] = field(default_factory=list)
    stderr: str = ""
    timed_out: bool = False
    stopped: str | None = None  # why the watcher stopped it
    seconds: float = 0.0

    @property
    def stdout(self) -> str:
        return "\n".join(self.lines)

    def stderr_tail(self, n: int = 600) -> str:
        text = self.stderr.strip()
        return text if len(text) <= n else "..." + text[-n:]


def kill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads (the CLI, its tools and what they started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin_text: str | None,
    timeout_s: float,
    watch: Callable[[str], str | None] | None = None,
) -> ProcessResult:
    """Run `argv` in `cwd` with exactly `env`. `watch(line)` sees each stdout line and returns
    a reason to stop the process at once (or None). On a timeout, a stop, a cancellation or a
    normal exit, the whole process group is killed, so no tool the agent started lives on."""
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=str(cwd),
        env=dict(env),
        stdin=asyncio.subprocess.PIPE if stdin_text is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group: killed as one
        limit=LINE_LIMIT,
    )
    result = ProcessResult(returncode=None)
    try:
        await asyncio.wait_for(_communicate(proc, stdin_text, result, watch), timeout_s)
    except asyncio.TimeoutError:
        result.timed_out = True
    finally:
        kill_group(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()
        result.seconds = time.monotonic() - t0
    if not result.timed_out and result.stopped is None:
        result.returncode = proc.returncode
    return result


async def _communicate(
    proc: asyncio.subprocess.Process,
    stdin_text: str | None,
    result: ProcessResult,
    watch: Callable[[str], str | None] | None,
) -> None:
    async def feed() -> None:
        if stdin_text is None or proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin_text.encode("utf-8"))
            await proc.stdin.drain()
        proc.stdin.close()

    async def read_stderr() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.read(65536):
            result.stderr = (result.stderr + chunk.decode("utf-8", "replace"))[-STDERR_TAIL:]

    async def read_stdout() -> None:
        assert proc.stdout is not None
        kept = 0
        while raw := await proc.stdout.readline():
            line = raw.decode("utf-8", "replace").rstrip("\n")
            kept += len(raw)
            if kept > OUTPUT_LIMIT:
                result.stopped = f"its output passed {OUTPUT_LIMIT // 2**20} MiB"
                return
            result.lines.append(line)
            reason = watch(line) if watch is not None else None
            if reason is not None:
                result.stopped = reason
                return

    feeder, errors, output = (
        asyncio.ensure_future(c) for c in (feed(), read_stderr(), read_stdout())
    )
    exited = asyncio.ensure_future(proc.wait())
    tasks = [feeder, errors, output, exited]
    try:
        await asyncio.wait([output, exited], return_when=asyncio.FIRST_COMPLETED)
        if result.stopped is not None:
            return
        await exited
        # a tool the agent left running may hold the pipes open: read what is there, no more
        await asyncio.wait([output, errors], timeout=DRAIN_S)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
