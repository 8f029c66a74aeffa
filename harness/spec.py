"""What a private stack is made of: its `lorafleet` processes, how each shows it is ready, and its setup."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from harness.seed import Seed
from lorafleet.config import PlatformSettings
from ops.stack.stack import APP_PROCESSES


@dataclass(frozen=True)
class HttpReady:
    """Ready once GET url answers 200 (sending headers)."""

    url: str
    timeout_s: float
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckReady:
    """Ready once check() returns true."""

    what: str
    check: Callable[[], Awaitable[bool]]
    timeout_s: float


Probe = HttpReady | CheckReady


@dataclass(frozen=True)
class ProcessSpec:
    """One `lorafleet` process: its sub-command, its own environment, its readiness and how it stops."""

    name: str
    args: tuple[str, ...]
    port: int | None = None  # where it listens, if anywhere
    env: Mapping[str, str] = field(default_factory=dict)  # over the stack's environment
    ready: tuple[Probe, ...] = ()  # waited for in order, after every process has started
    wrapper: tuple[str, ...] = ()  # argv before the interpreter (taskset -c 1)
    log: str = ""  # the log file's stem under the work folder; "" is the name
    stop_signal: signal.Signals = signal.SIGTERM
    stop_grace_s: float = 10.0  # then SIGKILL

    @property
    def url(self) -> str:
        """http://127.0.0.1:<port>."""
        if self.port is None:
            raise ValueError(f"{self.name} listens on no port")
        return f"http://127.0.0.1:{self.port}"

    def argv(self, python: str) -> list[str]:
        """The command line, with python as the interpreter."""
        return [*self.wrapper, python, "-m", "lorafleet.cli", *self.args]

    def log_name(self) -> str:
        """The log file's name."""
        return f"{self.log or self.name}.log"


def app_args(name: str) -> tuple[str, ...]:
    """The sub-command of the local stack's app process `name` (ops.stack.stack.APP_PROCESSES)."""
    return tuple(APP_PROCESSES[name])


def replica_args(replica_id: str, port: int) -> tuple[str, ...]:
    """`lorafleet replica serve` as replica_id on port."""
    return ("replica", "serve", "--replica-id", replica_id, "--port", str(port))


# Something that runs in the test or bench process beside the stack's processes (the outbox relay, the
# placement worker), given the stack's platform (its database) and pool; ready when entered.
Worker = Callable[[PlatformSettings, asyncpg.Pool], AbstractAsyncContextManager[object]]


@dataclass(frozen=True)
class StackSpec:
    """A private stack: its database and seed, the environment its processes share, its processes."""

    processes: tuple[ProcessSpec, ...] = ()
    database: str | None = None  # a throwaway database of this name; None: the platform's, as it is
    seed: Seed = field(default_factory=Seed)
    prefix: str = ""  # every replica id of the stack starts with it; the router and workers see no other
    replica_token: str | None = None  # the token the replicas check and their callers send
    fast_state: bool = False  # replica states every half second, stale after three missed
    data_dir: Path | None = None  # the processes' data folder (pid files, logs of what they start)
    env: Mapping[str, str] = field(default_factory=dict)  # over the base environment
    pool_size: int = 0  # a pool on the stack's database for the caller and the workers (0: none)
    workers: tuple[Worker, ...] = ()  # entered after the seed, before the processes start
