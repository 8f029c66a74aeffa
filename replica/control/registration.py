"""Register this replica's address in PostgreSQL, the one place the gateway learns where to route.

The row is written by register_replica() (schemas/sql/014_replica_identity.sql) over the replica's own
database login, and only under the identity key that first registered this replica id, so no replica can
put its address under another's id. A replica.state that names an address no replica registered is ignored
by the gateway. Until the write succeeds the replica keeps trying; the gateway does not route to it before
then.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from lorafleet.state_signature import state_key

log = logging.getLogger(__name__)

REGISTER = "SELECT register_replica($1, $2, $3, $4)"


async def register(database_url: str, replica_id: str, url: str, key: str) -> None:
    """Write (replica_id, url) and the key its states are signed with, under its identity key; a restart at
    another address replaces the old one. Raises asyncpg.InvalidAuthorizationSpecificationError when
    another key holds the id."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        await conn.execute(REGISTER, replica_id, url, key, state_key(key), timeout=10)
    finally:
        await conn.close()


async def register_until_done(
    database_url: str, replica_id: str, url: str, key: str, stop: asyncio.Event, max_backoff_s: float = 10.0
) -> None:
    """register(), retried with backoff until it succeeds or stop is set."""
    backoff = 0.5
    while not stop.is_set():
        try:
            await register(database_url, replica_id, url, key)
            log.info("registered %s at %s", replica_id, url)
            return
        except asyncpg.InvalidAuthorizationSpecificationError as exc:
            log.error(
                "%s: %s; its identity key is another replica's or was lost (a lost one is released with "
                "`lorafleet db forget-replica %s`); retrying in %.1fs",
                replica_id,
                exc,
                replica_id,
                backoff,
            )
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            log.warning("could not register %s at %s (%r); retrying in %.1fs", replica_id, url, exc, backoff)
        try:
            await asyncio.wait_for(stop.wait(), backoff)
        except TimeoutError:
            backoff = min(max_backoff_s, backoff * 2)
