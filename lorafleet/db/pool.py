"""Every asyncpg pool the project opens: bounded connect, acquire, command and statement times.

A PostgreSQL that is down, restarting or paused must turn into an error within these bounds, never into a
wait without end: `timeout` bounds opening a connection, `command_timeout` bounds each query on the client,
and the server-side `statement_timeout` cancels a statement the server itself is still running.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from lorafleet.config import PlatformSettings

log = logging.getLogger(__name__)


def server_settings(settings: PlatformSettings) -> dict[str, str]:
    """Session settings the server applies to every connection of the pool."""
    return {"statement_timeout": str(settings.db_statement_timeout_ms)}


async def create_pool(
    settings: PlatformSettings, *, min_size: int, max_size: int, dsn: str | None = None
) -> asyncpg.Pool:
    """A pool on dsn (default: settings.database_url) with the settings' time bounds."""
    return await asyncpg.create_pool(
        dsn or settings.database_url,
        min_size=min_size,
        max_size=max_size,
        timeout=settings.db_connect_timeout_s,
        command_timeout=settings.db_command_timeout_s,
        server_settings=server_settings(settings),
    )


async def close_pool(pool: asyncpg.Pool, timeout_s: float = 5.0) -> None:
    """Close gracefully within timeout_s, else terminate: a paused server must not hold up a restart."""
    try:
        await asyncio.wait_for(pool.close(), timeout_s)
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        log.warning("pool did not close cleanly (%s); terminating its connections", exc or type(exc).__name__)
        pool.terminate()
