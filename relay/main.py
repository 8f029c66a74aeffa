"""`lorafleet relay`: run the outbox relay as its own process until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio

from lorafleet import metrics
from lorafleet.config import PlatformSettings, RelaySettings, get_settings
from lorafleet.db.pool import close_pool, create_pool
from lorafleet.kafka import make_producer
from lorafleet.profile import refuse_dev_tokens
from lorafleet.retry import run_with_retry
from lorafleet.worker import run_until_signal
from relay.publisher import Relay
from schemas import principals


async def _attempt(platform: PlatformSettings, settings: RelaySettings, stop: asyncio.Event) -> None:
    """One run on fresh clients; an outage raises out of it and the retry loop starts another."""
    pool = await create_pool(platform, min_size=1, max_size=3)
    producer = make_producer(platform)
    try:
        await producer.start()
        await Relay(pool, producer, settings).run(stop)
    finally:
        await producer.stop()
        await close_pool(pool)


async def _main(stop: asyncio.Event) -> None:
    platform, settings = get_settings().as_service(principals.RELAY), RelaySettings()
    refuse_dev_tokens(platform, "relay", {})
    metrics.serve(settings.metrics_port, settings.metrics_host)
    await run_with_retry("relay", lambda s: _attempt(platform, settings, s), stop, platform)


def relay() -> None:
    """Publish committed outbox rows to Kafka (idempotent producer, acks=all), in commit-safe order."""
    run_until_signal(_main)
