"""The autoscaler's records on disk: what it started and how far each action got, under the run folder.

Per replica it started, `autoscale-<replica id>.pid` (written at the spawn; its mtime is the start time),
`.starting` from just before the spawn until its pid file exists, `.thrashing` when it was started because
the fleet thrashed (why it was added, which decides when it may go), `.ready` once it was seen ready, and
`.drain` holding the drain's deadline (epoch seconds). `autoscale.last`
holds the time of the last action or completion, for the cooldown. Everything the autoscaler knows after
a restart comes from these files and from the live processes, never from memory.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from lorafleet.config import PlatformSettings
from lorafleet.pids import pid_alive
from ops.autoscale.config import AutoscaleSettings
from ops.stack.paths import log_dir, run_dir
from ops.stack.process import ManagedProcess


def serving_pid(replica_id: str, port: int) -> int | None:
    """The live process whose command line serves replica_id on port, from /proc (None if there is none)."""
    want = [b"--replica-id", replica_id.encode(), b"--port", str(port).encode()]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(argv[k : k + 4] == want for k in range(len(argv))) and pid_alive(int(entry.name)):
            return int(entry.name)
    return None


@dataclass(frozen=True)
class Record:
    """One replica the autoscaler started and whose process is alive."""

    index: int
    replica_id: str
    port: int
    pid: int
    started_at: float
    was_ready: bool
    drain_deadline: float | None
    for_thrashing: bool = False


class Records:
    """The files of one autoscaler's replicas (ids `<prefix><index>`, ports `first_port + index`)."""

    def __init__(self, platform: PlatformSettings, prefix: str, first_port: int) -> None:
        self.run, self.logs = run_dir(platform), log_dir(platform)
        self.prefix, self.first_port = prefix, first_port

    def replica_id(self, index: int) -> str:
        return f"{self.prefix}{index}"

    def port(self, index: int) -> int:
        return self.first_port + index

    def process(self, index: int) -> ManagedProcess:
        return ManagedProcess(f"autoscale-{self.replica_id(index)}", self.run, self.logs)

    def _marker(self, index: int, suffix: str) -> Path:
        return self.run / f"autoscale-{self.replica_id(index)}.{suffix}"

    def indices(self) -> list[int]:
        """Indices with a pid file, live or stale."""
        pattern = re.compile(rf"autoscale-{re.escape(self.prefix)}(\d+)\.pid")
        found = (pattern.fullmatch(p.name) for p in self.run.glob("autoscale-*.pid"))
        return sorted(int(m.group(1)) for m in found if m is not None)

    def reap(self) -> list[int]:
        """Forget the replicas whose process has exited (collecting the exit of our own children); their
        indices."""
        gone = []
        for i in self.indices():
            proc = self.process(i)
            recorded: int | None = None
            with contextlib.suppress(OSError, ValueError):
                recorded = int(proc.pid_file.read_text().strip())
            if proc.pid() is None:
                if recorded is not None:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(recorded, os.WNOHANG)  # a zombie child of this autoscaler
                self.forget(i)
                gone.append(i)
        return gone

    def live(self) -> list[Record]:
        """Our replicas whose process is alive."""
        out = []
        for i in self.indices():
            proc = self.process(i)
            try:
                started = proc.pid_file.stat().st_mtime
            except FileNotFoundError:
                continue
            pid = proc.pid()
            if pid is None:
                continue
            deadline = self._marker(i, "drain")
            out.append(
                Record(
                    i,
                    self.replica_id(i),
                    self.port(i),
                    pid,
                    started,
                    self._marker(i, "ready").exists(),
                    float(deadline.read_text()) if deadline.exists() else None,
                    self._marker(i, "thrashing").exists(),
                )
            )
        return out

    def mark_ready(self, index: int) -> None:
        self._marker(index, "ready").touch()

    def mark_draining(self, index: int, deadline: float) -> None:
        self._marker(index, "drain").write_text(f"{deadline:.3f}")

    def forget(self, index: int) -> None:
        for suffix in ("ready", "drain", "pid", "starting", "thrashing"):
            self._marker(index, suffix).unlink(missing_ok=True)

    def intend(self, index: int, for_thrashing: bool = False) -> None:
        """Record a start about to happen, and why: a crash between the spawn and its pid file leaves this
        behind."""
        self.run.mkdir(parents=True, exist_ok=True)
        self._marker(index, "starting").touch()
        if for_thrashing:
            self._marker(index, "thrashing").touch()

    def spawned(self, index: int) -> None:
        self._marker(index, "starting").unlink(missing_ok=True)

    def adopt(self) -> list[int]:
        """After a restart: a start recorded as intended but with no pid file is found by its command line
        (this id on this port) and gets its pid file; indices adopted. Call before acting."""
        pattern = re.compile(rf"autoscale-{re.escape(self.prefix)}(\d+)\.starting")
        found = (pattern.fullmatch(p.name) for p in self.run.glob("autoscale-*.starting"))
        adopted = []
        for i in sorted(int(m.group(1)) for m in found if m is not None):
            proc = self.process(i)
            if proc.pid() is None:
                pid = serving_pid(self.replica_id(i), self.port(i))
                if pid is not None:
                    proc.pid_file.write_text(str(pid))
                    adopted.append(i)
            self.spawned(i)
        return adopted

    @property
    def _last(self) -> Path:
        return self.run / f"autoscale-{self.prefix}last"

    def last_action_at(self) -> float | None:
        try:
            return float(self._last.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def touch_last_action(self, at: float | None = None) -> None:
        self.run.mkdir(parents=True, exist_ok=True)
        self._last.write_text(f"{time.time() if at is None else at:.3f}")


def merged_records(platform: PlatformSettings, settings: AutoscaleSettings) -> Records:
    """The merged replicas' records: ids and ports of their own, apart from the fleet's."""
    return Records(platform, settings.merged_replica_id_prefix(), settings.merged_first_port)
