"""A private redis-server for one test: a free port, a temp folder, stopped by its own pid."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.ports import free_port
from harness.processes import stop
from ops.stack.redis import ping, server_argv


@dataclass
class RedisServer:
    port: int
    workdir: Path
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30.0) -> None:
        with open(self.workdir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(server_argv(self.port, self.workdir), stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while not ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.port} did not start: see {self.workdir}/redis.log")
            time.sleep(0.1)

    def stop(self) -> None:
        stop(self.proc)
        self.proc = None


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[RedisServer]:
    workdir.mkdir(parents=True, exist_ok=True)
    server = RedisServer(free_port(), workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
