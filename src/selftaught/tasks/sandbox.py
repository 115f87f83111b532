"""Run untrusted Python (model-written code) in a sandbox and report how it ended.

On Linux the code runs under bubblewrap (`bwrap`, Debian/Ubuntu package `bubblewrap`):

- new network namespace (no network at all, not even the host's loopback), new PID namespace
  (it sees only its own processes, and all of them are dead when `run` returns), new IPC and
  UTS namespaces;
- a fresh root holding only read-only binds of what the interpreter needs: its executable, its
  standard library and shared libraries (the system `lib` folders, `/etc/ld.so.cache`). Its
  `site-packages` are hidden (a virtualenv's too), and so are `$HOME`, the rest of `/etc`,
  the working tree and every other file; the program is copied in read-only under `/sandbox`;
- a private writable working directory, `/tmp`: a tmpfs capped at `WORKDIR_BYTES` that
  vanishes with the sandbox;
- an empty environment (no API keys), `--die-with-parent`, a new terminal session, and no
  privileges: as root, bwrap sets the namespaces up and the bootstrap drops to a throw-away
  unprivileged uid with no capabilities; as a user, bwrap uses an unprivileged user namespace.
  Either way a seccomp filter refuses new user namespaces, the kernel keyrings (the session
  keyring is inherited from selftaught's process) and the calls that hold memory outside the
  address space (memfd, SysV shared memory and message queues, POSIX message queues,
  io_uring);
- resource limits set by a small bootstrap before the code runs: address space, CPU seconds,
  file size, open files, no core dumps, and no new processes or threads (or at most
  `MAX_PROCESSES` with `allow_subprocesses`). A limit that cannot be set is an error, never
  silently skipped. There is no cgroup: memory is bounded by the address-space limit, the
  refused calls, the tmpfs cap and the open-file cap (pipes and sockets buffer a little).

A run passes only when the program ran to its end: the host puts a fresh nonce in a pipe, and
the bootstrap reads it and hands it back only after the code returned; an exit status of 0
proves nothing (`SystemExit`, `os._exit`, an `atexit` hook). This defeats exits a policy
stumbles on; code written to attack the harness, in the same process, can still read the
pipe itself.

Where bubblewrap is missing the code is refused (`SandboxError`, naming the package to install)
unless the caller opts into the resource-limits-only mode (`unsafe_exec=True`, the CLI's
`--unsafe-exec`): a child process with the same limits, an empty environment and a temporary
working directory, which can still read the user's files, keyrings and use the network (and,
run as root, start processes: the kernel exempts root from the process limit).

A failure of the sandbox itself (bwrap missing or broken, a limit not applied, the code never
started) raises `SandboxError`: an error, never a failed test, so it cannot become a score of 0.

The limits are set by the child's bootstrap rather than by `preexec_fn`, because `preexec_fn`
is unsafe when the parent has threads (rollouts score in worker threads) and can deadlock.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import math
import os
import platform
import secrets
import select
import shutil
import signal
import site
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from selftaught.errors import ConfigError
from selftaught.tasks.base import TaskError

TAIL_CHARS = 2000
MAX_OUTPUT_BYTES = 8 * 1024 * 1024  # per file: a runaway print loop gets EFBIG, not our disk
WORKDIR_BYTES = 64 * 1024 * 1024  # the sandbox's writable /tmp (memory-backed), all files
MAX_OPEN_FILES = 64  # per process: pipes and sockets hold kernel memory the AS limit misses
MAX_PROCESSES = 16  # when subprocesses are allowed: processes of the sandbox at once
BWRAP_ENV = "SELFTAUGHT_BWRAP"  # path of the bwrap binary, instead of looking it up on PATH
INSTALL_HINT = "apt-get install bubblewrap"
INSIDE_DIR = "/sandbox"  # where the program and its bootstrap appear inside the sandbox
INSIDE_WORKDIR = "/tmp"
STATUS_WAIT_S = 5.0  # after exit: how long to wait for the sandbox's last process to go
_SYSTEM_LIB_DIRS = ("/lib", "/lib64", "/lib32", "/libx32", "/usr/lib", "/usr/lib64", "/usr/lib32")
SYSTEM_TOOL_DIRS = ("/bin", "/usr/bin", "/usr/local/bin")  # with system_tools: sh, coreutils...
_PROGRAM_FILES = ("solution.py", "_bootstrap.py")
_THROWAWAY_UIDS = (1 << 30, (1 << 31) - 2)  # unprivileged uids that no account uses

UNSAFE_EXEC_WARNING = (
    "--unsafe-exec: where bubblewrap is missing, model-written code runs with resource limits "
    "only: it can read your files, write where you can, and use the network. And, even when "
    "bubblewrap is installed, reasoning-gym generators whose own scorers evaluate the answer "
    "as Python (gym:countdown, gym:puzzle24, gym:spiral_matrix, ...) are allowed, and that "
    "evaluation runs inside this selftaught process: no sandbox, no limits, your environment "
    "and files"
)


class SandboxError(TaskError):
    """The sandbox itself failed (bubblewrap missing or broken, a limit not applied, the code
    never started): an error to report, never a score."""


_BOOTSTRAP = """\
import os, resource, sys
_status, _proof = {status_fd}, {proof_fd}
# bound before the code runs, which may replace them
_write, _read, _exit, _excepthook = os.write, os.read, os._exit, sys.__excepthook__
def _fail(message):
    _write(_status, ("E" + message).encode("utf-8", "replace"))
    _exit(70)
