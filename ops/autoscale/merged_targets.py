"""The merged-replica targets, followed on merged.targets without a consumer group.

The topic is compacted and each event is a level (an adapter's desired merged replicas now), so every
start reads it from the beginning and keeps the newest target per adapter; until that first read reaches
the end offsets the targets are not known (None), so a restarted actuator never drains a merged replica
whose target it has not read yet. Only the targets of its own fleet (the replica id prefix) are kept. A
record that does not decode, or that take() cannot take, is dead-lettered and the next one is read
(lorafleet.settle).
"""

from __future__ import annotations

import logging
from functools import partial

from aiokafka import TopicPartition

from lorafleet.config import PlatformSettings
from lorafleet.dead_letters import DeadLetters
from lorafleet.kafka import make_consumer
from lorafleet.settle import settle_following
from schemas import topics
from schemas.events import Event, MergedTarget

log = logging.getLogger(__name__)


class TargetFollower:
    def __init__(self, platform: PlatformSettings, fleet: str) -> None:
        self.platform, self.fleet = platform, fleet
        self.latest: dict[str, MergedTarget] = {}
        self.caught_up = False

    def targets(self) -> dict[str, int] | None:
        """adapter_id -> desired merged replicas, once the topic has been read to its end at start."""
        if not self.caught_up:
            return None
        return {a: t.desired_replicas for a, t in self.latest.items()}

    def take(self, event: Event | None) -> MergedTarget | None:
        """Keep event if it is a newer target for its adapter; the target when it was taken."""
        if not isinstance(event, MergedTarget) or event.fleet != self.fleet:
            return None
        known = self.latest.get(event.adapter_id)
        if known is not None and event.occurred_at < known.occurred_at:
            return None
        self.latest[event.adapter_id] = event
        return event

    async def run(self) -> None:
        """Follow the topic from its beginning until cancelled."""
        consumer = make_consumer(self.platform, group_id=None)
        letters = DeadLetters.own_pool("autoscale-merged-targets", self.platform)
        await consumer.start()
        try:
            topic = topics.MERGED_TARGETS
            tps = [TopicPartition(topic.name, p) for p in range(topic.partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            pending = {tp for tp in tps if ends[tp] > 0}
            self.caught_up = not pending
            while True:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for record in records:
                        where = (record.topic, record.partition, record.offset, record.value)
                        event = await letters.parse_following(*where)
                        target = await settle_following(partial(self.take, event), letters, *where)
                        if target is not None and self.caught_up:
                            log.info(
                                "merged target %s: %d (%s)",
                                target.adapter_id,
                                target.desired_replicas,
                                target.reason,
                            )
                if not self.caught_up:
                    for tp in list(pending):
                        if await consumer.position(tp) >= ends[tp]:
                            pending.discard(tp)
                    if not pending:
                        self.caught_up = True
                        log.info("merged targets read: %s", self.targets())
        finally:
            await consumer.stop()
            await letters.close()
