"""Escape attempts against the bubblewrap sandbox: each must fail, and the test checks on the
host that its effect did not happen. A few run again in the resource-limits-only mode
(`unsafe_exec`) as controls: there they succeed, which shows the checks can see an escape."""

from __future__ import annotations

import ast
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path

import pytest

from selftaught.tasks.sandbox import (
    BWRAP_ENV,
    MAX_OPEN_FILES,
    MAX_OUTPUT_BYTES,
    MAX_PROCESSES,
    WORKDIR_BYTES,
    Sandbox,
    SandboxError,
    SandboxResult,
    find_bwrap,
    open_sandbox,
    run_python,
)

requires_bwrap = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return open_sandbox()


def run(sandbox: Sandbox, code: str, **kwargs) -> SandboxResult:
    kwargs.setdefault("timeout_s", 10.0)
    return sandbox.run(textwrap.dedent(code), **kwargs)


def attempts(**named: str) -> str:
    """A program trying each named statement; prints ESCAPED name or BLOCKED name: error."""
    lines = ["import os, socket, subprocess, sys"]
    for name, statement in named.items():
        lines += [
            "try:",
            textwrap.indent(textwrap.dedent(statement).strip(), "    "),
            f"    print('ESCAPED {name}', flush=True)",
            "except Exception as err:",
            f"    print('BLOCKED {name}:', type(err).__name__, err, flush=True)",
        ]
    return "\n".join(lines) + "\n"


def assert_all_blocked(result: SandboxResult, *names: str) -> None:
    assert result.isolated
    assert "ESCAPED" not in result.stdout_tail, result.stdout_tail
    for name in names:
        assert f"BLOCKED {name}:" in result.stdout_tail, (name, result.stdout_tail)


