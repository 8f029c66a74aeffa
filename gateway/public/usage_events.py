"""requests.completed: one event per request, published straight to Kafka with the idempotent producer.

It is telemetry, not state: it does not go through the outbox, and a publish never delays or fails a
response (sends are fire-and-forget; failures are logged and counted).
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaProducer

from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_producer
from schemas.events import RequestCompleted

log = logging.getLogger(__name__)


class CompletionPublisher:
    """Owns one producer; publish() never raises."""

    def __init__(self, platform: PlatformSettings) -> None:
        self.platform = platform
        self.producer: AIOKafkaProducer | None = None
        self.failed = 0
        self._pending: set[asyncio.Future] = set()

    async def start(self) -> None:
        producer = make_producer(self.platform)
        try:
            await producer.start()
        except Exception as exc:  # noqa: BLE001 - Kafka down must not stop the gateway from serving
            log.error("requests.completed producer unavailable, events will be dropped: %s", exc)
            await producer.stop()
            return
        self.producer = producer

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.flush()
            await self.producer.stop()

    async def publish(self, event: RequestCompleted) -> None:
        if self.producer is None:
            self.failed += 1
            return
        try:
            fut = await self.producer.send(event.topic.name, event.to_bytes(), key=event.key().encode())
        except Exception as exc:  # noqa: BLE001 - telemetry
            self.failed += 1
            log.warning("requests.completed not sent: %s", exc)
            return
        self._pending.add(fut)
        fut.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future) -> None:
        self._pending.discard(fut)
        if fut.cancelled() or fut.exception() is not None:
            self.failed += 1
            log.warning(
                "requests.completed not acknowledged: %s", None if fut.cancelled() else fut.exception()
            )
