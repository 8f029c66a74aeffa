"""`lorafleet relay`: run the outbox relay as its own process until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio

import asyncpg

from lorafleet import metrics
from lorafleet.config import RelaySettings, get_settings
from lorafleet.kafka import make_producer
from lorafleet.outbox.relay import Relay
from lorafleet.worker import run_until_signal


async def _main(stop: asyncio.Event) -> None:
    platform, settings = get_settings(), RelaySettings()
    metrics.serve(settings.metrics_port, settings.metrics_host)
    pool = await asyncpg.create_pool(platform.database_url, min_size=1, max_size=3)
    producer = make_producer(platform)
    await producer.start()
    try:
        await Relay(pool, producer, settings).run(stop)
    finally:
        await producer.stop()
        await pool.close()


def relay() -> None:
    """Publish committed outbox rows to Kafka (idempotent producer, acks=all), in commit-safe order."""
    run_until_signal(_main)