def processes_with(token: str) -> list[int]:
    """Host pids whose command line holds `token` (zombies have none)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if token.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


# ---- files ------------------------------------------------------------------------------


@requires_bwrap
def test_cannot_read_a_planted_file_outside_its_folder(sandbox, tmp_path):
    secret = tmp_path / "secret.txt"
    token = secrets.token_hex(8)
    secret.write_text(token)
    code = attempts(
        open=f"print(open({str(secret)!r}).read())",
        via_proc_root=f"print(open('/proc/1/root' + {str(secret)!r}).read())",
        listdir=f"print(os.listdir({str(tmp_path)!r}))",
    )
    result = run(sandbox, code)
    assert_all_blocked(result, "open", "via_proc_root", "listdir")
    assert token not in result.stdout_tail


def test_control_without_the_sandbox_the_planted_file_is_read(tmp_path):
    secret = tmp_path / "secret.txt"
    token = secrets.token_hex(8)
    secret.write_text(token)
    unsafe = Sandbox(None)
    result = unsafe.run(attempts(open=f"print(open({str(secret)!r}).read())"))
    assert not result.isolated and "ESCAPED open" in result.stdout_tail
    assert token in result.stdout_tail


@requires_bwrap
def test_cannot_write_delete_or_rename_outside_its_folder(sandbox, tmp_path):
    planted = tmp_path / "planted.txt"
    planted.write_text("original")
    token = secrets.token_hex(8)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    in_stdlib = stdlib / f"selftaught-escape-{token}.txt"
    code = attempts(
        write=f"open({str(tmp_path / 'new.txt')!r}, 'w').write('x')",
        append=f"open({str(planted)!r}, 'a').write('changed')",
        delete=f"os.remove({str(planted)!r})",
        rename=f"os.rename({str(planted)!r}, {str(tmp_path / 'moved.txt')!r})",
        write_stdlib=f"open({str(in_stdlib)!r}, 'w').write('x')",
        write_root="open('/escape.txt', 'w').write('x')",
        write_dev="open('/dev/escape.txt', 'w').write('x')",
        write_tmp_host_path=f"open('/tmp/../{tmp_path.name}.txt', 'w').write('x')",
    )
    try:
        result = run(sandbox, code)
        assert_all_blocked(result, "write", "append", "delete", "rename", "write_stdlib")
        assert_all_blocked(result, "write_root", "write_dev")
        assert not in_stdlib.exists()
    finally:
        in_stdlib.unlink(missing_ok=True)
    assert planted.read_text() == "original"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["planted.txt"]
    assert not Path(f"/tmp/{tmp_path.name}.txt").exists()


@requires_bwrap
def test_its_own_folder_is_writable_and_gone_afterwards(sandbox):
    token = secrets.token_hex(8)
    result = run(
        sandbox,
        f"""
        import os
        open('scratch-{token}.txt', 'w').write('kept for this run only')
        print(open('scratch-{token}.txt').read(), os.getcwd())
        """,
    )
    assert result.passed and result.stdout_tail.startswith("kept for this run only")
    assert not list(Path("/tmp").glob(f"**/scratch-{token}.txt"))


@requires_bwrap
def test_cannot_list_home(sandbox):
    home = Path.home()
    token = secrets.token_hex(8)
    planted = home / f".selftaught-sandbox-test-{secrets.token_hex(8)}"
    planted.write_text(token)
    try:
        assert planted.name in os.listdir(home)  # the host sees it
        code = attempts(
            listdir=f"print(os.listdir({str(home)!r})); assert {planted.name!r} in "
            f"os.listdir({str(home)!r})",
            read=f"print(open({str(planted)!r}).read())",
            expanduser="p = os.path.expanduser('~'); print(p, os.listdir(p))\n"
            f"assert {planted.name!r} in os.listdir(p)",
        )
        result = run(sandbox, code)
    finally:
        planted.unlink()
    assert_all_blocked(result, "listdir", "read", "expanduser")
    assert token not in result.stdout_tail


@requires_bwrap
def test_sees_the_standard_library_but_not_site_packages(sandbox):
    import pytest as installed  # installed in the host's site-packages

    assert Path(installed.__file__).exists()
    result = run(sandbox, attempts(pytest="import pytest", typer="import typer"))
    assert_all_blocked(result, "pytest", "typer")
    assert run(sandbox, "import json, math, sqlite3, hashlib, ctypes\nprint('ok')").passed


# ---- network ----------------------------------------------------------------------------


def _listening_server() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    return server


def _connections(server: socket.socket) -> int:
    n = 0
    while True:
        try:
            conn, _ = server.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


CONNECT = "socket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'hello')"


@requires_bwrap
def test_cannot_reach_a_loopback_server_of_the_host(sandbox):
    with _listening_server() as server:
        port = server.getsockname()[1]
        result = run(sandbox, attempts(tcp=CONNECT.format(port=port)))
        assert_all_blocked(result, "tcp")
        assert _connections(server) == 0


def test_control_without_the_sandbox_the_server_sees_the_connection():
    with _listening_server() as server:
        port = server.getsockname()[1]
        result = Sandbox(None).run(attempts(tcp=CONNECT.format(port=port)))
        assert "ESCAPED tcp" in result.stdout_tail
        assert _connections(server) == 1


@requires_bwrap
def test_cannot_resolve_a_host_name(sandbox):
    assert socket.getaddrinfo("localhost", 80)  # the host resolves it
    code = attempts(
        localhost="print(socket.getaddrinfo('localhost', 80))",
        public="print(socket.getaddrinfo('pypi.org', 443))",
        udp_dns="s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.sendto(b'x', ('8.8.8.8', 53))",
    )
    assert_all_blocked(run(sandbox, code), "localhost", "public", "udp_dns")


# ---- processes --------------------------------------------------------------------------


@requires_bwrap
def test_no_new_process_by_default(sandbox):
    code = attempts(
        fork="pid = os.fork()\nif pid == 0:\n    print('CHILD RAN', flush=True)\n    os._exit(0)\n"
        "os.waitpid(pid, 0)",
        subprocess="subprocess.run([sys.executable, '-c', 'print(\"CHILD RAN\")'], check=True)",
        thread="import threading\nt = threading.Thread(target=print, args=('CHILD RAN',))\n"
        "t.start(); t.join()",
    )
    result = run(sandbox, code)
    assert_all_blocked(result, "fork", "subprocess", "thread")
    assert "CHILD RAN" not in result.stdout_tail


@requires_bwrap
def test_subprocesses_when_allowed_are_capped_in_number(sandbox):
    code = f"""
    import os, subprocess, sys, time
    out = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True)
    print('subprocess said', out.stdout.strip())
    started = 0
    for _ in range({MAX_PROCESSES * 3}):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(2)
            os._exit(0)
        started += 1
    print('forked', started)
    """
    result = run(sandbox, code, allow_subprocesses=True)
    assert result.passed, result.stderr_tail
    assert "subprocess said 42" in result.stdout_tail
    started = int(result.stdout_tail.split("forked")[1])
    assert 0 < started < MAX_PROCESSES


@requires_bwrap
@pytest.mark.parametrize("ends_by", ["exit", "timeout"])
def test_a_detached_child_does_not_outlive_the_run(sandbox, ends_by):
    token = f"selftaught-outlive-{secrets.token_hex(8)}"
    code = f"""
    import os, subprocess, sys, time
    # a new session, then a double fork: the grandchild belongs to no one we spawned
    os.setsid()
    subprocess.Popen([sys.executable, '-c', 'import os, time\\nif os.fork() == 0:\\n'
                      '    os.setsid(); time.sleep(60)', {token!r}], start_new_session=True)
    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}],
                     start_new_session=True)
    time.sleep(0.5)
    print('spawned', flush=True)
    {"while True: pass" if ends_by == "timeout" else ""}
    """
    result = run(sandbox, code, timeout_s=3.0, allow_subprocesses=True)
    assert "spawned" in result.stdout_tail, result.stderr_tail
    assert result.timed_out == (ends_by == "timeout")
    assert processes_with(token) == []


SUBREAPER_SCRIPT = """
import ctypes, os
# PR_SET_CHILD_SUBREAPER: orphans come to this process, as they do to a container's PID 1
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
from selftaught.tasks.sandbox import open_sandbox
sandbox = open_sandbox()
for _ in range(3):
    sandbox.run('print(1)')
