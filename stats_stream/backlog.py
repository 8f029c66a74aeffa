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
    try:
        await consumer.start()
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
    assignment: int,
    retry_s: float = 1.0,
    max_retry_s: float = 30.0,
) -> None:
    """Start the catch-up rule on an assignment (`catchup.assignment` when it was made), once measured."""
    # no window closes until the backlog is measured: a failure is retried until the assignment moves on
    delay = retry_s
    while catchup.assignment == assignment:
        try:
            ends, starts = await source_offsets(platform, group_id, partitions)
        except KafkaError as exc:
            log.warning("measuring the source backlog failed (retrying in %.0f s): %s", delay, exc)
            await asyncio.sleep(delay)
            delay = min(2 * delay, max_retry_s)
            continue
        if catchup.assignment == assignment:  # not revoked while Kafka was asked
            catchup.start(ends, starts)
        return
