"""The private-stack builder: a stack's database, seed, in-process workers and processes from a StackSpec,
up and ready for the body of an `async with`, and all of it gone afterwards (also when the body raises).

On the way in: the throwaway database is created, migrated and seeded; the workers are entered; every
process starts, logging under the work folder; then each process's probes are waited for in order. On
the way out every process the stack started is stopped by its pid (the last started first), the workers
are left, the pool is closed and the database dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from harness.databases import throwaway_database
from harness.env import process_env, stack_env, stack_platform
from harness.readiness import wait_ready
from harness.running import Running
from harness.seed import Seed, write_seed
from harness.spec import ProcessSpec, StackSpec
from lorafleet.config import PlatformSettings
from lorafleet.db.migrate import migrate


@dataclass
class RunningStack:
    """A stack that is up: its platform (its own database), shared environment, keys and processes."""

    spec: StackSpec
    platform: PlatformSettings
    work: Path
    env: dict[str, str]  # every process's environment, less the process's own
    keys: dict[str, str] = field(default_factory=dict)  # tenant -> API key secret
    pool: asyncpg.Pool | None = None
    procs: dict[str, Running] = field(default_factory=dict)  # the latest process of each name
    started: list[Running] = field(default_factory=list)  # every process added, stopped in reverse

    @property
    def database_url(self) -> str:
        return self.platform.database_url

    def add(self, spec: ProcessSpec) -> Running:
        """A process of the stack, not started yet; it replaces any of its name in procs."""
        process = Running(spec, process_env(self.env, spec), self.work / spec.log_name())
        self.procs[spec.name] = process
        self.started.append(process)
        return process

    async def launch(self, spec: ProcessSpec) -> Running:
        """add(spec), started and ready."""
        process = self.add(spec).start()
        await wait_ready(process)
        return process

    def stop_all(self) -> None:
        """Stop every process added, the last first."""
        for process in reversed(self.started):
            process.stop()

    def tails(self, chars: int = 2500) -> str:
        """The end of every process's log."""
        return "\n".join(f"--- {p.log.name}\n{p.tail(chars)}" for p in self.procs.values())


@contextlib.asynccontextmanager
async def _database(spec: StackSpec, platform: PlatformSettings) -> AsyncIterator[None]:
    """The stack's throwaway database, migrated; none when the spec names none."""
    if spec.database is None:
        yield
        return
    async with throwaway_database(platform.database_url, spec.database) as url:
        await migrate(url)
        yield


@contextlib.asynccontextmanager
async def launched(
    specs: Iterable[ProcessSpec], env: Mapping[str, str], work: Path
) -> AsyncIterator[list[Running]]:
    """Processes beside a stack: started with env (then their own), ready in turn, stopped afterwards."""
    processes: list[Running] = []
    try:
        for spec in specs:
            processes.append(Running(spec, process_env(env, spec), work / spec.log_name()).start())
        for process in processes:
            await wait_ready(process)
        yield processes
    finally:
        for process in reversed(processes):
            await asyncio.to_thread(process.stop)


async def _write_seed(url: str, seed: Seed) -> dict[str, str]:
    """The seed's rows in the database at url; tenant -> API key secret."""
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        return await write_seed(pool, seed)
    finally:
        await pool.close()


@contextlib.asynccontextmanager
async def private_stack(
    spec: StackSpec, platform: PlatformSettings, work: Path
) -> AsyncIterator[RunningStack]:
    """The stack of spec on platform's services, up and ready, with logs under work; gone afterwards."""
    if spec.workers and not spec.pool_size:
        raise ValueError("workers need the stack's pool: give the spec a pool_size")
    if spec.database is None and spec.seed != Seed():
        raise ValueError("a seed needs a database of the stack's own")
    work.mkdir(parents=True, exist_ok=True)
    own = stack_platform(spec, platform)
    stack = RunningStack(spec, own, work, {**os.environ, **stack_env(spec, platform)})
    async with contextlib.AsyncExitStack() as exits:
        await exits.enter_async_context(_database(spec, platform))
        if spec.database is not None:
            stack.keys = await _write_seed(own.database_url, spec.seed)
        if spec.pool_size:
            stack.pool = await asyncpg.create_pool(own.database_url, min_size=1, max_size=spec.pool_size)
            exits.push_async_callback(stack.pool.close)
        for worker in spec.workers:
            assert stack.pool is not None
            await exits.enter_async_context(worker(own, stack.pool))
        exits.push_async_callback(asyncio.to_thread, stack.stop_all)
        processes = [stack.add(p).start() for p in spec.processes]
        for process in processes:
            await wait_ready(process)
        yield stack
