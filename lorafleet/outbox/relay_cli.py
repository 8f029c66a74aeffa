"""`lorafleet relay`: run the outbox relay as its own process until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import signal

import asyncpg

from lorafleet import metrics
from lorafleet.config import RelaySettings, get_settings
from lorafleet.kafka import make_producer
from lorafleet.outbox.relay import Relay


async def _main() -> None:
    platform, settings = get_settings(), RelaySettings()
    metrics.serve(settings.metrics_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
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
    asyncio.run(_main())
