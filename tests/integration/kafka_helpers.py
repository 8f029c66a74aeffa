"""Small helpers the integration tests share for reading what reached Kafka."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer


async def collect(
    bootstrap: str,
    topic: str,
    want: Callable[[list], bool],
    timeout: float = 60.0,
    accept: Callable[[object], bool] = lambda _r: True,
) -> list:
    """Read topic from the beginning with a fresh group until want(records) or timeout; return the records."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"test-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    records: list = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not want(records):
            batch = await consumer.getmany(timeout_ms=500, max_records=2000)
            for recs in batch.values():
                records.extend(r for r in recs if accept(r))
            await asyncio.sleep(0)
    finally:
        await consumer.stop()
    return records