for _name, _value in {limits!r}:
    try:
        resource.setrlimit(getattr(resource, _name), (_value, _value))
    except (ValueError, OSError) as _err:
        _fail(f"could not set the resource limit {{_name}} to {{_value}}: {{_err}}")
_path = {solution_path!r}
with open(_path, encoding="utf-8") as _f:
    _source = _f.read()
_uid = {drop_to_uid!r}
if _uid is not None:  # root set the sandbox up; the code runs as a throw-away user
    try:
        os.setgroups([])
        os.setresgid(_uid, _uid, _uid)
        os.setresuid(_uid, _uid, _uid)
    except OSError as _err:
        _fail(f"could not drop to the unprivileged uid {{_uid}}: {{_err}}")
    with open("/proc/self/status", encoding="ascii") as _f:
        _caps = [ln.split()[1] for ln in _f if ln.startswith(("CapEff:", "CapPrm:"))]
    if os.getresuid() != (_uid, _uid, _uid) or any(int(c, 16) for c in _caps):
        _fail("the sandboxed process kept root privileges")
_write(_status, b"S")  # the code starts now: whatever happens next is the code's doing
def _flush():
    for _stream in (sys.stdout, sys.stderr):
        try:
            _stream.flush()
        except BaseException:
            pass
try:
    _code = compile(_source, _path, "exec")
    exec(_code, {{"__name__": "__main__", "__file__": _path, "__builtins__": __builtins__}})
except SystemExit as _err:  # an exit inside the code is never a finished program
    _flush()
    _write(_status, b"X" + repr(_err).encode("utf-8", "replace")[:200])
    if not isinstance(_err.code, (int, type(None))):
        _write(2, (str(_err.code) + "\\n").encode("utf-8", "replace"))
    _exit(_err.code if isinstance(_err.code, int) else int(_err.code is not None))
except BaseException as _err:
    _excepthook(type(_err), _err, _err.__traceback__)
    _flush()
    _exit(1)
# The program ran to its end: hand back the host's nonce, read only now, and leave at once
# (no atexit hook, no late exit can change the outcome).
_flush()
try:
    _write(_status, b"P" + _read(_proof, 64))
except OSError:
    _exit(1)
