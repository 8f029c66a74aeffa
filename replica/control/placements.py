"""What the placement worker has placed on this replica, read from its tables (schemas/sql 001 and 008).

The replica never writes them. planned_since says whether a full replan has counted this replica in since
it began warming (replicas.planned_through); owned lists its owner placements with their tiers.
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

import asyncpg

from lorafleet.config import PlatformSettings
from lorafleet.db.pool import create_pool
from schemas.events import ResidentTier


class PlacementsTable:
    """Reads over a one-connection pool of its own, opened at a read when none is open; close() ends it."""

    def __init__(self, platform: PlatformSettings, replica_id: str) -> None:
        self._platform = platform
        self._pool: asyncpg.Pool | None = None
        self.replica_id = replica_id

    async def _conn(self) -> asyncpg.Pool:
        if self._pool is None:
            self._pool = await create_pool(self._platform, min_size=1, max_size=1)
        return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def planned_since(self, since: datetime) -> bool:
        """A full replan counted this replica in on a heartbeat sent at or after `since`."""
        planned = await (await self._conn()).fetchval(
            "SELECT planned_through FROM replicas WHERE replica_id = $1", self.replica_id
        )
        return planned is not None and planned >= since

    async def owned(self) -> dict[str, ResidentTier]:
        """adapter_id -> the tier of each owner placement on this replica."""
        rows = await (await self._conn()).fetch(
            "SELECT adapter_id, tier FROM placements WHERE replica_id = $1 AND role = 'owner'",
            self.replica_id,
        )
        return {r["adapter_id"]: cast(ResidentTier, r["tier"]) for r in rows}

    async def owned_count(self) -> int:
        """How many owner placements are on this replica (0 once a drain's replan moved them)."""
        return len(await self.owned())
