"""`lorafleet services supervise`: start the app processes, restart any that dies with backoff, and keep
each one's pid and restart count in run/supervisor.json for `services status`.

The supervisor is the parent of what it starts, so it reaps each exit and reads its code. Children run in
sessions of their own: a supervisor killed outright leaves them running, and `services down` stops them
by their pid files. SIGTERM stops the children first, then the supervisor.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from lorafleet.config import PlatformSettings
from lorafleet.pids import pid_alive
from ops.stack.paths import log_dir, run_dir
from ops.stack.process import ManagedProcess, wait_until

log = logging.getLogger(__name__)

NAME = "supervisor"
POLL_S = 0.5


def state_file(settings: PlatformSettings) -> Path:
    return run_dir(settings) / f"{NAME}.json"


def read_state(settings: PlatformSettings) -> dict[str, dict[str, object]]:
    """name -> {pid, restarts, last_exit} as the running (or last) supervisor wrote it; {} when none."""
    try:
        data = json.loads(state_file(settings).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def restart_delay(failures: int, initial_s: float, max_s: float) -> float:
    """Seconds to wait before the next start after `failures` quick deaths in a row (1 or more)."""
    return min(initial_s * 2 ** max(failures - 1, 0), max_s)


@dataclass
class Child:
    """One supervised process and its restart bookkeeping."""

    name: str
    argv: list[str]
    proc: ManagedProcess
    popen: subprocess.Popen[bytes] | None = None
    adopted_pid: int | None = None  # running before this supervisor started: watched, not reaped
    started_at: float = 0.0
    start_at: float = 0.0  # monotonic time of the next start while not running
    starts: int = 0
    failures: int = 0  # quick deaths in a row
    last_exit: int | None = None

    @property
    def restarts(self) -> int:
        return max(self.starts - 1, 0)

    def pid(self) -> int | None:
        if self.popen is not None:
            return self.popen.pid
        return self.adopted_pid

    def exit_code(self) -> int | None:
        """None while running; the exit code (or -1 for an adopted process) once it has ended."""
        if self.popen is not None:
            return self.popen.poll()
        if self.adopted_pid is not None and not pid_alive(self.adopted_pid):
            return -1
        return None


class Supervisor:
    """Keeps every child running; step() does one round of checks and (re)starts."""

    def __init__(
        self,
        settings: PlatformSettings,
        commands: Mapping[str, Sequence[str]],
        cwd: Path | None = None,
        envs: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.settings = settings
        self.cwd = cwd
        self.envs = envs or {}  # per child, over the supervisor's own environment
        self.children = [
            Child(name, list(argv), ManagedProcess(name, run_dir(settings), log_dir(settings)))
            for name, argv in commands.items()
        ]
        for child in self.children:
            child.adopted_pid = child.proc.pid()
            if child.adopted_pid is not None:
                child.starts = 1
                child.started_at = time.monotonic()

    def step(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.pid() is not None:
                code = child.exit_code()
                if code is None:
                    continue
                self._ended(child, code, now)
            if now >= child.start_at:
                self._start(child, now)
        self.write_state()

    def _ended(self, child: Child, code: int, now: float) -> None:
        lived = now - child.started_at
        child.failures = 0 if lived >= self.settings.restart_reset_after_s else child.failures
        child.failures += 1
        delay = restart_delay(child.failures, self.settings.restart_initial_s, self.settings.restart_max_s)
        log.warning(
            "%s (pid %s) exited with %s after %.1fs; restarting in %.1fs",
            child.name,
            child.pid(),
            code,
            lived,
            delay,
        )
        child.last_exit = code
        child.popen = child.adopted_pid = None
        child.proc.pid_file.unlink(missing_ok=True)
        child.start_at = now + delay

    def _start(self, child: Child, now: float) -> None:
        child.popen = child.proc.spawn(child.argv, env=dict(self.envs.get(child.name, {})), cwd=self.cwd)
        child.started_at = now
        child.starts += 1
        log.info("%s started (pid %d, start %d)", child.name, child.popen.pid, child.starts)

    def write_state(self) -> None:
        state = {
            c.name: {"pid": c.pid(), "restarts": c.restarts, "last_exit": c.last_exit} for c in self.children
        }
        path = state_file(self.settings)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)

    def stop_all(self, timeout_s: float = 20.0) -> None:
        """SIGTERM every running child at once, SIGKILL what is left after timeout_s; reap them all."""
        running = [c for c in self.children if c.pid() is not None and c.exit_code() is None]
        for child in reversed(running):
            _signal(child, signal.SIGTERM)
        if not wait_until(lambda: all(c.exit_code() is not None for c in running), timeout_s):
            for child in running:
                if child.exit_code() is None:
                    _signal(child, signal.SIGKILL)
            wait_until(lambda: all(c.exit_code() is not None for c in running), 5.0)
        for child in self.children:
            child.proc.pid_file.unlink(missing_ok=True)
            child.popen = child.adopted_pid = None
        self.write_state()

    def run(self) -> None:
        """step() every POLL_S until SIGTERM or SIGINT, then stop the children."""
        stopping = False

        def on_signal(_sig: int, _frame: FrameType | None) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # Its own pid file too when run by hand, not by `services up`: `status` and `down` find it.
        own = ManagedProcess(NAME, run_dir(self.settings), log_dir(self.settings)).pid_file
        own.parent.mkdir(parents=True, exist_ok=True)
        own.write_text(str(os.getpid()))
        try:
            while not stopping:
                self.step()
                time.sleep(POLL_S)
            self.stop_all()
        finally:
            own.unlink(missing_ok=True)


def _signal(child: Child, sig: signal.Signals) -> None:
    pid = child.pid()
    if pid is not None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def supervise(
    settings: PlatformSettings,
    commands: Mapping[str, Sequence[str]],
    cwd: Path,
    envs: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """Run the supervisor in this process (the `services supervise` command) until signalled."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    Supervisor(settings, commands, cwd, envs).run()
