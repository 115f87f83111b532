"""`selftaught proxy ... --print-systemd`: the proxy as a sandboxed systemd service.

The unit runs the same command (without `--print-systemd`) as a dedicated user, `selftaught`,
whose sleep home is `/var/lib/selftaught` (its `StateDirectory`; `$SELFTAUGHT_HOME` when it is
set where the unit is printed). No secret is ever written into it (a unit file is readable by
every user): the keys, and a log URL's password, are read from an environment file the unit
names, `/etc/selftaught/<unit>.env` (mode 0600), and a `--client-keys` file is passed as a
systemd credential. Everything else the service may touch is shut: the file system is read-only
but for the home (and a SQLite log's folder outside it), no devices, no privileges, no kernel
knobs, the system calls of an ordinary service, IPv4 / IPv6 / Unix sockets only. docs/operations.md
tells how to install it; tests/test_proxy_ops.py checks it with `systemd-analyze verify`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from selftaught.errors import InputError

SERVICE_USER = "selftaught"
SERVICE_HOME = Path("/var/lib/selftaught")  # StateDirectory=selftaught
SERVICE_CACHE = Path("/var/cache/selftaught")  # CacheDirectory=selftaught: the converted model
SECRETS_DIR = Path("/etc/selftaught")
STOP_MARGIN_S = 30  # past the drain: the log's last flush and replay
_HOMES = ("/home", "/root", "/run/user")  # what ProtectHome= hides


@dataclass(frozen=True)
class ProxyService:
    """What the unit runs and needs: the proxy's options as given (no secret among them, paths
    absolute), the environment variables it must find in its environment file, a client keys
    file to pass as a credential, and a SQLite log outside the home to keep writable."""

    args: tuple[str, ...]
    project: str
    port: int
    drain_timeout_s: int
    secrets: tuple[str, ...] = ()
    client_keys: Path | None = None
    log_file: Path | None = None

    @property
    def name(self) -> str:
        return f"selftaught-proxy-{self.project}"


def systemd_unit(
    service: ProxyService,
    *,
    executable: str = sys.executable,
    env: Mapping[str, str] = os.environ,
) -> str:
    """The unit file's text (`executable`: the Python that has selftaught installed)."""
    given = env.get("SELFTAUGHT_HOME")
    home = Path(given).expanduser().absolute() if given else SERVICE_HOME
    env_file = SECRETS_DIR / f"{service.name}.env"
    words = [_word(executable), "-m", "selftaught", "proxy", *map(_word, service.args)]
    if service.client_keys is not None:
        words += ["--client-keys", "%d/client-keys"]  # %d: the unit's credentials folder
    log_dir = service.log_file.absolute().parent if service.log_file else None
    writable = [home] + ([log_dir] if log_dir and not log_dir.is_relative_to(home) else [])
    seen = [Path(executable), Path(sys.prefix), Path(sys.base_prefix), *writable]
    seen += [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    protect_home = "read-only" if any(_under_home(p) for p in seen) else "yes"
    low_port = 0 < service.port < 1024
    caps = "CAP_NET_BIND_SERVICE" if low_port else ""
    lines = [
        *_header(service, env_file, home),
        "[Unit]",
        f"Description=selftaught proxy, project {service.project}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=exec",
        f"User={SERVICE_USER}",
        f"Group={SERVICE_USER}",
        f"ExecStart={' '.join(words)}",
        *(f"Environment={_word(f'{k}={v}')}" for k, v in _carried(env, home)),
        f"EnvironmentFile={'' if service.secrets else '-'}{env_file}",
        *(
            [f"LoadCredential=client-keys:{_path(service.client_keys)}"]
            if service.client_keys
            else []
        ),
        "Restart=on-failure",
        "RestartSec=5",
        "# a stop drains the answers in flight (--drain-timeout), then flushes the log",
        f"TimeoutStopSec={service.drain_timeout_s + STOP_MARGIN_S}",
        "StateDirectory=selftaught",
        "StateDirectoryMode=0700",
        "CacheDirectory=selftaught",
        "CacheDirectoryMode=0700",
        *(f"ReadWritePaths={_path(p)}" for p in writable),
        "UMask=0077",
        "NoNewPrivileges=yes",
        f"CapabilityBoundingSet={caps}",
        f"AmbientCapabilities={caps}",
        "ProtectSystem=strict",
        f"ProtectHome={protect_home}",
        "PrivateTmp=yes",
        "PrivateMounts=yes",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "ProtectProc=invisible",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "RemoveIPC=yes",
        "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service",
        "SystemCallErrorNumber=EPERM",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def _header(service: ProxyService, env_file: Path, home: Path) -> list[str]:
    """The unit's opening comments: how to install it, and which secrets go where."""
    unit = f"/etc/systemd/system/{service.name}.service"
    lines = [
        f"# {service.name}.service: written by `selftaught proxy ... --print-systemd`.",
        "# Install (docs/operations.md):",
        f"#   sudo useradd --system --home-dir {SERVICE_HOME} --shell /usr/sbin/nologin "
        f"{SERVICE_USER}",
        f"#   selftaught proxy ... --print-systemd | sudo tee {unit}",
    ]
    if service.secrets:
        lines += [
            f"#   sudo install -d -m 0700 {SECRETS_DIR}",
            f"#   sudo install -m 0600 /dev/null {env_file}   # then write into it:",
            *(f"#     {name}=..." for name in service.secrets),
            "# (secrets never go in this file: every user can read it)",
        ]
    lines += [
        f"#   sudo systemctl daemon-reload && sudo systemctl enable --now {service.name}",
        f"# Nights run as the same user with the same home: sudo -u {SERVICE_USER} "
        f"SELFTAUGHT_HOME={home} selftaught sleep run --project {service.project}",
        "",
    ]
    return lines


def _carried(env: Mapping[str, str], home: Path) -> list[tuple[str, str]]:
    """The variables the service runs with: its home and cache, and what the shell had that
    selftaught reads and that is not a secret (those go in the environment file)."""
    carried = [("SELFTAUGHT_HOME", str(home)), ("SELFTAUGHT_CACHE", str(SERVICE_CACHE))]
    for name in ("PYTHONPATH",):
        if env.get(name):
            carried.append((name, env[name]))
    carried.append(("PYTHONUNBUFFERED", "1"))  # stderr lines reach the journal as they come
    return carried


def _under_home(path: Path) -> bool:
    text = str(path.absolute())
    return any(text == h or text.startswith(h + "/") for h in _HOMES)


def _path(path: Path) -> str:
    return _word(str(path.absolute()))


def _word(arg: str) -> str:
    """One word of a unit line, as systemd reads it back: specifiers (`%`) and variables
    (`$`) escaped, quoted when it holds a space, a quote, a backslash or a `;`."""
    if any(c in arg for c in "\n\r\0"):
        raise InputError(f"{arg!r:.60} cannot be written on one line of a systemd unit")
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not any(c in arg for c in " \t\"'\\;"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def upstream_key_variable(upstream: str, env: Mapping[str, str] = os.environ) -> str | None:
    """The vendor's variable the proxy reads its upstream key from, when it is set here and
    no `--api-key` is given (`anthropic`, `openai`, `openai:M`)."""
    spec = upstream.strip()
    name = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}.get(spec)
    if name is None and spec.startswith("openai:"):
        name = "OPENAI_API_KEY"
    return name if name and env.get(name) else None
