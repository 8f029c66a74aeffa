"""The gateway's followers (aliases.changed, replica.state, the console's adapter.stats) on the real Kafka and
PostgreSQL: poison goes to dead_letters and is counted on the gateway's own registry, and the valid event
published after it still reaches the cache."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from gateway.console.feed import ConsoleFeed, consume_console_topics
from gateway.public.metrics import GatewayMetrics
from gateway.public.routing.alias_cache import AliasCache, consume_alias_changes
from gateway.public.routing.replica_view import ReplicaView, consume_states
from gateway.public.routing.rollout import AliasTarget
from gateway.registry.aliases import set_alias
from harness.seed import ReadyAdapter, insert_ready_adapters
from lorafleet.config import PlatformSettings, RelaySettings
from lorafleet.dead_letters import DeadLetters
from lorafleet.kafka import make_producer
from relay.publisher import Relay
from schemas.events import AdapterStats, AliasChanged, ReplicaState
from tests.integration.poison import (
    future_version,
    poison_then_valid,
    poison_until_read,
    send,
    wait_dead_lettered,
)
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.integration

HASH = "sha256:" + "a" * 64
HOUR = 3600.0


@pytest.fixture
async def platform(services, migrated_db: str) -> PlatformSettings:
    return services.settings().model_copy(update={"database_url": migrated_db})


@pytest.fixture
async def producer(platform: PlatformSettings) -> AsyncIterator[AIOKafkaProducer]:
    p = make_producer(platform)
    await p.start()
    yield p
    await p.stop()


def count(metrics: GatewayMetrics, consumer: str, topic: str) -> float:
    labels = {"consumer": consumer, "topic": topic}
    return metrics.registry.get_sample_value("lorafleet_consumer_dead_letters_total", labels) or 0.0


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_the_alias_follower_dead_letters_poison_and_the_relayed_move_still_applies(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool
) -> None:
    consumer, topic = "gateway-aliases", "aliases.changed"
    run = uuid.uuid4().hex[:6]
    alias = f"acme/dl-{run}:prod"
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    await insert_ready_adapters(pool, [ReadyAdapter(f"acme-dl-{run}-v{v}", "acme", HASH, v) for v in (1, 2)])
    await set_alias(pool, alias, f"acme-dl-{run}-v1")
    cache, metrics = AliasCache(pool, ttl_s=HOUR), GatewayMetrics()
    letters = DeadLetters(consumer, pool, metrics.dead_letters)
    task = asyncio.create_task(consume_alias_changes(platform, cache, asyncio.Event(), letters))
    stop = asyncio.Event()
    relay = None
    try:
        assert await cache.resolve("acme", alias) == AliasTarget(f"acme-dl-{run}-v1")
        key = alias.encode()
        raw = await poison_until_read(producer, pool, consumer, topic, key)
        valid = AliasChanged(alias=alias, tenant_id="acme", adapter_id=f"acme-dl-{run}-v2", revision=2)
        future = await send(producer, topic, future_version(valid), key)
        rows = await wait_dead_lettered(pool, consumer, [raw, future])
        assert "schema_version" in rows[future]["reason"] and rows[raw]["value"].startswith(b"\xff\xfe")
        assert await cache.resolve("acme", alias) == AliasTarget(f"acme-dl-{run}-v1")  # cached, unmoved
        await set_alias(pool, alias, f"acme-dl-{run}-v2")  # its aliases.changed goes out through the relay
        relay = asyncio.create_task(Relay(pool, producer, RelaySettings(poll_interval_s=0.05)).run(stop))

        async def moved() -> bool:
            return await cache.resolve("acme", alias) == AliasTarget(f"acme-dl-{run}-v2")

        await wait_until(moved, "the relayed alias move after the poison applied", timeout=60)
        assert count(metrics, consumer, topic) >= 2
    finally:
        stop.set()
        if relay is not None:
            await asyncio.gather(relay, return_exceptions=True)
        await _cancel(task)


async def test_the_replica_state_follower_dead_letters_poison_and_sees_the_next_state(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool
) -> None:
    consumer, topic = "gateway-replica-state", "replica.state"
    prefix = f"g{uuid.uuid4().hex[:8]}-r"
    view, metrics = ReplicaView(stale_s=60.0, replica_id_prefix=prefix), GatewayMetrics()
    letters = DeadLetters(consumer, pool, metrics.dead_letters)
    task = asyncio.create_task(consume_states(platform, view, asyncio.Event(), letters))
    try:
        valid = ReplicaState(replica_id=f"{prefix}0", url="http://127.0.0.1:1", gpu_slots=4)
        key = valid.key().encode()
        raw, future, rows = await poison_then_valid(producer, pool, consumer, topic, key, valid)
        assert "schema_version" in rows[future]["reason"]

        async def seen() -> bool:
            return [s.replica_id for s, _ in view.states()] == [valid.replica_id]

        await wait_until(seen, "the state after the poison in the view", timeout=60)
        assert count(metrics, consumer, topic) >= 2
    finally:
        await _cancel(task)


async def test_the_console_follower_dead_letters_poison_and_shows_the_next_window(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool
) -> None:
    consumer, topic = "gateway-console", "adapter.stats"
    feed, metrics = ConsoleFeed(), GatewayMetrics()
    letters = DeadLetters(consumer, pool, metrics.dead_letters)
    task = asyncio.create_task(consume_console_topics(platform, feed, asyncio.Event(), letters))
    try:
        adapter_id = f"acme-dl-{uuid.uuid4().hex[:8]}"
        valid = AdapterStats(
            adapter_id=adapter_id,
            window_start=datetime.now(UTC),
            window_seconds=60.0,
            requests=3,
            tokens_per_s=1.0,
            gpu_hit_rate=1.0,
        )
        key = adapter_id.encode()
        raw, future, rows = await poison_then_valid(producer, pool, consumer, topic, key, valid)
        assert "schema_version" in rows[future]["reason"]

        async def shown() -> bool:
            return [w.requests for w in feed.windows({adapter_id})] == [3]

        await wait_until(shown, "the window after the poison on the console", timeout=60)
        assert count(metrics, consumer, topic) >= 2
    finally:
        await _cancel(task)
