"""One process of a private stack: started (and restarted) from its spec, logging to its own file."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.processes import stop
from harness.spec import ProcessSpec
from ops.stack.paths import REPO_ROOT


@dataclass
class Running:
    """A stack's process: its spec, its whole environment, its log file and, once started, its Popen."""

    spec: ProcessSpec
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Running:
        """Start the process (again, when it has exited), appending to its log."""
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.proc and self.proc.pid})")
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.spec.argv(sys.executable),
                env=self.env,
                cwd=REPO_ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def stop(self, grace_s: float | None = None) -> None:
        """The spec's stop signal, then SIGKILL after its grace (or grace_s); nothing if not running."""
        stop(self.proc, self.spec.stop_grace_s if grace_s is None else grace_s, self.spec.stop_signal)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.proc is not None and self.alive:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def tail(self, chars: int = 3000) -> str:
        """The end of its log."""
        try:
            return self.log.read_bytes().decode(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""
