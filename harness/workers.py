"""Workers that a stack runs inside the test or bench process: the outbox relay and the placement worker,
each until its block ends. Both start from the topics' ends: a shared Kafka holds every earlier run's events.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg

from lorafleet.config import PlatformSettings, RelaySettings
from lorafleet.kafka import make_producer
from lorafleet.retry import run_with_retry
from placement_worker.config import PlacementConfig, PlacementSettings
from placement_worker.main import run_worker
from relay.publisher import Relay


@contextlib.asynccontextmanager
async def outbox_relay(
    platform: PlatformSettings, pool: asyncpg.Pool, poll_interval_s: float = 0.05
) -> AsyncIterator[None]:
    """The relay publishing the outbox of pool's database to platform's Kafka."""
    producer = make_producer(platform)
    await producer.start()
    stop = asyncio.Event()
    settings = RelaySettings(poll_interval_s=poll_interval_s, metrics_port=0)
    task = asyncio.create_task(Relay(pool, producer, settings).run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await producer.stop()


@contextlib.asynccontextmanager
async def placement_worker(
    platform: PlatformSettings, settings: PlacementSettings, ready_within_s: float = 60.0
) -> AsyncIterator[None]:
    """The placement worker as `lorafleet placement-worker` runs it (a failure restarts it), from the
    topics' ends; entered once it is ready."""
    config = PlacementConfig(platform, settings)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        run_with_retry(
            "placement-worker",
            lambda stop: run_worker(config, stop, ready=ready, from_end=True),
            stop,
            platform,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), ready_within_s)
        yield
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
