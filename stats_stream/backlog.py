"""Where the stream's reading of each source partition resumes and where it ends, asked of Kafka.

Measured when partitions are assigned, so the catch-up rule knows which events were already waiting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_consumer
from stats_stream.catchup import CatchUp, Partition

log = logging.getLogger(__name__)


async def source_offsets(
    platform: PlatformSettings, group_id: str, partitions: Collection[TopicPartition]
) -> tuple[dict[Partition, int], dict[Partition, int]]:
    """(end offset, committed offset or the log start where none) per partition, for the group."""
    consumer = make_consumer(platform, group_id=group_id)
    await consumer.start()
    try:
        tps = list(partitions)
        ends = await consumer.end_offsets(tps) if tps else {}
        begins = await consumer.beginning_offsets(tps) if tps else {}
        starts: dict[Partition, int] = {}
        for tp in tps:
            committed = await consumer.committed(tp)
            starts[(tp.topic, tp.partition)] = max(begins[tp], committed or 0)
        return {(tp.topic, tp.partition): end for tp, end in ends.items()}, starts
    finally:
        await consumer.stop()


async def measure(
    catchup: CatchUp,
    platform: PlatformSettings,
    group_id: str,
    partitions: Collection[TopicPartition],
    attempts: int = 3,
) -> None:
    """Start the catch-up rule on a new assignment; while unmeasured, no window closes on idleness."""
    for attempt in range(1, attempts + 1):
        try:
            ends, starts = await source_offsets(platform, group_id, partitions)
        except KafkaError as exc:
            log.warning("measuring the source backlog failed (attempt %d): %s", attempt, exc)
            await asyncio.sleep(1.0)
            continue
        catchup.start(ends, starts)
        return
    log.error("source backlog unmeasured: windows close by event time only until the next assignment")