_exit(0)
"""


@dataclass
class SandboxResult:
    """passed: the program ran to its end within the limits, proven by the host's per-run
    nonce, which the bootstrap reads and hands back only after the code returned (an exit
    status of 0 proves nothing: the code can exit early). The tails are the last characters
    of the output. early_exit: the SystemExit the code raised, if it did. isolated: ran under
    bubblewrap (False: resource limits only, `unsafe_exec`)."""

    passed: bool
    stdout_tail: str
    stderr_tail: str
    timed_out: bool
    returncode: int | None
    duration_s: float = 0.0
    memory_exceeded: bool = False
    isolated: bool = True
    early_exit: str = ""

    def summary(self, timeout_s: float | None = None) -> str:
        """One line saying why the run failed (or that it passed)."""
        if self.passed:
            return "passed"
        if self.timed_out:
            limit = f" after {timeout_s:g}s" if timeout_s is not None else ""
            return f"timed out{limit}"
        if self.memory_exceeded:
            return "ran out of memory (MemoryError under the sandbox memory limit)"
        if self.early_exit:
            return f"the code raised {self.early_exit} before the program ran to its end"
        detail = summarize_traceback(self.stderr_tail)
        if detail:
            return detail
        if self.returncode is not None and self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = str(-self.returncode)
            return f"killed by signal {name}"
        if self.returncode == 0:
            return (
                "exited with status 0 before the program ran to its end (an exit inside the "
                "code, such as os._exit)"
            )
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


def _read_status(fd: int, wait_s: float) -> bytes:
    """What the bootstrap wrote to the status pipe ("S": the code started; "E...": why it
    could not), read up to the pipe's end or for at most `wait_s`."""
    return _read_until(fd, time.monotonic() + wait_s, b"", limit=4096)


def _wait_readable(fd: int, deadline: float) -> bool:
    poller = select.poll()  # not select.select: it fails on fds past 1023
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, deadline - time.monotonic()) * 1000))


def _read_until(fd: int, deadline: float, stop: bytes, limit: int = 1 << 20) -> bytes:
    """Read `fd` until its end, the deadline, `limit` bytes, or (if `stop`) until `stop` has
    been read."""
    data = b""
    while not (stop and stop in data) and len(data) < limit and _wait_readable(fd, deadline):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data


# ---- what the sandbox sees --------------------------------------------------------------


def _interpreter() -> str:
    """The real interpreter binary (a virtualenv's `python` is a link to it)."""
    return os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)


