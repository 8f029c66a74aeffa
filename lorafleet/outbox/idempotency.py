"""Consumer side of at-least-once delivery: apply each event's effect exactly once (processed_events)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from lorafleet.db.conn import Connection

T = TypeVar("T")


async def apply_once(
    conn: Connection,
    consumer: str,
    event_id: uuid.UUID,
    effect: Callable[[Connection], Awaitable[T]],
) -> tuple[bool, T | None]:
    """Run effect(conn) and record (consumer, event_id) in one transaction; skip if already recorded.

    Returns (applied, result). A redelivered or replayed event returns (False, None) and changes nothing.
    """
    async with conn.transaction():
        claimed = await conn.fetchval(
            """INSERT INTO processed_events (consumer, event_id) VALUES ($1, $2)
               ON CONFLICT DO NOTHING RETURNING true""",
            consumer,
            event_id,
        )
        if not claimed:
            return False, None
        return True, await effect(conn)
