"""What the fleet benchmark samples while the trace runs: consumer lag per group, PostgreSQL transactions,
CPU per process, and the owner placements (for what a join or a kill moves)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiokafka import TopicPartition

from bench.gateway_stack import cpu_seconds
from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_consumer
from schemas.topics import Topic

Owners = frozenset[tuple[str, str]]  # (adapter_id, replica_id) of every owner placement


async def owners(pool: asyncpg.Pool) -> Owners:
    rows = await pool.fetch("SELECT adapter_id, replica_id FROM placements WHERE role = 'owner'")
    return frozenset((r["adapter_id"], r["replica_id"]) for r in rows)


def moved(before: Owners, after: Owners) -> int:
    """Owner placements that are not where they were (each adapter's owners compared as a set)."""
    return len(before - after)


async def transactions(pool: asyncpg.Pool, database: str) -> int:
    """Commits and rollbacks on the database so far (pg_stat_database)."""
    value = await pool.fetchval(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", database
    )
    return int(value or 0)


class LagProbe:
    """Committed offsets of each group against its topics' ends."""

    def __init__(self, platform: PlatformSettings, groups: dict[str, tuple[Topic, ...]]) -> None:
        self.platform, self.groups = platform, groups
        self.consumers: dict[str, Any] = {}
        self.ends: Any = None

    async def start(self) -> None:
        self.ends = make_consumer(self.platform, group_id=None, enable_auto_commit=False)
        await self.ends.start()
        for group in self.groups:
            consumer = make_consumer(self.platform, group_id=group, enable_auto_commit=False)
            await consumer.start()
            self.consumers[group] = consumer

    async def stop(self) -> None:
        for consumer in [self.ends, *self.consumers.values()]:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def sample(self) -> dict[str, int]:
        """group -> records behind the end, over its topics' partitions."""
        out = {}
        for group, names in self.groups.items():
            tps = [TopicPartition(t.name, p) for t in names for p in range(t.partitions)]
            ends = await self.ends.end_offsets(tps)
            lag = 0
            for tp in tps:
                committed = await self.consumers[group].committed(tp)
                lag += max(ends[tp] - (committed or 0), 0) if committed is not None else 0
            out[group] = lag
        return out


@dataclass
class Series:
    """Samples over the run, seconds from its start."""

    lag: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    xacts: list[tuple[float, int]] = field(default_factory=list)
    cpu: list[tuple[float, dict[str, float]]] = field(default_factory=list)


async def sample_loop(
    lag: LagProbe,
    pool: asyncpg.Pool,
    database: str,
    pids: dict[str, int],
    t0: float,
    into: Series,
    stop: asyncio.Event,
    every_s: float = 5.0,
) -> None:
    """Sample every every_s until stop (a failed sample is skipped)."""
    while not stop.is_set():
        t = round(time.monotonic() - t0, 2)
        with contextlib.suppress(Exception):
            into.lag.append((t, await lag.sample()))
        with contextlib.suppress(Exception):
            into.xacts.append((t, await transactions(pool, database)))
        cpu = {}
        for name, pid in pids.items():
            with contextlib.suppress(OSError):
                cpu[name] = cpu_seconds(pid)
        into.cpu.append((t, cpu))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def rates(series: Series) -> dict[str, Any]:
    """PostgreSQL transactions/s and CPU cores per process over the sampled span."""
    out: dict[str, Any] = {}
    if len(series.xacts) > 1:
        (t0, x0), (t1, x1) = series.xacts[0], series.xacts[-1]
        out["postgres_transactions_per_s"] = round((x1 - x0) / max(t1 - t0, 1e-9), 2)
    if len(series.cpu) > 1:
        (t0, c0), (t1, c1) = series.cpu[0], series.cpu[-1]
        out["cpu_cores_by_process"] = {
            name: round((c1[name] - c0[name]) / max(t1 - t0, 1e-9), 3) for name in c1 if name in c0
        }
    if series.lag:
        groups = series.lag[-1][1]
        out["consumer_lag_max"] = {g: max(s.get(g, 0) for _, s in series.lag) for g in groups}
        out["consumer_lag_last"] = groups
    return out