sandbox.run('while True: pass', timeout_s=0.5)
zombies = 0
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        state, ppid = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[:2]
    except OSError:
        continue
    zombies += state == 'Z' and int(ppid) == os.getpid()
print(zombies)
"""


@requires_bwrap
def test_no_zombies_pile_up_when_selftaught_is_a_containers_init():
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-c", SUBREAPER_SCRIPT], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "0", proc.stdout + proc.stderr


@requires_bwrap
def test_cannot_read_the_environment_of_other_processes(sandbox, monkeypatch):
    token = secrets.token_hex(12)
    monkeypatch.setenv("SELFTAUGHT_SECRET_FOR_TEST", token)
    helper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        env={**os.environ, "SELFTAUGHT_SECRET_FOR_TEST": token},
    )
    try:
        code = f"""
        import os
        pids = [1, {os.getpid()}, {helper.pid}, os.getppid()]
        pids += [int(p) for p in os.listdir('/proc') if p.isdigit()]
        for pid in pids:
            try:
                print(pid, open(f'/proc/{{pid}}/environ', 'rb').read())
            except OSError as err:
                print(pid, 'BLOCKED', type(err).__name__)
        print('own', dict(os.environ))
        """
        result = run(sandbox, code)
    finally:
        helper.kill()
        helper.wait()
    assert result.passed, result.stderr_tail
    assert token not in result.stdout_tail and "SELFTAUGHT" not in result.stdout_tail
    own = result.stdout_tail.split("own ", 1)[1]
    assert set(ast.literal_eval(own)) <= {"PWD", "LC_CTYPE"}, (
        own
    )  # bwrap's and Python's own, nothing else


NEW_USER_NAMESPACE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
os.makedirs('/tmp/m', exist_ok=True)
if libc.mount(b'none', b'/tmp/m', b'tmpfs', 0, None) != 0:  # a tmpfs without a size cap
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
"""


@requires_bwrap
def test_cannot_create_a_user_namespace_and_mount_an_unbounded_tmpfs(sandbox):
    result = run(sandbox, attempts(userns=NEW_USER_NAMESPACE))
    assert_all_blocked(result, "userns")
    threads = "import threading\nt = threading.Thread(target=print, args=('thread ran',))\n"
    assert run(sandbox, threads + "t.start(); t.join()", allow_subprocesses=True).passed


# ---- resources --------------------------------------------------------------------------


@requires_bwrap
def test_memory_hog_is_stopped(sandbox):
    result = run(sandbox, "x = bytearray(2 * 1024**3)\nprint('allocated')", memory_mb=256)
    assert not result.passed and result.memory_exceeded
    assert "allocated" not in result.stdout_tail


