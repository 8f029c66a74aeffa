"""`lorafleet placement-worker`: consume validated adapters, alias changes, replica state, adapter stats and
completed requests; keep placements and emit replica commands. Offsets are committed after each batch;
a record that does not decode is dead-lettered (lorafleet.dead_letters) and committed past with it, and so
is one whose handler keeps failing for another reason than the infrastructure (lorafleet.settle).

A replica.state is believed only from a registered replica at its registered address, signed with that
replica's state key (lorafleet.replica_registry), as the gateway believes it: no principal that can write
the topic, another replica included, can make a replica leave or join the fleet, or take its adapters."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

from lorafleet import metrics
from lorafleet.db.pool import close_pool, create_pool
from lorafleet.dead_letters import DeadLetters
from lorafleet.kafka import make_consumer
from lorafleet.profile import refuse_dev_tokens
from lorafleet.replica_registry import ReplicaRegistry, StateRejections
from lorafleet.retry import run_with_retry
from lorafleet.settle import settle
from lorafleet.worker import run_until_signal
from placement_worker.config import PlacementConfig
from placement_worker.consumer import PlacementWorker
from schemas import topics
from schemas.events import ReplicaState

log = logging.getLogger(__name__)

TOPICS = (
    topics.ADAPTERS_VALIDATED,
    topics.ALIASES_CHANGED,
    topics.REPLICA_STATE,
    topics.ADAPTER_STATS,
    topics.REQUESTS_COMPLETED,  # which replica served each request: spill placements' last use
)


async def run_worker(
    config: PlacementConfig, stop: asyncio.Event, ready: asyncio.Event | None = None, from_end: bool = False
) -> None:
    """Consume until stop is set; from_end skips what the topics held before start (tests, fresh groups)."""
    settings = config.placement
    pool = await create_pool(config.platform, min_size=1, max_size=4)
    consumer = make_consumer(config.platform, *(t.name for t in TOPICS), group_id=settings.group_id)
    worker = PlacementWorker(pool, settings)
    letters = DeadLetters("placement-worker", pool)
    registry = ReplicaRegistry(pool, settings.replica_id_prefix)
    rejected = StateRejections(
        lambda _: metrics.EVENTS_HANDLED.labels(
            "placement-worker", topics.REPLICA_STATE.name, "rejected"
        ).inc()
    )
    refreshing: asyncio.Task[None] | None = None
    try:
        await registry.refresh()
        refreshing = asyncio.create_task(registry.run())
        await consumer.start()
        while not consumer.assignment():  # the group join runs in aiokafka's background task
            await asyncio.sleep(0.05)
        if from_end:
            await consumer.seek_to_end(*consumer.assignment())
            for tp in consumer.assignment():
                await consumer.position(tp)
        await worker.tick()
        if ready is not None:
            ready.set()
        next_tick = time.monotonic() + settings.tick_s
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=int(settings.tick_s * 1000), max_records=500)
            for tp, records in batch.items():
                for record in records:
                    event = await letters.parse(tp.topic, tp.partition, record.offset, record.value)
                    if event is None:
                        metrics.EVENTS_HANDLED.labels("placement-worker", tp.topic, "invalid").inc()
                        continue
                    if isinstance(event, ReplicaState) and not registry.believes(
                        event, record.value, record.headers, rejected
                    ):
                        continue
                    where = (tp.topic, tp.partition, record.offset, record.value)
                    handled = await settle(partial(worker.handle, event), letters, *where)
                    outcome = "handled" if handled else "dead_lettered"
                    metrics.EVENTS_HANDLED.labels("placement-worker", tp.topic, outcome).inc()
                await consumer.commit({tp: records[-1].offset + 1})
            states = [tp for tp in consumer.assignment() if tp.topic == topics.REPLICA_STATE.name]
            await worker.feed.after_batch(consumer, states)
            if time.monotonic() >= next_tick:
                await worker.tick()
                next_tick = time.monotonic() + settings.tick_s
    finally:
        worker.feed.close()
        if refreshing is not None:
            refreshing.cancel()
            await asyncio.gather(refreshing, return_exceptions=True)
        await consumer.stop()
        await close_pool(pool)


def placement_worker() -> None:
    """Place adapters on replicas (rendezvous owners, k raised with traffic) and emit load/unload commands."""

    config = PlacementConfig.from_env()
    refuse_dev_tokens(config.platform, "placement-worker", {})
    metrics.serve(config.placement.metrics_port, config.placement.metrics_host)
    run_until_signal(
        lambda stop: run_with_retry(
            "placement-worker", lambda s: run_worker(config, s), stop, config.platform
        )
    )
