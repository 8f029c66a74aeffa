"""Start, find and stop background service processes by pid file; only ever signals pids we started."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lorafleet.pids import pid_alive


@dataclass(frozen=True)
class ManagedProcess:
    """A service process: its name, pid file and log file under the data folder."""

    name: str
    run_dir: Path
    log_dir: Path

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        """The recorded pid if that process is still alive, else None (and the stale file is removed)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if pid_alive(pid):
            return pid
        self.pid_file.unlink(missing_ok=True)
        return None

    def start(self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> int:
        """Spawn argv detached in its own session, logging to the log file; return its pid."""
        return self.spawn(argv, env, cwd).pid

    def spawn(
        self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """start(), returning the child's handle: a parent that waits on it reaps it and reads its exit."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        return proc

    def stop(self, timeout: float = 20.0) -> bool:
        """SIGTERM our recorded pid (then SIGKILL after timeout); True if something was stopped."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        if not wait_until(lambda: not pid_alive(pid), timeout):
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not pid_alive(pid), 5.0)
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.25) -> bool:
    """Poll check() until it is true or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return check()