@requires_bwrap
def test_infinite_loop_is_killed_at_the_timeout(sandbox):
    token = f"selftaught-loop-{secrets.token_hex(8)}"
    result = run(sandbox, f"import sys\nsys.argv.append({token!r})\nwhile True: pass", timeout_s=1)
    assert result.timed_out and not result.passed and result.summary(1) == "timed out after 1s"
    assert processes_with(token) == []


@requires_bwrap
def test_a_1gb_write_is_cut_short(sandbox):
    code = attempts(
        one_file="with open('big', 'wb') as f:\n    for _ in range(1024): f.write(b'x' * 1024**2)",
        many_files=f"for i in range({2 * WORKDIR_BYTES // MAX_OUTPUT_BYTES + 2}):\n"
        f"    with open(f'part{{i}}', 'wb') as f: f.write(b'x' * ({MAX_OUTPUT_BYTES} - 1))",
    )
    result = run(sandbox, code + "print(sum(os.path.getsize(p) for p in os.listdir('.')))")
    assert_all_blocked(result, "one_file", "many_files")
    assert "File too large" in result.stdout_tail and "No space left" in result.stdout_tail
    assert int(result.stdout_tail.strip().splitlines()[-1]) <= WORKDIR_BYTES
    to_stdout = run(
        sandbox,
        "import sys\ntry:\n    for _ in range(1024): sys.stdout.buffer.write(b'.' * 1024**2)\n"
        "except OSError as err:\n    sys.stderr.write(f'BLOCKED {err}')",
    )
    assert "BLOCKED [Errno 27] File too large" in to_stdout.stderr_tail


# Memory outside the address space, held as long as the program runs: memfd and SysV shared
# memory (which RLIMIT_AS does not count), SysV message queues, and many open pipes. Prints
# what each attempt held, in MiB, then the total.
HOLD_MEMORY = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
held, keep = {}, []
def attempt(name, fn):
    try:
        fn()
    except Exception as err:
        print('BLOCKED', name, type(err).__name__, flush=True)
def memfd():
    for _ in range(40):  # 40 files of 8 MiB (RLIMIT_FSIZE caps one file)
        fd = os.memfd_create('hold')
        keep.append(fd)
        os.write(fd, b'x' * ((8 << 20) - 1))
        held['memfd'] = held.get('memfd', 0) + 8
