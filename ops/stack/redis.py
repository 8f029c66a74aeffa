"""Redis from Debian's redis-server package, on loopback, with its data and pid file under the data folder.

The gateways keep short-lived rate-limit buckets and idempotent replays (tenants' answers, for a day) in
it, so it requires a password, the one in LORAFLEET_REDIS_URL (the dev profile's by default). It runs
without persistence: a restart starts every tenant's buckets full again and forgets the replays.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from urllib.parse import urlparse

from lorafleet.config import PlatformSettings
from ops.stack.paths import log_dir, run_dir, service_dir
from ops.stack.process import ManagedProcess, wait_until

NAME = "redis"


def process(settings: PlatformSettings) -> ManagedProcess:
    return ManagedProcess(NAME, run_dir(settings), log_dir(settings))


def ping(port: int, host: str = "127.0.0.1", timeout: float = 2.0, password: str | None = None) -> bool:
    """Whether a Redis answers PING on host:port, logged in with password when given (inline commands, no
    client library needed)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            if password:
                conn.sendall(f"AUTH {password}\r\n".encode())
                if not _reply(conn).startswith(b"+OK"):
                    return False
            conn.sendall(b"PING\r\n")
            return _reply(conn).startswith(b"+PONG")
    except OSError:
        return False


def _reply(conn: socket.socket) -> bytes:
    """One reply line."""
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = conn.recv(256)
        if not chunk:
            break
        data += chunk
    return data


def address(settings: PlatformSettings) -> str:
    """LORAFLEET_REDIS_URL without its password, for status lines."""
    url = urlparse(settings.redis_url)
    return url._replace(netloc=url.netloc.rpartition("@")[2]).geturl()


def password(settings: PlatformSettings) -> str | None:
    """The password of LORAFLEET_REDIS_URL, which the server requires (None: a URL without one)."""
    return urlparse(settings.redis_url).password


def ready(settings: PlatformSettings) -> bool:
    return ping(settings.redis_port, password=password(settings))


def server_argv(port: int, workdir: Path, requirepass: str | None = None) -> list[str]:
    """redis-server on 127.0.0.1:port, foreground, no RDB or AOF files, working in workdir; with a password
    when given."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(binary).exists():
        raise RuntimeError("redis-server not found: install Debian's redis-server package (make deps does)")
    # an empty argument is how redis-server's command line spells "save nothing"
    return [
        binary,
        *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)),
        *("--save", "", "--appendonly", "no", "--daemonize", "no"),
        *(("--requirepass", requirepass) if requirepass else ()),
    ]


def up(settings: PlatformSettings, timeout: float = 30.0) -> str:
    proc = process(settings)
    secret = password(settings)
    if proc.pid() is not None:
        if ready(settings):
            return "already running"
        if secret and ping(settings.redis_port):
            # a server from before Redis required a password: nothing in it outlives a restart
            proc.stop()
    workdir = service_dir(settings, NAME)
    workdir.mkdir(parents=True, exist_ok=True)
    pid = proc.start(server_argv(settings.redis_port, workdir, secret))
    if not wait_until(lambda: ready(settings), timeout):
        port = settings.redis_port
        raise RuntimeError(f"Redis (pid {pid}) did not answer on port {port}:\n{proc.log_tail()}")
    return "started"


def down(settings: PlatformSettings) -> bool:
    return process(settings).stop()
