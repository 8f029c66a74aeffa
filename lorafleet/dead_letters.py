"""Poison records: a Kafka record a consumer cannot decode goes to the dead_letters table and is counted.

Every consumer reads its records through `DeadLetters.parse`: an event comes back, or None once the record
is stored in dead_letters (schemas/sql/012) with its topic, partition, offset, the consumer's name and the
reason, and counted in lorafleet_consumer_dead_letters_total{consumer,topic}. The consumer then commits past
it as it does past an applied event, so the next record still applies. A row is keyed by where the record
was read, so a redelivery after a crash stores and counts nothing new. When PostgreSQL cannot take the row
the write raises, and the consumer does not commit past a record nobody kept: its retry loop reads it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import asyncpg
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from lorafleet.config import PlatformSettings
from lorafleet.db.pool import create_pool
from schemas.events import Event, EventValidationError, parse_event

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 2000
MAX_VALUE_BYTES = 1 << 20  # a record larger than this is kept truncated; the reason says so

INSERT = """
INSERT INTO dead_letters (consumer, topic, kafka_partition, kafka_offset, reason, value)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT DO NOTHING
"""

PoolOpener = Callable[[], Awaitable[asyncpg.Pool]]
STORE_FAILURES = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)  # the row is not kept


def dead_letter_counter(registry: CollectorRegistry = REGISTRY) -> Counter:
    """The dead-letter family in registry (processes with their own registry build theirs here)."""
    return Counter(
        "lorafleet_consumer_dead_letters",
        "Kafka records a consumer could not decode and stored in dead_letters, by consumer and topic.",
        ["consumer", "topic"],
        registry=registry,
    )


DEAD_LETTERS = dead_letter_counter()


class DeadLetters:
    """One consumer's dead-letter sink: PostgreSQL's dead_letters table and the counter."""

    def __init__(
        self,
        consumer: str,
        pool: asyncpg.Pool | PoolOpener,
        counter: Counter = DEAD_LETTERS,
        owns_pool: bool = False,
    ) -> None:
        self.consumer = consumer
        self.counter = counter
        self._pool = pool if isinstance(pool, asyncpg.Pool) else None
        self._open = None if isinstance(pool, asyncpg.Pool) else pool
        self._owns_pool = owns_pool
        self._lock = asyncio.Lock()

    @classmethod
    def own_pool(
        cls, consumer: str, platform: PlatformSettings, counter: Counter = DEAD_LETTERS
    ) -> DeadLetters:
        """A sink with a one-connection pool of its own, opened at the first dead letter; close() ends it."""
        return cls(consumer, lambda: create_pool(platform, min_size=1, max_size=1), counter, owns_pool=True)

    async def close(self) -> None:
        """Close the pool own_pool opened, if any; a sink on a caller's pool leaves it open."""
        if self._owns_pool and self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def _db(self) -> asyncpg.Pool:
        async with self._lock:
            if self._pool is None:
                assert self._open is not None
                self._pool = await self._open()
            return self._pool

    async def parse(self, topic: str, partition: int, offset: int, value: bytes | None) -> Event | None:
        """The record's event if it belongs on topic; otherwise None once it is dead-lettered."""
        if value is None:
            await self.record(topic, partition, offset, None, "a record without a value")
            return None
        try:
            return parse_event(value, topic)
        except EventValidationError as exc:
            await self.record(topic, partition, offset, value, str(exc))
            return None

    async def parse_following(
        self, topic: str, partition: int, offset: int, value: bytes | None
    ) -> Event | None:
        """parse for a consumer that commits no offsets (it follows a topic from its end): no offset would
        bring a record back for a retry, so a dead letter PostgreSQL cannot take is logged and skipped."""
        try:
            return await self.parse(topic, partition, offset, value)
        except STORE_FAILURES as exc:
            self._not_stored(topic, partition, offset, exc)
            return None

    async def record_following(
        self, topic: str, partition: int, offset: int, value: bytes | None, reason: str
    ) -> None:
        """record for a consumer that commits no offsets: one PostgreSQL cannot take is logged and skipped."""
        try:
            await self.record(topic, partition, offset, value, reason)
        except STORE_FAILURES as exc:
            self._not_stored(topic, partition, offset, exc)

    def _not_stored(self, topic: str, partition: int, offset: int, exc: BaseException) -> None:
        log.error(
            "%s could not store the dead letter %s[%d]@%d: %r", self.consumer, topic, partition, offset, exc
        )

    async def record(self, topic: str, partition: int, offset: int, value: bytes | None, reason: str) -> None:
        """Store one dead letter (once per record) and count it; raises when PostgreSQL cannot take it."""
        if value is not None and len(value) > MAX_VALUE_BYTES:
            reason = f"{reason} (value truncated from {len(value)} bytes)"
            value = value[:MAX_VALUE_BYTES]
        status = await (await self._db()).execute(
            INSERT, self.consumer, topic, partition, offset, reason[:MAX_REASON_CHARS], value
        )
        if status.endswith(" 1"):
            self.counter.labels(self.consumer, topic).inc()
        log.error("%s dead-lettered %s[%d]@%d: %s", self.consumer, topic, partition, offset, reason[:500])
