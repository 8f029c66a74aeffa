"""Register this replica's address in PostgreSQL, the one place the gateway learns where to route.

The row goes over the replica's own database connection (its credentials are the authentication), so a
replica.state that names an address no replica registered is ignored by the gateway. Until the write
succeeds the replica keeps trying; the gateway does not route to it before then.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

log = logging.getLogger(__name__)

UPSERT = """INSERT INTO replica_registrations (replica_id, url) VALUES ($1, $2)
            ON CONFLICT (replica_id) DO UPDATE SET url = EXCLUDED.url, registered_at = now()"""


async def register(database_url: str, replica_id: str, url: str) -> None:
    """Write (replica_id, url); a restart at another address replaces the old one."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        await conn.execute(UPSERT, replica_id, url, timeout=10)
    finally:
        await conn.close()


async def register_until_done(
    database_url: str, replica_id: str, url: str, stop: asyncio.Event, max_backoff_s: float = 10.0
) -> None:
    """register(), retried with backoff until it succeeds or stop is set."""
    backoff = 0.5
    while not stop.is_set():
        try:
            await register(database_url, replica_id, url)
            log.info("registered %s at %s", replica_id, url)
            return
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            log.warning("could not register %s at %s (%r); retrying in %.1fs", replica_id, url, exc, backoff)
        try:
            await asyncio.wait_for(stop.wait(), backoff)
        except TimeoutError:
            backoff = min(max_backoff_s, backoff * 2)
