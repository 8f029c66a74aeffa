"""Which replica.state the stats stream counts: only a registered replica's, at its registered address and
signed with its state key (lorafleet.replica_registry), as the gateway and the placement worker count them.
A forged state would otherwise raise the fleet's queue or slot demand and scale the fleet, or hide a thrash.
The registrations are read on a one-connection pool of its own, opened at the first state."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from lorafleet.config import PlatformSettings
from lorafleet.db.pool import create_pool
from lorafleet.replica_registry import ReplicaRegistry, StateRejections
from schemas.events import ReplicaState
from stats_stream import metrics

log = logging.getLogger(__name__)


class StateCheck:
    def __init__(self, platform: PlatformSettings, replica_id_prefix: str) -> None:
        self._platform = platform
        self._prefix = replica_id_prefix
        self._lock = asyncio.Lock()
        self._pool: asyncpg.Pool | None = None
        self._registry: ReplicaRegistry | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self.rejected = StateRejections(lambda _: metrics.EVENTS.labels("replica.state", "rejected").inc())

    async def believes(self, state: ReplicaState, value: bytes, headers: object) -> bool:
        """Whether state, whose record held value and headers, is its registered replica's own."""
        return (await self._open()).believes(state, value, headers, self.rejected)

    async def _open(self) -> ReplicaRegistry:
        async with self._lock:
            if self._registry is None:
                self._pool = await create_pool(self._platform, min_size=1, max_size=1)
                registry = ReplicaRegistry(self._pool, self._prefix)
                try:
                    await registry.refresh()
                except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                    log.warning("could not read replica_registrations yet (%r); retrying", exc)
                self._refreshing = asyncio.create_task(registry.run())
                self._registry = registry
            return self._registry

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refreshing
        if self._pool is not None:
            await self._pool.close()