def shm():
    libc.shmat.restype = ctypes.c_void_p
    for _ in range(40):
        sid = libc.shmget(0, 8 << 20, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
        if sid < 0:
            raise OSError(ctypes.get_errno(), 'shmget')
        addr = libc.shmat(sid, None, 0)
        ctypes.memset(addr, 1, 8 << 20)
        libc.shmdt(ctypes.c_void_p(addr))  # detached: no longer in the address space
        held['shm'] = held.get('shm', 0) + 8
def msgq():
    if libc.msgget(0, 0o1000 | 0o600) < 0:
        raise OSError(ctypes.get_errno(), 'msgget')
def pipes():
    for _ in range(200):
        r, w = os.pipe()
        keep.extend((r, w))
        os.set_blocking(w, False)
        try:
            while True:
                os.write(w, b'x' * 4096)
                held['pipes'] = held.get('pipes', 0) + 4096 / 2**20
        except BlockingIOError:
            pass
for name, fn in [('memfd', memfd), ('shm', shm), ('msgq', msgq), ('pipes', pipes)]:
    attempt(name, fn)
print('HELD', held, round(sum(held.values())))
"""


@requires_bwrap
def test_memory_outside_the_address_space_is_refused_or_bounded(sandbox):
    result = run(sandbox, HOLD_MEMORY, memory_mb=256)
    out = result.stdout_tail
    for name in ("memfd", "shm", "msgq"):
        assert f"BLOCKED {name} PermissionError" in out, (name, out, result.stderr_tail)
    assert "BLOCKED pipes OSError" in out  # EMFILE: RLIMIT_NOFILE
    total_mib = int(out.strip().splitlines()[-1].split()[-1])
    assert total_mib <= MAX_OPEN_FILES // 2 * 64 // 1024 + 1, out  # 64 KiB a pipe at most


def test_control_without_the_sandbox_memfd_holds_memory_past_the_limit():
    result = Sandbox(None).run(HOLD_MEMORY, timeout_s=20.0, memory_mb=256)
    assert not result.isolated and "'memfd': 320" in result.stdout_tail, result.stdout_tail


KEYRING_SCRIPT = """
import ctypes, json, platform, sys
from selftaught.tasks.sandbox import Sandbox, find_bwrap
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL = {'x86_64': (248, 250), 'aarch64': (217, 219)}[platform.machine()]
# a session keyring of this process's own, so that the test leaves the caller's alone
if libc.syscall(KEYCTL, 1, None) < 0:  # KEYCTL_JOIN_SESSION_KEYRING, anonymous
    sys.exit('cannot make a session keyring: errno ' + str(ctypes.get_errno()))
secret = sys.argv[1].encode()
key = libc.syscall(ADD_KEY, b'user', b'selftaught-test', secret, len(secret), -3)  # @s
if key < 0:
    sys.exit('cannot add a key: errno ' + str(ctypes.get_errno()))
probe = (
    'import ctypes\\n'
    'libc = ctypes.CDLL(None, use_errno=True)\\n'
    'buf = ctypes.create_string_buffer(256)\\n'
    f'n = libc.syscall({KEYCTL}, 11, {key}, buf, 256)\\n'  # KEYCTL_READ
    'print("READ", buf.raw[:n] if n > 0 else ctypes.get_errno())\\n'
)
mode = Sandbox(find_bwrap() if sys.argv[2] == 'bwrap' else None)
print(json.dumps(mode.run(probe).stdout_tail))
"""


@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=requires_bwrap), "unsafe"])
def test_cannot_read_the_parents_session_keyring(mode):
    token = secrets.token_hex(12)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-c", KEYRING_SCRIPT, token, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0 and "cannot" in proc.stderr:
        pytest.skip(f"this machine refuses keyrings: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if mode == "bwrap":
        assert token not in out and out.startswith("READ 1\n"), out  # EPERM
    else:  # the control: without the sandbox the key is read, so the probe can see a leak
        assert token in out, out


@requires_bwrap
def test_a_virtualenvs_site_packages_are_hidden():
    # not under /tmp, which the sandbox replaces with its own
    root = Path(tempfile.mkdtemp(prefix="selftaught-venv-", dir="/var/tmp"))
    try:
        venv = root / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        site_packages = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        token = secrets.token_hex(8)
        (Path(site_packages) / "planted.py").write_text(f"TOKEN = {token!r}\n")
        probe = f"print(open({site_packages + '/planted.py'!r}).read())"
        script = (
            "from selftaught.tasks.sandbox import open_sandbox\n"
            f"r = open_sandbox().run({probe!r})\n"
            "print(r.stdout_tail, r.stderr_tail)\n"
        )
        out = subprocess.run(
            [python, "-c", script],
            env={"PYTHONPATH": str(SRC)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert token not in out.stdout and "FileNotFoundError" in out.stdout, out.stdout
    finally:
        shutil.rmtree(root)


# ---- the sandbox's own failures are errors, not scores --------------------------------


def test_missing_bwrap_is_refused_unless_unsafe_exec(tmp_path, monkeypatch):
    missing = str(tmp_path / "no-such-bwrap")
    with pytest.raises(SandboxError, match="apt-get install bubblewrap.*--unsafe-exec"):
        run_python("print(1)", bwrap=missing)
    monkeypatch.setenv(BWRAP_ENV, missing)
    with pytest.raises(SandboxError, match="not installed"):
        open_sandbox()
    result = run_python("print(1)", unsafe_exec=True)
    assert result.passed and not result.isolated and result.stdout_tail == "1\n"


def _fake_bwrap(tmp_path: Path, message: str) -> str:
    fake = tmp_path / "bwrap"
    fake.write_text(f"#!/bin/sh\necho {message!r} >&2\nexit 1\n")
    fake.chmod(0o755)
    return str(fake)


def test_a_broken_bwrap_is_an_error_naming_the_cause(tmp_path):
    broken = _fake_bwrap(tmp_path, "bwrap: Creating new namespace failed: Operation not permitted")
    with pytest.raises(SandboxError, match="could not start a sandbox.*Operation not permitted"):
        open_sandbox(bwrap=broken)
    with pytest.raises(SandboxError, match="failed before running the code"):
        Sandbox(broken).run("print(1)")  # mid-run, past the check: still an error


@requires_bwrap
def test_a_limit_that_cannot_be_set_is_an_error():
    # a lowered hard limit cannot be raised again inside the sandbox (no privileges there)
    script = textwrap.dedent(
        """
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        from selftaught.tasks.sandbox import Sandbox, SandboxError, find_bwrap
        try:
            Sandbox(find_bwrap()).run('print(1)')
        except SandboxError as err:
            print('ERROR', err)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert "ERROR" in out.stdout and "RLIMIT_FSIZE" in out.stdout, out.stdout + out.stderr


def test_a_sandbox_that_never_starts_the_code_is_an_error_not_a_timeout(tmp_path):
    hanging = tmp_path / "bwrap"
    hanging.write_text("#!/bin/sh\nsleep 5\n")
    hanging.chmod(0o755)
    with pytest.raises(SandboxError, match="had not started after 0.5s"):
        Sandbox(str(hanging)).run("print(1)", timeout_s=0.5)


# ---- the unprivileged mode, when these tests run as root --------------------------------

UNPRIVILEGED_SCRIPT = (
    f"USERNS = {NEW_USER_NAMESPACE!r}\n"
    + """
import json, os, socket
from selftaught.tasks.sandbox import open_sandbox
sandbox = open_sandbox()
server = socket.socket(); server.bind(('127.0.0.1', 0)); server.listen(1)
server.setblocking(False)
port = server.getsockname()[1]
probe = '''
import os, socket
print(os.getuid(), os.getcwd())
for name, attempt in [
    ('tcp', lambda: socket.create_connection(('127.0.0.1', PORT), timeout=2)),
    ('fork', os.fork),
    ('write_root', lambda: open('/escape.txt', 'w')),
    ('write_dev', lambda: open('/dev/escape.txt', 'w')),
    ('unshare_user', lambda: exec(USERNS)),
]:
    try:
        attempt(); print('ESCAPED', name)
    except Exception as err:
        print('BLOCKED', name, type(err).__name__)
'''.replace('PORT', str(port)).replace('USERNS', repr(USERNS))
result = sandbox.run(probe)
try:
    server.accept(); connected = True
except BlockingIOError:
    connected = False
forks = sandbox.run('''
import os, time
n = 0
for _ in range(60):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(2); os._exit(0)
    n += 1
print(n)
''', allow_subprocesses=True)
print(json.dumps({"isolated": result.isolated, "stdout": result.stdout_tail,
                  "stderr": result.stderr_tail, "connected": connected,
                  "forks": forks.stdout_tail, "uid": os.getuid()}))
"""
)


def _unprivileged_python() -> str | None:
    """An interpreter the `nobody` user can run (this one may live in root's home)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            probe = subprocess.run(
                [candidate, "-c", "import selftaught.tasks.sandbox"],
                user=65534,
                group=65534,
                extra_groups=[],
                env={"PYTHONPATH": str(SRC)},
                capture_output=True,
            )
        except OSError:
            continue
        if probe.returncode == 0:
            return candidate
    return None


@requires_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="not root: every other test runs unprivileged")
def test_unprivileged_user_gets_the_same_isolation():
    python = _unprivileged_python()
    if python is None:
        pytest.skip("no Python that the nobody user can run and import selftaught with")
    proc = subprocess.run(
        [python, "-c", UNPRIVILEGED_SCRIPT],
        user=65534,
        group=65534,
        extra_groups=[],
        env={"PYTHONPATH": str(SRC), "HOME": "/nonexistent"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "user namespaces are" in proc.stderr:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["uid"] == 65534 and report["isolated"]
    assert report["stdout"].startswith("65534 /tmp"), report
    assert "ESCAPED" not in report["stdout"], report["stdout"]
    for name in ("tcp", "fork", "write_root", "write_dev", "unshare_user"):
        assert f"BLOCKED {name}" in report["stdout"], (name, report)
    assert not report["connected"]
    assert 0 < int(report["forks"]) < MAX_PROCESSES
