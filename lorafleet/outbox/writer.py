"""Write domain rows and their events in one transaction (the producer side of the outbox)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from lorafleet.db.conn import Connection
from schemas.events import Event, validate_payload

# Class of the per-key advisory locks, apart from the project's other advisory locks ("outb").
KEY_LOCK_CLASS = 0x6F757462


async def emit(conn: Connection, event: Event) -> None:
    """Insert the event's outbox row on conn; call inside the transaction that writes the domain rows."""
    if not conn.is_in_transaction():
        raise RuntimeError("outbox rows must be written inside the domain transaction")
    # Re-validate: a model built with model_construct() or mutated would otherwise slip through.
    checked = validate_payload(event.type, event.model_dump(mode="json", exclude={"type"}))
    # Writers of one key queue here until the holder commits, so within a key the outbox seq (taken by the
    # INSERT below) follows commit order, and the relay's ORDER BY seq publishes a key's events in that
    # order. Without it a key's later seq can commit first and be published ahead of an earlier one.
    await conn.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        KEY_LOCK_CLASS,
        f"{checked.topic.name}/{checked.key()}",
    )
    await conn.execute(
        """INSERT INTO outbox (id, aggregate_type, aggregate_id, type, payload)
           VALUES ($1, $2, $3, $4, $5::jsonb)""",
        checked.event_id,
        checked.topic.name,
        checked.key(),
        checked.type,
        json.dumps(checked.model_dump(mode="json")),
    )


@asynccontextmanager
async def outbox_transaction(pool: asyncpg.Pool) -> AsyncIterator[Connection]:
    """`async with outbox_transaction(pool) as conn:` write domain rows, then `await emit(conn, event)`."""
    async with pool.acquire() as conn, conn.transaction():
        yield conn
