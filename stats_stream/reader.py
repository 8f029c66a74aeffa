"""A bounded read of the stats topics for `lorafleet stats`: from N seconds ago up to the current end."""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_consumer
from schemas import topics as t
from schemas.events import Event, EventValidationError, parse_event

log = logging.getLogger(__name__)
STATS_TOPICS: tuple[t.Topic, ...] = (t.ADAPTER_STATS, t.ALERTS, t.AUTOSCALE_SIGNALS)


async def read_recent(
    platform: PlatformSettings, since_s: float, timeout_s: float, topics: tuple[t.Topic, ...] = STATS_TOPICS
) -> list[Event]:
    """Every valid event published in the last since_s seconds on the given topics (no consumer group)."""
    consumer = make_consumer(platform, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [
            TopicPartition(topic.name, p)
            for topic in topics
            for p in sorted(
                consumer.partitions_for_topic(topic.name) or await _partitions(consumer, topic.name)
            )
        ]
        if not partitions:
            return []
        consumer.assign(partitions)
        since_ms = int((time.time() - since_s) * 1000)
        starts = await consumer.offsets_for_times({tp: since_ms for tp in partitions})
        ends = await consumer.end_offsets(partitions)
        for tp in partitions:
            found = starts.get(tp)
            consumer.seek(tp, found.offset if found is not None else ends[tp])
        return await _drain(consumer, ends, timeout_s)
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    await consumer._client.force_metadata_update()  # aiokafka has no public "describe topic"
    return consumer.partitions_for_topic(topic) or set()


async def _drain(
    consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int], timeout_s: float
) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + timeout_s
    remaining = {tp for tp, end in ends.items() if await consumer.position(tp) < end}
    while remaining and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=500, max_records=5000)
        for tp, records in batch.items():
            for record in records:
                if record.offset < ends[tp]:
                    try:
                        events.append(parse_event(record.value, topic=tp.topic))
                    except EventValidationError:
                        log.warning("skipping an invalid event at %s:%d", tp, record.offset)
            if await consumer.position(tp) >= ends[tp]:
                remaining.discard(tp)
        await asyncio.sleep(0)
    return events
