"""The latest autoscale signal of one fleet, followed on autoscale.signals without a consumer group.

A signal is a level (the desired count now), so only the newest one matters. Committed offsets would
replay every signal since the last commit after a restart, and `latest` would drop the current one until
the next window closes; instead each start seeks to the first offset written `max_age_s` ago, reads forward
and keeps the newest signal, and a signal older than `max_age_s` is never acted on. A record that does not
decode, or that take() cannot take, is dead-lettered and the next one is read (lorafleet.settle).
"""

from __future__ import annotations

import logging
import time
from functools import partial

from aiokafka import TopicPartition

from lorafleet.config import PlatformSettings
from lorafleet.dead_letters import DeadLetters
from lorafleet.kafka import make_consumer
from lorafleet.settle import settle_following
from ops.autoscale.decide import Demand
from schemas import topics
from schemas.events import AutoscaleSignal, Event

log = logging.getLogger(__name__)


class SignalFollower:
    def __init__(self, platform: PlatformSettings, fleet: str, max_age_s: float) -> None:
        self.platform, self.fleet, self.max_age_s = platform, fleet, max_age_s
        self.latest: AutoscaleSignal | None = None

    def desired(self, now: float | None = None) -> int | None:
        """The newest signal's desired count, or None when there is none younger than max_age_s."""
        demand = self.demand(now)
        return demand.replicas if demand is not None else None

    def demand(self, now: float | None = None) -> Demand | None:
        """The newest signal's demand, or None when there is none younger than max_age_s."""
        s = self.latest
        if s is None or (now or time.time()) - s.occurred_at.timestamp() > self.max_age_s:
            return None
        return Demand(s.desired_replicas, s.thrashing_replicas, s.slot_demand)

    def take(self, event: Event | None) -> AutoscaleSignal | None:
        """Keep event if it is a newer signal of our fleet; the signal when it was taken."""
        if not isinstance(event, AutoscaleSignal) or event.fleet != self.fleet:
            return None
        if self.latest is not None and event.occurred_at < self.latest.occurred_at:
            return None
        self.latest = event
        return event

    async def run(self) -> None:
        """Follow the topic until cancelled, from max_age_s back."""
        consumer = make_consumer(self.platform, group_id=None)
        letters = DeadLetters.own_pool("autoscale-signals", self.platform)
        await consumer.start()
        try:
            topic = topics.AUTOSCALE_SIGNALS
            tps = [TopicPartition(topic.name, p) for p in range(topic.partitions)]
            consumer.assign(tps)
            since_ms = int((time.time() - self.max_age_s) * 1000)
            found = await consumer.offsets_for_times({tp: since_ms for tp in tps})
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                at = found.get(tp)
                consumer.seek(tp, at.offset if at is not None else ends[tp])
            async for record in consumer:
                before = self.latest.desired_replicas if self.latest is not None else None
                where = (record.topic, record.partition, record.offset, record.value)
                event = await letters.parse_following(*where)
                signal = await settle_following(partial(self.take, event), letters, *where)
                if signal is not None and signal.desired_replicas != before:
                    log.info(
                        "signal desired=%d current=%d (%s)",
                        signal.desired_replicas,
                        signal.current_replicas,
                        signal.reason,
                    )
        finally:
            await consumer.stop()
            await letters.close()
