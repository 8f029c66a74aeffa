"""Every asyncpg pool the project opens: bounded connect, acquire, command and statement times.

A PostgreSQL that is down, restarting or paused must turn into an error within these bounds, never into a
wait without end: `timeout` bounds opening a connection, the acquire timeout bounds waiting for a pooled
one (every `acquire()`, and the pool's own `fetch`/`execute`, which acquire), `command_timeout` bounds each
query on the client, and the server-side `statement_timeout` cancels a statement the server is still
running.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
from asyncpg.pool import PoolAcquireContext

from lorafleet.config import PlatformSettings

log = logging.getLogger(__name__)


def server_settings(settings: PlatformSettings) -> dict[str, str]:
    """Session settings the server applies to every connection of the pool."""
    return {"statement_timeout": str(settings.db_statement_timeout_ms)}


class BoundedPool(asyncpg.Pool):
    """An asyncpg pool whose acquire() without a timeout waits at most acquire_timeout_s."""

    __slots__ = ("acquire_timeout_s",)

    acquire_timeout_s: float

    def acquire(self, *, timeout: float | None = None) -> PoolAcquireContext[Any]:
        return super().acquire(timeout=self.acquire_timeout_s if timeout is None else timeout)


async def create_pool(
    settings: PlatformSettings, *, min_size: int, max_size: int, dsn: str | None = None
) -> asyncpg.Pool:
    """A pool on dsn (default: settings.database_url) with the settings' time bounds."""
    # What asyncpg.create_pool builds, with the acquire default of BoundedPool.
    pool = BoundedPool(
        dsn or settings.database_url,
        min_size=min_size,
        max_size=max_size,
        max_queries=50_000,
        max_inactive_connection_lifetime=300.0,
        loop=None,
        connection_class=asyncpg.Connection,
        record_class=asyncpg.Record,
        timeout=settings.db_connect_timeout_s,
        command_timeout=settings.db_command_timeout_s,
        server_settings=server_settings(settings),
    )
    pool.acquire_timeout_s = settings.db_acquire_timeout_s
    return await pool


async def close_pool(pool: asyncpg.Pool, timeout_s: float = 5.0) -> None:
    """Close gracefully within timeout_s, else terminate: a paused server must not hold up a restart."""
    try:
        await asyncio.wait_for(pool.close(), timeout_s)
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        log.warning("pool did not close cleanly (%s); terminating its connections", exc or type(exc).__name__)
        pool.terminate()