def _covered(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


@functools.cache
def _filesystem() -> tuple[tuple[tuple[str, str], ...], tuple[str, ...], tuple[str, ...]]:
    """(symlinks as (target, path), read-only binds, folders hidden under an empty tmpfs):
    the interpreter, its standard library and shared libraries; not its site-packages."""
    links: list[tuple[str, str]] = []
    binds: list[str] = []
    for d in _SYSTEM_LIB_DIRS:
        if os.path.islink(d):
            links.append((os.readlink(d), d))
        elif os.path.isdir(d):
            binds.append(d)
    paths = sysconfig.get_paths()
    wanted = [
        _interpreter(),
        sysconfig.get_config_var("LIBDIR") or "",  # libpython and the libraries beside it
        paths["stdlib"],
        paths["platstdlib"],
        "/etc/ld.so.cache",
    ]
    for p in wanted:
        real = os.path.realpath(p) if p else ""
        if real and os.path.exists(real) and not _covered(real, binds):
            binds = [b for b in binds if not _covered(b, [real])] + [real]
    # a virtualenv's own lib folder is bound (it is sysconfig's platstdlib): hide its
    # site-packages too, not only the base interpreter's
    prefixes = list(
        dict.fromkeys([sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix])
    )
    hidden = [
        real
        for p in site.getsitepackages(prefixes)
        if os.path.isdir(real := os.path.realpath(p)) and _covered(real, binds)
    ]
    return tuple(links), tuple(binds), tuple(dict.fromkeys(hidden))


@functools.cache
def _tool_dirs(binds: tuple[str, ...]) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """(symlinks, read-only binds) that show the system's program folders, beyond `binds`."""
    links: list[tuple[str, str]] = []
    extra: list[str] = []
    for d in SYSTEM_TOOL_DIRS:
        if os.path.islink(d):
            links.append((os.readlink(d), d))
        elif os.path.isdir(d) and not _covered(d, list(binds)):
            extra.append(d)
    return tuple(links), tuple(extra)


def _parents(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


# seccomp, per machine: the audit arch, clone and unshare (their flags are checked), and the
# calls refused outright: the kernel keyrings (add_key, request_key, keyctl: the parent's
# session keyring is inherited) and memory the address-space limit does not count
# (memfd_create, memfd_secret, SysV shared memory and message queues, POSIX message queues,
# io_uring). clone3 hides its flags, so it gets ENOSYS and libc falls back to clone.
class _Syscalls(TypedDict):
    arch: int
    clone: int
    unshare: int
    clone3: int
    refused: tuple[int, ...]


_SECCOMP: dict[str, _Syscalls] = {
    "x86_64": {
        "arch": 0xC000003E,
        "clone": 56,
        "unshare": 272,
        "clone3": 435,
        "refused": (248, 249, 250, 319, 447, 29, 68, 240, 425),
    },
    "aarch64": {
        "arch": 0xC00000B7,
        "clone": 220,
        "unshare": 97,
        "clone3": 435,
        "refused": (217, 218, 219, 279, 447, 194, 186, 180, 425),
    },
}
_CLONE_NEWUSER = 0x10000000


@functools.cache
def _seccomp_filter() -> bytes | None:
    """The seccomp program (classic BPF) bwrap installs before the interpreter starts: no new
    user namespaces (through one, code could mount a tmpfs of unbounded size; bwrap's
    --disable-userns does this only when it made a user namespace itself, which it does not
    when run as root), and none of the `refused` calls (EPERM). None on other machines."""
    table = _SECCOMP.get(platform.machine())
    if table is None:
        return None
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|..|K
    allow, errno_ret = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO
    refused = table["refused"]
    # (code, label if true, label if false, k), labels resolved to relative jumps below
    program: list[tuple[int | str, str | int, str | int, int]] = [
        (load, 0, 0, 4),  # the syscall's ABI
        (jeq, 0, "eperm", table["arch"]),  # another ABI (32-bit calls): refuse
        (load, 0, 0, 0),  # the syscall number
        (jge, "eperm", 0, 0x40000000),  # x32 calls: refuse
        (jeq, "enosys", 0, table["clone3"]),
        (jeq, "flags", 0, table["clone"]),
        (jeq, "flags", 0, table["unshare"]),
        *[(jeq, "eperm", 0, number) for number in refused],
        (ret, 0, 0, allow),
        ("flags", 0, 0, 0),  # label
        (load, 0, 0, 16),  # the flags (first argument, low half)
        (jset, "eperm", 0, _CLONE_NEWUSER),
        (ret, 0, 0, allow),
        ("eperm", 0, 0, 0),
        (ret, 0, 0, errno_ret | errno.EPERM),
        ("enosys", 0, 0, 0),
        (ret, 0, 0, errno_ret | errno.ENOSYS),
    ]
    return _assemble(program)


def _assemble(program: list[tuple[int | str, str | int, str | int, int]]) -> bytes:
    """Classic BPF bytes from instructions whose jumps name labels; a label is an
    instruction whose code is a string."""
    labels: dict[str, int] = {}
    instructions: list[tuple[int, str | int, str | int, int]] = []
    for code, jt, jf, k in program:
        if isinstance(code, str):
            labels[code] = len(instructions)
        else:
            instructions.append((code, jt, jf, k))

    def offset(target: str | int, at: int) -> int:
        return labels[target] - at - 1 if isinstance(target, str) else target

    return b"".join(
        struct.pack("=HBBI", code, offset(jt, i), offset(jf, i), k)
        for i, (code, jt, jf, k) in enumerate(instructions)
    )


def _bwrap_args(
    as_root: bool, copies: dict[str, int], seccomp_fd: int | None, system_tools: bool = False
) -> list[str]:
    """bwrap's options: namespaces, privileges, then the new root's contents. `copies` maps a
    path inside to an open file whose content is copied there, read-only; `seccomp_fd` is an
    open file holding the seccomp program; `system_tools` adds the system's program folders."""
    if as_root:  # bwrap is privileged; the bootstrap drops to a throw-away uid
        args = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:  # an unprivileged user namespace, and no nested ones
        args = ["--unshare-all", "--unshare-user", "--disable-userns"]
    args += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    links, binds, hidden = _filesystem()
    if system_tools:
        tool_links, tool_binds = _tool_dirs(binds)
        links, binds = links + tool_links, binds + tool_binds
    made: set[str] = {"/"}
    for dest in [*binds, *copies]:
        for parent in _parents(dest):  # world-traversable, whatever the host's modes are
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
    for target, path in links:
        args += ["--symlink", target, path]
    for path in binds:
        args += ["--ro-bind", path, path]
    for path in hidden:
        args += ["--tmpfs", path, "--remount-ro", path]
    for path, fd in copies.items():
        args += ["--perms", "0444", "--ro-bind-data", str(fd), path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", str(WORKDIR_BYTES), "--tmpfs", INSIDE_WORKDIR]
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", INSIDE_WORKDIR]
    return args


# ---- running ----------------------------------------------------------------------------


def _limits(timeout_s: float, memory_mb: int, nproc: int | None) -> list[tuple[str, int]]:
    limits = [
        ("RLIMIT_AS", memory_mb * 1024 * 1024),
        ("RLIMIT_CPU", math.ceil(timeout_s) + 1),
        ("RLIMIT_CORE", 0),
        ("RLIMIT_FSIZE", MAX_OUTPUT_BYTES),
        ("RLIMIT_NOFILE", MAX_OPEN_FILES),  # each open file can hold memory: keep them few
    ]
    return limits + ([("RLIMIT_NPROC", nproc)] if nproc is not None else [])


@dataclass(frozen=True)
class Sandbox:
    """Where code runs: under bubblewrap (`bwrap` is its path), or, when `bwrap` is None, with
    resource limits only (the opt-in unsafe mode). Get one from `open_sandbox`."""

    bwrap: str | None

    @property
    def isolated(self) -> bool:
        return self.bwrap is not None

    def describe(self) -> str:
        if self.bwrap is None:
            return "resource limits only (unsafe_exec: no isolation from files or network)"
        return f"bubblewrap ({self.bwrap})"

    def run(
        self,
        code: str,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        *,
        allow_subprocesses: bool = False,
        files: Mapping[str, Path] | None = None,
        system_tools: bool = False,
    ) -> SandboxResult:
        """Run `code` as a script in a limited child process and report how it ended.
        `files` (name -> a file on the host) are copied in read-only beside the script (the
        code finds them next to its `__file__`); `system_tools` also shows it the system's
        programs (`SYSTEM_TOOL_DIRS`, read-only), for code that runs a command.
        Raises SandboxError when the sandbox, not the code, failed."""
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be positive, got {timeout_s}")
        if memory_mb <= 0:
            raise ConfigError(f"memory_mb must be positive, got {memory_mb}")
        with tempfile.TemporaryDirectory(prefix="selftaught-sandbox-") as tmp:
            host_dir = Path(tmp)
            for name, source in (files or {}).items():
                if name in _PROGRAM_FILES or "/" in name:
                    raise ConfigError(f"a sandbox file cannot be named {name!r}")
                shutil.copyfile(source, host_dir / name)
            return self._run_in(
                host_dir,
                code,
                timeout_s,
                memory_mb,
                allow_subprocesses,
                tuple(files or ()),
                system_tools,
            )

    def _run_in(
        self,
        host_dir: Path,
        code: str,
        timeout_s: float,
        memory_mb: int,
        subprocesses: bool,
        files: tuple[str, ...] = (),
        system_tools: bool = False,
    ) -> SandboxResult:
        as_root = self.bwrap is not None and os.geteuid() == 0
        inside = Path(INSIDE_DIR) if self.bwrap else host_dir
        # In the sandbox the process limit counts only its own processes; without it, only
        # "none" can be enforced (a count would include every process of the user).
        nproc = 0 if not subprocesses else (MAX_PROCESSES if self.bwrap else None)
        status_read, status_write = os.pipe()
        nonce, proof_read = _nonce_pipe()
        bootstrap = _BOOTSTRAP.format(
            status_fd=status_write,
            proof_fd=proof_read,
            limits=_limits(timeout_s, memory_mb, nproc),
            solution_path=str(inside / "solution.py"),
            drop_to_uid=_throwaway_uid() if as_root else None,
        )
        (host_dir / "solution.py").write_text(code, encoding="utf-8")
        (host_dir / "_bootstrap.py").write_text(bootstrap, encoding="utf-8")
        # -I: isolated (ignores PYTHON* variables and user site); -B: no .pyc files
        python_args = ["-I", "-B", str(inside / "_bootstrap.py")]
        command = [sys.executable, *python_args]
        opened = [status_write, proof_read]
        info: tuple[int, int] | None = None
        try:
            if self.bwrap:
                copies, seccomp = _open_for_bwrap(host_dir, opened, files)
                options = _bwrap_args(as_root, copies, seccomp, system_tools)
                info = os.pipe()  # its write end is _execute's to close
                command = [self.bwrap, "--info-fd", str(info[1]), *options, "--", _interpreter()]
                command += python_args
            outcome = _execute(command, host_dir, tuple(opened), timeout_s, info)
        finally:
            for fd in opened + ([info[0]] if info else []):
                os.close(fd)
            status = _read_status(status_read, STATUS_WAIT_S)
            os.close(status_read)
        return self._result(host_dir, status, nonce, timeout_s, *outcome)

    def _result(
        self,
        host_dir: Path,
        status: bytes,
        nonce: bytes,
        timeout_s: float,
        returncode: int | None,
        timed_out: bool,
        duration: float,
    ) -> SandboxResult:
        stdout_tail = _read_tail(host_dir / "stdout.txt")
        stderr_tail = _read_tail(host_dir / "stderr.txt")
        _check_started(status, timed_out, timeout_s, stderr_tail, self.describe())
        if self.bwrap and returncode is not None and 128 < returncode <= 128 + 64:
            returncode = -(returncode - 128)  # bwrap reports "killed by signal N" as 128 + N
        if returncode == -signal.SIGXCPU:  # the CPU limit is the timeout's backstop
            timed_out = True
        error_lines = stderr_tail.strip().splitlines()
        finished = status.endswith(b"P" + nonce)  # see _BOOTSTRAP: only after the code returned
        early_exit = status[2:].decode("utf-8", "replace") if status.startswith(b"SX") else ""
        return SandboxResult(
            passed=finished and returncode == 0 and not timed_out,
            stdout_tail=stdout_tail,
            stderr_tail=stderr_tail,
            timed_out=timed_out,
            returncode=returncode,
            duration_s=duration,
            memory_exceeded=bool(error_lines) and error_lines[-1].startswith("MemoryError"),
            isolated=self.isolated,
            early_exit=early_exit,
        )


def _nonce_pipe() -> tuple[bytes, int]:
    """A fresh nonce, and the read end of a pipe holding it. The bootstrap reads it only
    after the code returned, so the code never holds it unless it goes looking for it."""
    nonce = secrets.token_hex(16).encode()
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, nonce)
    finally:
        os.close(write_end)
    return nonce, read_end


def _open_for_bwrap(
    host_dir: Path, opened: list[int], files: tuple[str, ...] = ()
) -> tuple[dict[str, int], int | None]:
    """Open the program files and the caller's `files` (copied into the sandbox, so the host
    folder stays private) and the seccomp program; every fd opened is appended to `opened`."""
    copies = {}
    for name in (*_PROGRAM_FILES, *files):
        opened.append(os.open(host_dir / name, os.O_RDONLY))
        copies[f"{INSIDE_DIR}/{name}"] = opened[-1]
    seccomp = _seccomp_filter()
    if seccomp is None:
        return copies, None
    (host_dir / "seccomp.bpf").write_bytes(seccomp)
    opened.append(os.open(host_dir / "seccomp.bpf", os.O_RDONLY))
    return copies, opened[-1]


def _throwaway_uid() -> int:
    """A random uid no account uses, so no two sandboxes share one (process counts are per
    uid)."""
    low, high = _THROWAWAY_UIDS
    return low + secrets.randbelow(high - low)


def _execute(
    command: list[str],
    workdir: Path,
    pass_fds: tuple[int, ...],
    timeout_s: float,
    info_pipe: tuple[int, int] | None = None,
) -> tuple[int | None, bool, float]:
    """Run the command with output to files in `workdir`: (returncode, timed out, seconds).
    Under bwrap, `info_pipe` carries bwrap's --info-fd: through it the sandbox's init process
    is found, killed at the end and waited for, so that when this returns every process of the
    sandbox is gone (the kernel kills a PID namespace's processes before its init exits)."""
    start = time.monotonic()
    deadline = start + timeout_s
    keep = pass_fds + ((info_pipe[1],) if info_pipe else ())
    try:
        with open(workdir / "stdout.txt", "wb") as out, open(workdir / "stderr.txt", "wb") as err:
            proc = subprocess.Popen(
                command,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env={},  # nothing of the parent's environment (API keys) reaches the code
                start_new_session=True,
                close_fds=True,
                pass_fds=keep,
            )
    except OSError as err:
        raise SandboxError(f"could not start {command[0]}: {err}") from None
    finally:
        if info_pipe:  # closed at once, so that a bwrap failing early gives an end of file
            os.close(info_pipe[1])
    init = None
    try:
        init = _open_init(info_pipe[0], deadline) if info_pipe else None
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:  # the run is over (or interrupted): nothing it started may stay
        _kill_group(proc)
        proc.wait()
        if init is not None:
            _kill_and_wait(init)
    duration = time.monotonic() - start
    return (None if timed_out else proc.returncode), timed_out, duration


def _open_init(info_fd: int, deadline: float) -> int | None:
    """A pidfd for the sandbox's init, from the JSON bwrap writes to its --info-fd; None when
    bwrap failed first or this kernel has no pidfds."""
    data = _read_until(info_fd, deadline, b"}")
    try:
        return os.pidfd_open(int(json.loads(data)["child-pid"]))
    except (ValueError, KeyError, TypeError, OSError, AttributeError):
        return None


def _kill_and_wait(pidfd: int) -> None:
    """Kill the sandbox's init and wait until it has exited. Once bwrap is gone the init is
    an orphan: reap it if it came to us (we are a container's PID 1 or a subreaper), or such
    zombies would pile up over thousands of runs; otherwise its new parent reaps it."""
    with contextlib.suppress(OSError):  # it may have exited already
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    try:
        _wait_readable(pidfd, time.monotonic() + STATUS_WAIT_S)  # readable once it has exited
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except (OSError, AttributeError):
        pass  # reaped already, or not our child
    finally:
        os.close(pidfd)


def _check_started(
    status: bytes, timed_out: bool, timeout_s: float, stderr_tail: str, where: str
) -> None:
    """Raise SandboxError unless the bootstrap said the code started."""
    if status.startswith(b"S"):
        return
    if status.startswith(b"E"):
        reason = status[1:].decode("utf-8", "replace")
    elif timed_out:
        reason = f"the code had not started after {timeout_s:g}s"
    else:
        last = stderr_tail.strip().splitlines()
        reason = last[-1] if last else "no error message"
    raise SandboxError(f"the sandbox failed before running the code ({where}): {reason}")


# ---- choosing the sandbox ---------------------------------------------------------------


def find_bwrap(bwrap: str | None = None) -> str | None:
    """bwrap's path: the argument, else $SELFTAUGHT_BWRAP, else bwrap on PATH; None if absent."""
    chosen = bwrap or os.environ.get(BWRAP_ENV)
    if chosen:
        return chosen if os.path.isfile(chosen) and os.access(chosen, os.X_OK) else None
    return shutil.which("bwrap")


_checked: set[str | None] = set()
_check_lock = threading.Lock()


def _namespace_hint(as_root: bool) -> str:
    if as_root:
        return (
            "this machine or container does not let root create namespaces (in Docker: "
            "--security-opt seccomp=unconfined --cap-add SYS_ADMIN)"
        )
    for path, bad in (
        ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
        ("/proc/sys/user/max_user_namespaces", "0"),
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"),
    ):
        try:
            if Path(path).read_text().strip() == bad:
                name = path.removeprefix("/proc/sys/").replace("/", ".")
                return f"unprivileged user namespaces are disabled here ({name} = {bad})"
        except OSError:
            continue
    return "unprivileged user namespaces are probably disabled here"


def _check(sandbox: Sandbox) -> None:
    """Run a few imports in the sandbox, once per process and bwrap path; SandboxError if the
    sandbox cannot start, set its limits or read the standard library."""
    with _check_lock:
        if sandbox.bwrap in _checked:
            return
        probe = "import collections, hashlib, json, math, re\nprint('ok')\n"
        try:
            result = sandbox.run(probe, timeout_s=30.0, memory_mb=512)
        except SandboxError as err:
            if sandbox.bwrap is None:
                raise
            raise SandboxError(
                f"bubblewrap is installed but could not start a sandbox ({err}); "
                f"{_namespace_hint(os.geteuid() == 0)}; or pass --unsafe-exec (unsafe_exec=True)"
                " to run model-written code with resource limits only"
            ) from None
        if not result.passed or result.stdout_tail != "ok\n":
            raise SandboxError(
                f"the sandbox cannot run Python's standard library from {_interpreter()} "
                f"({result.summary()}); its files must be readable by other users"
            )
        _checked.add(sandbox.bwrap)


def open_sandbox(*, unsafe_exec: bool = False, bwrap: str | None = None) -> Sandbox:
    """The sandbox to run model-written code in: bubblewrap when it is installed and works
    (checked once per process); else, only if `unsafe_exec`, resource limits only; else
    SandboxError naming the package to install."""
    found = find_bwrap(bwrap)
    if found is not None or unsafe_exec:
        sandbox = Sandbox(found)
        _check(sandbox)
        return sandbox
    where = "bubblewrap runs on Linux only" if sys.platform != "linux" else INSTALL_HINT
    raise SandboxError(
        "bubblewrap (bwrap) is not installed, so model-written code cannot run in a sandbox: "
        f"install it ({where}) or pass --unsafe-exec (unsafe_exec=True) to run it with "
        "resource limits only"
    )


def run_python(
    code: str,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    *,
    allow_subprocesses: bool = False,
    unsafe_exec: bool = False,
    bwrap: str | None = None,
) -> SandboxResult:
    """Run `code` as a script in the sandbox (see `open_sandbox`) and report how it ended."""
    sandbox = open_sandbox(unsafe_exec=unsafe_exec, bwrap=bwrap)
    return sandbox.run(code, timeout_s, memory_mb, allow_subprocesses=allow_subprocesses)
