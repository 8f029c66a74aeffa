"""Write domain rows and their events in one transaction (the producer side of the outbox)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from schemas.events import Event, validate_payload


async def emit(conn: asyncpg.Connection, event: Event) -> None:
    """Insert the event's outbox row on conn; call inside the transaction that writes the domain rows."""
    if not conn.is_in_transaction():
        raise RuntimeError("outbox rows must be written inside the domain transaction")
    # Re-validate: a model built with model_construct() or mutated would otherwise slip through.
    checked = validate_payload(event.type, event.model_dump(mode="json", exclude={"type"}))
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
async def outbox_transaction(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """`async with outbox_transaction(pool) as conn:` write domain rows, then `await emit(conn, event)`."""
    async with pool.acquire() as conn, conn.transaction():
        yield conn
