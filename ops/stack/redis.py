"""Redis from Debian's redis-server package, on loopback, with its data and pid file under the data folder.

The gateways keep only short-lived rate-limit buckets in it, so it runs without persistence: a restart
starts every tenant's buckets full again.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from lorafleet.config import PlatformSettings
from ops.stack.paths import log_dir, run_dir, service_dir
from ops.stack.process import ManagedProcess, wait_until

NAME = "redis"


def process(settings: PlatformSettings) -> ManagedProcess:
    return ManagedProcess(NAME, run_dir(settings), log_dir(settings))


def ping(port: int, host: str = "127.0.0.1", timeout: float = 2.0) -> bool:
    """Whether a Redis answers PING on host:port (inline command, no client library needed)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def ready(settings: PlatformSettings) -> bool:
    return ping(settings.redis_port)


def server_argv(port: int, workdir: Path) -> list[str]:
    """redis-server on 127.0.0.1:port, foreground, no RDB or AOF files, working in workdir."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(binary).exists():
        raise RuntimeError("redis-server not found: install Debian's redis-server package (make deps does)")
    # an empty argument is how redis-server's command line spells "save nothing"
    return [
        binary,
        *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)),
        *("--save", "", "--appendonly", "no", "--daemonize", "no"),
    ]


def up(settings: PlatformSettings, timeout: float = 30.0) -> str:
    proc = process(settings)
    if proc.pid() is not None and ready(settings):
        return "already running"
    workdir = service_dir(settings, NAME)
    workdir.mkdir(parents=True, exist_ok=True)
    pid = proc.start(server_argv(settings.redis_port, workdir))
    if not wait_until(lambda: ready(settings), timeout):
        port = settings.redis_port
        raise RuntimeError(f"Redis (pid {pid}) did not answer on port {port}:\n{proc.log_tail()}")
    return "started"


def down(settings: PlatformSettings) -> bool:
    return process(settings).stop()
