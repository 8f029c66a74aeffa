"""`lorafleet dead-letters`: list the newest dead letters, the consumers' and the outbox relay's, together."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass
from datetime import datetime

import asyncpg
import typer

from lorafleet.config import get_settings
from lorafleet.db.pool import create_pool

# consumer dead letters (schemas/sql/012) and outbox rows the relay refused (schemas/sql/002), newest first
RECENT = """
SELECT * FROM (
    SELECT recorded_at AS at, consumer, topic, kafka_partition AS partition, kafka_offset AS offset,
           reason, encode(substring(value from 1 for $3), 'escape') AS value
    FROM dead_letters WHERE $1::text IS NULL OR consumer = $1
    UNION ALL
    SELECT failed_at, 'outbox-relay', aggregate_type, NULL, NULL, error, left(payload::text, $3)
    FROM outbox WHERE failed_at IS NOT NULL AND ($1::text IS NULL OR $1 = 'outbox-relay')
) AS letters ORDER BY at DESC LIMIT $2
"""


@dataclass(frozen=True)
class DeadLetter:
    at: datetime
    consumer: str
    topic: str
    partition: int | None  # None for an outbox row: it never reached Kafka
    offset: int | None
    reason: str
    value: str | None  # the record's first bytes, non-printable ones escaped


async def recent(
    pool: asyncpg.Pool, consumer: str | None, limit: int, value_chars: int = 200
) -> list[DeadLetter]:
    """The newest dead letters, optionally of one consumer ('outbox-relay' for the relay's)."""
    return [DeadLetter(**dict(r)) for r in await pool.fetch(RECENT, consumer, limit, value_chars)]


async def _list(consumer: str | None, limit: int) -> list[DeadLetter]:
    pool = await create_pool(get_settings(), min_size=1, max_size=1)
    try:
        return await recent(pool, consumer, limit)
    finally:
        await pool.close()


def dead_letters(
    consumer: str | None = typer.Option(None, help="Only this consumer's (outbox-relay: the relay's)."),
    limit: int = typer.Option(20, min=1, help="How many, newest first."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
) -> None:
    """List the newest dead letters: records a consumer could not decode, and outbox rows never published."""
    for letter in asyncio.run(_list(consumer, limit)):
        if as_json:
            typer.echo(json.dumps(asdict(letter), default=str))
            continue
        where = (
            letter.topic
            if letter.partition is None
            else f"{letter.topic}[{letter.partition}]@{letter.offset}"
        )
        typer.echo(f"{letter.at:%Y-%m-%d %H:%M:%S} {letter.consumer} {where}: {letter.reason[:200]}")
