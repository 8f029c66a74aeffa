"""The outbox relay: publish unsent outbox rows to Kafka in commit-safe order, then mark them sent.

At-least-once: a crash after Kafka acks and before the mark commits republishes that batch on restart;
consumers dedupe on event_id (the `id` header and the payload's event_id). One relay holds the advisory
lock and publishes; others wait, which keeps per-key order (SKIP LOCKED with several relays would not).
Rows are claimed by the unsent flag, never by "seq > last seen", so a transaction that commits late is
published on the next poll rather than skipped. Writers of one key serialize on a per-key lock (see
writer.emit), so a key's seq order is its commit order and publishing in seq order keeps it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiokafka import AIOKafkaProducer

from lorafleet import metrics
from lorafleet.config import RelaySettings
from schemas.events import EventValidationError, validate_payload

log = logging.getLogger(__name__)

LEADER_LOCK_KEY = 0x6F757462  # "outb"


@dataclass
class RelayStats:
    published: int = 0
    dead_lettered: int = 0
    batches: int = 0


class Relay:
    """Polls the outbox and publishes; run() until stop is set."""

    def __init__(self, pool: asyncpg.Pool, producer: AIOKafkaProducer, settings: RelaySettings) -> None:
        self._pool = pool
        self._producer = producer
        self._settings = settings
        self.stats = RelayStats()

    async def publish_batch(self) -> int:
        """Claim, validate, publish and mark one batch; return how many rows it finished."""
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                """SELECT id, aggregate_type, aggregate_id, type, payload FROM outbox
                   WHERE sent_at IS NULL AND failed_at IS NULL
                   ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED""",
                self._settings.batch_size,
            )
            if not rows:
                return 0
            sent, failed = [], []
            futures = []
            for row in rows:
                try:
                    event = validate_payload(row["type"], _payload_without_type(row["payload"]))
                    if event.topic.name != row["aggregate_type"] or str(event.event_id) != str(row["id"]):
                        raise EventValidationError(
                            f"row {row['id']} routes {row['type']} to {row['aggregate_type']}; "
                            f"expected {event.topic.name} and matching event_id"
                        )
                except EventValidationError as exc:
                    log.error("outbox row %s dead-lettered, not published: %s", row["id"], exc)
                    failed.append((row["id"], str(exc)[:2000]))
                    continue
                futures.append(
                    await self._producer.send(
                        row["aggregate_type"],
                        value=event.to_bytes(),
                        key=row["aggregate_id"].encode(),
                        headers=[("id", str(row["id"]).encode()), ("type", row["type"].encode())],
                    )
                )
                sent.append(row["id"])
            await asyncio.gather(*futures)
            if self._settings.fault == "crash_after_publish" and sent:
                log.warning("fault injection: exiting after publish, before mark-sent")
                os._exit(17)
            if sent:
                await conn.execute("UPDATE outbox SET sent_at = now() WHERE id = ANY($1::uuid[])", sent)
            for row_id, error in failed:
                await conn.execute(
                    "UPDATE outbox SET failed_at = now(), error = $2 WHERE id = $1", row_id, error
                )
        self.stats.published += len(sent)
        self.stats.dead_lettered += len(failed)
        metrics.OUTBOX_PUBLISHED.inc(len(sent))
        metrics.OUTBOX_DEAD_LETTERED.inc(len(failed))
        self.stats.batches += 1
        return len(rows)

    async def unsent(self) -> int:
        """Committed rows not yet published: the relay's lag, cheap on the partial index."""
        return await self._pool.fetchval(
            "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND failed_at IS NULL"
        )

    async def prune(self) -> None:
        async with self._pool.acquire() as conn:
            await conn.execute(
                "DELETE FROM outbox WHERE sent_at < now() - make_interval(secs => $1)",
                self._settings.retention_s,
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Take leadership, then publish until stop is set."""
        leader = await self._pool.acquire()
        try:
            while not stop.is_set():
                if await leader.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK_KEY):
                    break
                log.info("another relay holds the outbox; standing by")
                await _sleep_or_stop(stop, 1.0)
            if stop.is_set():
                return  # stopped while standing by: it never led
            log.info("relay is publishing")
            cycles = 0
            while not stop.is_set():
                done = await self.publish_batch()
                cycles += 1
                if cycles % 3000 == 0:
                    await self.prune()
                if done < self._settings.batch_size:
                    metrics.OUTBOX_UNSENT.set(await self.unsent())
                    await _sleep_or_stop(stop, self._settings.poll_interval_s)
        finally:
            await self._pool.release(leader)  # releasing the connection resets it and drops the lock


def _payload_without_type(payload: str | dict[str, Any]) -> dict[str, Any]:
    data = json.loads(payload) if isinstance(payload, str) else dict(payload)
    data.pop("type", None)
    return data


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        pass
