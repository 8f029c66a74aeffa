"""What the operator console shows live, followed by the internal gateway: the fleet's registered replicas
(replica.state), each replica's GPU hit rate over the last minute of completed requests (requests.completed,
from every public gateway), and the last stats windows and alerts (the console feed).

The console runs on the internal listener, never the public one; the public gateways keep their own router
view for routing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
from aiokafka.structs import TopicPartition

from gateway.config import GatewayConfig
from gateway.console.feed import ConsoleFeed, consume_console_topics
from gateway.public.routing.replica_view import ReplicaView, consume_states
from lorafleet.config import PlatformSettings
from lorafleet.dead_letters import DeadLetters
from lorafleet.kafka import make_consumer, seek_to_times
from lorafleet.replica_registry import ReplicaRegistry
from lorafleet.seen_ids import SeenIds
from schemas import topics
from schemas.events import RequestCompleted

HIT_LOOKBACK_S = 60.0  # the hit window's length: a console opened after a restart shows the last minute
# requests.completed is delivered at least once: a copy resent within this many events of the first (about
# 20 minutes at the brief's 40 requests/s) is not counted again
SEEN_COMPLETIONS = 50_000


@dataclass
class ConsoleLive:
    """The router's view of the fleet (hit rates from completions) and the stats and alerts feed."""

    view: ReplicaView
    feed: ConsoleFeed = field(default_factory=ConsoleFeed)


async def consume_completions(
    platform: PlatformSettings, view: ReplicaView, ready: asyncio.Event, letters: DeadLetters
) -> None:
    """Record the tier each completed request found its adapter on, per replica, from the last minute on;
    once per event id."""
    consumer = make_consumer(platform, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        topic = topics.REQUESTS_COMPLETED
        parts = [TopicPartition(topic.name, p) for p in range(topic.partitions)]
        consumer.assign(parts)
        await seek_to_times(consumer, dict.fromkeys(parts, int((time.time() - HIT_LOOKBACK_S) * 1000)))
        ready.set()
        seen = SeenIds(SEEN_COMPLETIONS)
        async for msg in consumer:
            event = await letters.parse_following(msg.topic, msg.partition, msg.offset, msg.value)
            if not isinstance(event, RequestCompleted) or event.replica_id is None:
                continue
            if seen.first_time(event.event_id):
                view.record_tier(event.replica_id, event.tier)
    finally:
        await consumer.stop()


@contextlib.asynccontextmanager
async def console_live(config: GatewayConfig, pool: asyncpg.Pool) -> AsyncIterator[ConsoleLive]:
    """The console's live state, its consumers running until the block ends. The internal API does not wait
    for them: the console fills in as they catch up, and a Kafka outage leaves the registry served."""
    settings = config.gateway
    live = ConsoleLive(ReplicaView(settings.replica_stale_s, replica_id_prefix=settings.replica_id_prefix))
    registry = ReplicaRegistry(pool, settings.replica_id_prefix)
    await registry.refresh()
    events = [asyncio.Event() for _ in range(3)]

    def letters(consumer: str) -> DeadLetters:
        return DeadLetters(consumer, pool)

    tasks = [
        asyncio.create_task(registry.run(), name="console-registry"),
        asyncio.create_task(
            consume_states(config.platform, live.view, events[0], letters("console-replica-state"), registry),
            name="console-replica-state",
        ),
        asyncio.create_task(
            consume_completions(config.platform, live.view, events[1], letters("console-completions")),
            name="console-completions",
        ),
        asyncio.create_task(
            consume_console_topics(config.platform, live.feed, events[2], letters("gateway-console")),
            name="console-feed",
        ),
    ]
    try:
        yield live
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
