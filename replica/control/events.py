"""Publish a replica.events record for every load and eviction the cache reports."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from replica.adapter_cache.tier import CacheEvent
from schemas.events import ReplicaEvent

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer

log = logging.getLogger(__name__)


def to_event(replica_id: str, e: CacheEvent) -> ReplicaEvent:
    return ReplicaEvent(
        replica_id=replica_id,
        kind=e.kind,
        adapter_id=e.adapter_id,
        from_tier=e.from_tier,
        to_tier=e.to_tier,
        duration_s=e.duration_s,
        bytes=e.bytes,
    )


class EventPublisher:
    """The cache's on_event sink: queued in the event loop, sent by run()."""

    def __init__(self, replica_id: str, max_queued: int = 10_000) -> None:
        self.replica_id = replica_id
        self.queue: asyncio.Queue[ReplicaEvent] = asyncio.Queue(max_queued)
        self.dropped = 0

    def __call__(self, e: CacheEvent) -> None:
        try:
            self.queue.put_nowait(to_event(self.replica_id, e))
        except asyncio.QueueFull:
            self.dropped += 1  # a slow broker must not slow loads; the state topic still carries rates

    async def run(self, producer: AIOKafkaProducer, stop: asyncio.Event) -> None:
        """Send queued events until stop (then flush what is left)."""
        while not (stop.is_set() and self.queue.empty()):
            try:
                event = await asyncio.wait_for(self.queue.get(), 0.5)
            except TimeoutError:
                continue
            try:
                await producer.send(event.topic.name, event.to_bytes(), key=event.key().encode())
            except Exception:  # noqa: BLE001 - keep serving; the event is lost, rates stay in replica.state
                log.exception("could not publish a replica event")
