"""Poison records for the dead-letter tests: publish undecodable bytes and a future schema version to a
consumer's real topic, then read what the consumer put in dead_letters."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import asyncpg
from aiokafka import AIOKafkaProducer

from schemas.events import Event

UNDECODABLE = b"\xff\xfe{ not json"


def future_version(event: Event) -> bytes:
    """The event as well-formed JSON, with a schema version newer than this code knows."""
    data = json.loads(event.to_bytes())
    data["schema_version"] = 99
    return json.dumps(data).encode()


@dataclass(frozen=True)
class Sent:
    topic: str
    partition: int
    offset: int


async def send(
    producer: AIOKafkaProducer, topic: str, value: bytes, key: bytes, headers: list | None = None
) -> Sent:
    meta = await producer.send_and_wait(topic, value, key=key, headers=headers)
    return Sent(topic, meta.partition, meta.offset)


async def letters(pool: asyncpg.Pool, consumer: str) -> dict[Sent, asyncpg.Record]:
    rows = await pool.fetch("SELECT * FROM dead_letters WHERE consumer = $1", consumer)
    return {Sent(r["topic"], r["kafka_partition"], r["kafka_offset"]): r for r in rows}


async def wait_dead_lettered(
    pool: asyncpg.Pool, consumer: str, sent: list[Sent], timeout: float = 60.0
) -> dict[Sent, asyncpg.Record]:
    """The dead_letters rows of these records, once the consumer has stored all of them."""
    deadline = time.monotonic() + timeout
    while True:
        found = await letters(pool, consumer)
        if all(s in found for s in sent):
            return {s: found[s] for s in sent}
        assert time.monotonic() < deadline, f"{consumer}: {set(sent) - set(found)} not dead-lettered"
        await asyncio.sleep(0.2)


async def poison_until_read(
    producer: AIOKafkaProducer,
    pool: asyncpg.Pool,
    consumer: str,
    topic: str,
    key: bytes,
    timeout: float = 60.0,
) -> Sent:
    """Send undecodable records until the consumer dead-letters one: a consumer that positions itself at the
    end lazily skips what was sent before it had a position."""
    deadline = time.monotonic() + timeout
    while True:
        sent = await send(producer, topic, UNDECODABLE, key)
        try:
            await wait_dead_lettered(pool, consumer, [sent], timeout=2.0)
            return sent
        except AssertionError:
            assert time.monotonic() < deadline, f"{consumer} dead-lettered nothing sent to {topic}"


async def poison_then_valid(
    producer: AIOKafkaProducer,
    pool: asyncpg.Pool,
    consumer: str,
    topic: str,
    key: bytes,
    valid: Event,
    timeout: float = 60.0,
    headers: list | None = None,
) -> tuple[Sent, Sent, dict[Sent, asyncpg.Record]]:
    """Undecodable bytes (until the consumer reads them), valid at a future schema version, then valid
    itself (with headers, e.g. a state's signature): (the raw record, the future one, both records'
    dead_letters rows)."""
    raw = await poison_until_read(producer, pool, consumer, topic, key, timeout)
    future = await send(producer, topic, future_version(valid), key)
    await send(producer, topic, valid.to_bytes(), key, headers)
    return raw, future, await wait_dead_lettered(pool, consumer, [raw, future])
