"""Poison records on the real Kafka and PostgreSQL, one real consumer at a time: undecodable bytes and a
well-formed event of a future schema version go to dead_letters with their topic, partition, offset,
consumer and reason, are counted, are committed past, and the valid event published after them applies."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client import REGISTRY, CollectorRegistry

from harness.seed import ReadyAdapter, insert_ready_adapters
from lorafleet.config import PlatformSettings
from lorafleet.dead_letters import DeadLetters, dead_letter_counter
from lorafleet.kafka import make_producer
from ops.autoscale.merged_targets import TargetFollower
from ops.autoscale.signals import SignalFollower
from placement_worker.config import PlacementConfig, PlacementSettings
from placement_worker.main import run_worker
from replica.control.events import EventPublisher
from replica.control.service import run_control
from replica.control.state_publisher import Load, build_state
from schemas.events import (
    AdapterRegistered,
    AdapterStats,
    AutoscaleSignal,
    Event,
    MergedTarget,
    ReplicaCommand,
    ReplicaState,
)
from tests.integration.poison import Sent, poison_then_valid, send, wait_dead_lettered
from tests.integration.poison import letters as letters_of
from tests.integration.signed_states import SignedReplicas
from tests.integration.waiting import wait_until
from tests.replica.adapter_cache.helpers import Env, Unreachable, make_env

pytestmark = pytest.mark.integration

HASH = "sha256:" + "a" * 64


def count(consumer: str, topic: str, registry: CollectorRegistry = REGISTRY) -> float:
    labels = {"consumer": consumer, "topic": topic}
    return registry.get_sample_value("lorafleet_consumer_dead_letters_total", labels) or 0.0


@pytest.fixture
async def platform(services, migrated_db: str) -> PlatformSettings:
    return services.settings().model_copy(update={"database_url": migrated_db})


@pytest.fixture
async def producer(platform: PlatformSettings) -> AsyncIterator[AIOKafkaProducer]:
    p = make_producer(platform)
    await p.start()
    yield p
    await p.stop()


async def _stop(stop: asyncio.Event, task: asyncio.Task) -> None:
    stop.set()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 30)


def _assert_rows(rows: dict[Sent, asyncpg.Record], consumer: str, raw: Sent, future: Sent) -> None:
    assert rows[raw]["consumer"] == consumer and rows[raw]["value"].startswith(b"\xff\xfe")
    assert "invalid event" in rows[raw]["reason"]
    assert "schema_version" in rows[future]["reason"], rows[future]["reason"]


async def test_the_registry_validator_dead_letters_poison_and_settles_the_next_registration(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    from gateway.registry.validator.main import run_validator
    from tests.gateway.adapter_files import TARGETS, TINY_BASE_HASH, write_base_config
    from tests.gateway.registry.internal_app import gateway_config

    consumer, topic = "registry-validator", "adapters.registered"
    config = gateway_config(
        platform,
        TINY_BASE_HASH,
        write_base_config(tmp_path / "base"),
        validator_group=f"test-validator-{uuid.uuid4().hex[:8]}",
    )
    before = count(consumer, topic)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_validator(config, stop, ready=ready, from_end=True))
    try:
        await asyncio.wait_for(ready.wait(), 60)
        adapter_id = f"nobody-{uuid.uuid4().hex[:8]}"
        valid = AdapterRegistered(
            adapter_id=adapter_id,
            tenant_id="nobody",  # no such tenant: the validator refuses it, and records that it did
            version=1,
            base_model_hash=TINY_BASE_HASH,
            rank=4,
            alpha=8.0,
            target_modules=TARGETS,
            weights_uri="s3://lorafleet-adapters/none",
            checksum=HASH,
        )
        key = adapter_id.encode()
        raw, future, rows = await poison_then_valid(producer, pool, consumer, topic, key, valid)
        _assert_rows(rows, consumer, raw, future)

        async def settled() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT count(*) FROM processed_events WHERE event_id = $1", valid.event_id
                )
            )

        await wait_until(settled, "the valid registration after the poison settled", timeout=60)
        assert count(consumer, topic) - before >= 2
    finally:
        await _stop(stop, task)


async def test_the_placement_worker_dead_letters_poison_and_applies_the_next_state(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool
) -> None:
    consumer, topic = "placement-worker", "replica.state"
    run = uuid.uuid4().hex[:6]
    settings = PlacementSettings(group_id=f"test-placement-{run}", replica_id_prefix=f"t{run}-r", tick_s=0.2)
    before = count(consumer, topic)
    valid = ReplicaState(replica_id=f"t{run}-r0", url="http://127.0.0.1:1", gpu_slots=4)
    signed = SignedReplicas(platform.database_url)
    await signed.register(valid.replica_id, valid.url)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        run_worker(PlacementConfig(platform, settings), stop, ready=ready, from_end=True)
    )
    try:
        await asyncio.wait_for(ready.wait(), 60)
        key = valid.key().encode()
        headers = signed.headers(valid, valid.to_bytes())
        raw, future, rows = await poison_then_valid(
            producer, pool, consumer, topic, key, valid, headers=headers
        )
        _assert_rows(rows, consumer, raw, future)

        async def member() -> bool:
            return bool(
                await pool.fetchval("SELECT count(*) FROM replicas WHERE replica_id = $1", valid.replica_id)
            )

        await wait_until(
            member, "the replica of the state after the poison in the replicas table", timeout=60
        )
        assert count(consumer, topic) - before >= 2
    finally:
        await _stop(stop, task)


POISON_STATS = """
CREATE FUNCTION poison_stats() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.adapter_id LIKE 'poison-%' THEN
        RAISE EXCEPTION 'injected fault' USING ERRCODE = '22023';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER poison_stats BEFORE INSERT ON adapter_stats FOR EACH ROW EXECUTE FUNCTION poison_stats();
"""


async def test_an_event_whose_handler_keeps_failing_is_dead_lettered_and_the_next_applies(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool
) -> None:
    """Well-formed, but the database refuses its effect (a fault injected into the real PostgreSQL: a data
    exception, not an outage): the real placement worker tries it three times, dead-letters it with the
    error and commits past it, so the stats after it on the same partition still apply."""
    run = uuid.uuid4().hex[:6]
    poison, fine = f"poison-{run}", f"acme-{run}-fine"
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme') ON CONFLICT DO NOTHING")
    await insert_ready_adapters(pool, [ReadyAdapter(poison, "acme", HASH), ReadyAdapter(fine, "acme", HASH)])
    await pool.execute(POISON_STATS)
    settings = PlacementSettings(group_id=f"test-placement-{run}", replica_id_prefix=f"t{run}-r", tick_s=0.2)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        run_worker(PlacementConfig(platform, settings), stop, ready=ready, from_end=True)
    )
    try:
        await asyncio.wait_for(ready.wait(), 60)
        window = datetime.now(UTC).replace(microsecond=0)
        sent = []
        for adapter in (poison, fine):  # one key, so one partition, in this order
            stats = AdapterStats(
                adapter_id=adapter,
                window_start=window,
                window_seconds=60,
                requests=5,
                tokens_per_s=9.0,
                gpu_hit_rate=1.0,
            )
            meta = await producer.send_and_wait(stats.topic.name, stats.to_bytes(), key=b"one-key")
            sent.append(Sent(stats.topic.name, meta.partition, meta.offset))

        async def fine_applied() -> bool:
            return bool(await pool.fetchval("SELECT count(*) FROM adapter_stats WHERE adapter_id = $1", fine))

        await wait_until(fine_applied, "the stats after the failing one applied", timeout=60)
        rows = await wait_dead_lettered(pool, "placement-worker", sent[:1])
        reason = rows[sent[0]]["reason"]
        assert "failed 3 times" in reason and "injected fault" in reason, reason
    finally:
        await _stop(stop, task)


async def test_the_replica_dead_letters_poison_commands_and_applies_the_next_one(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    consumer, topic = "replica-commands", "replica.commands"
    replica_id = f"rd-{uuid.uuid4().hex[:10]}"
    env = make_env(tmp_path)
    env.add("a1", seed=1)
    registry = CollectorRegistry()
    letters = DeadLetters.own_pool(consumer, platform, dead_letter_counter(registry))
    events = EventPublisher(replica_id)

    def make_state() -> ReplicaState:
        return build_state(replica_id, "http://127.0.0.1:1", "ready", env.cache, 2, Load(0, 0))

    stop = asyncio.Event()
    task = asyncio.create_task(
        run_control(platform, replica_id, env.cache, events, make_state, stop, 0.2, None, letters)
    )
    try:
        valid = ReplicaCommand(replica_id=replica_id, command="load", adapter_id="a1", target_tier="ram")
        key = replica_id.encode()
        raw, future, rows = await poison_then_valid(producer, pool, consumer, topic, key, valid)
        _assert_rows(rows, consumer, raw, future)

        async def loaded() -> bool:
            return env.cache.tier_of("a1") == "ram"

        await wait_until(loaded, "the load command after the poison applied", timeout=60)
        assert count(consumer, topic, registry) >= 2
    finally:
        await _stop(stop, task)
        await letters.close()


async def _run_replica(
    platform: PlatformSettings, replica_id: str, env: Env, letters: DeadLetters, stop: asyncio.Event
) -> asyncio.Task:
    def make_state() -> ReplicaState:
        return build_state(replica_id, "http://127.0.0.1:1", "ready", env.cache, 2, Load(0, 0))

    events = EventPublisher(replica_id)
    return asyncio.create_task(
        run_control(platform, replica_id, env.cache, events, make_state, stop, 0.2, None, letters)
    )


async def test_the_replica_dead_letters_a_command_whose_load_keeps_failing_and_applies_the_next_one(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """Well-formed, but the adapter's bytes in the object store do not hash to its registered checksum:
    the real replica control loop tries the load three times, dead-letters the command with the error and
    commits past it, so the load after it on the same partition still applies."""
    consumer, topic = "replica-commands", "replica.commands"
    replica_id = f"rd-{uuid.uuid4().hex[:10]}"
    env = make_env(tmp_path)
    env.add("corrupt", seed=2, digest="0" * 64)
    env.add("a1", seed=1)
    letters = DeadLetters.own_pool(consumer, platform, dead_letter_counter(CollectorRegistry()))
    stop = asyncio.Event()
    task = await _run_replica(platform, replica_id, env, letters, stop)
    try:
        key = replica_id.encode()
        bad = ReplicaCommand(replica_id=replica_id, command="load", adapter_id="corrupt")
        failing = await send(producer, topic, bad.to_bytes(), key)
        valid = ReplicaCommand(replica_id=replica_id, command="load", adapter_id="a1")
        await send(producer, topic, valid.to_bytes(), key)

        async def loaded() -> bool:
            return env.cache.tier_of("a1") == "ram"

        await wait_until(loaded, "the load command after the failing one applied", timeout=60)
        rows = await wait_dead_lettered(pool, consumer, [failing])
        reason = rows[failing]["reason"]
        assert "failed 3 times: ChecksumMismatchError" in reason, reason
        assert rows[failing]["value"] == bad.to_bytes() and env.cache.tier_of("corrupt") == "remote"
    finally:
        await _stop(stop, task)
        await letters.close()


async def test_the_replica_reads_a_command_again_after_the_registry_was_unreachable_and_loses_nothing(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """The registry is unreachable for the first two tries: the command is neither dead-lettered nor
    committed past, and the batch read again after a backoff applies it."""
    consumer, topic = "replica-commands", "replica.commands"
    replica_id = f"rd-{uuid.uuid4().hex[:10]}"
    env = make_env(tmp_path)
    env.cache.registry = env.registry = Unreachable(down=2)
    env.add("a1", seed=1)
    letters = DeadLetters.own_pool(consumer, platform, dead_letter_counter(CollectorRegistry()))
    stop = asyncio.Event()
    task = await _run_replica(platform, replica_id, env, letters, stop)
    try:
        command = ReplicaCommand(replica_id=replica_id, command="load", adapter_id="a1")
        sent = await send(producer, topic, command.to_bytes(), replica_id.encode())

        async def loaded() -> bool:
            return env.cache.tier_of("a1") == "ram"

        await wait_until(loaded, "the load applied once the registry answered", timeout=60)
        assert env.registry.calls == 3 and env.registry.down == 0
        assert sent not in await letters_of(pool, consumer)
    finally:
        await _stop(stop, task)
        await letters.close()


async def test_the_autoscaler_dead_letters_poison_signals_and_takes_the_next_one(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool
) -> None:
    consumer, topic = "autoscale-signals", "autoscale.signals"
    fleet = f"fleet-{uuid.uuid4().hex[:8]}"
    follower = SignalFollower(platform, fleet, max_age_s=600)
    before = count(consumer, topic)
    task = asyncio.create_task(follower.run())
    try:
        valid = AutoscaleSignal(fleet=fleet, current_replicas=1, desired_replicas=3, reason="test")
        key = valid.key().encode()
        raw, future, rows = await poison_then_valid(producer, pool, consumer, topic, key, valid)
        _assert_rows(rows, consumer, raw, future)

        async def taken() -> bool:
            return follower.desired() == 3

        await wait_until(taken, "the signal after the poison taken", timeout=60)
        assert count(consumer, topic) - before >= 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_merged_actuator_dead_letters_poison_targets_and_keeps_the_next_one(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool
) -> None:
    consumer, topic = "autoscale-merged-targets", "merged.targets"
    fleet = f"t{uuid.uuid4().hex[:8]}-r"
    follower = TargetFollower(platform, fleet)
    before = count(consumer, topic)
    task = asyncio.create_task(follower.run())
    try:
        adapter_id = f"acme-{uuid.uuid4().hex[:8]}"
        valid = MergedTarget(adapter_id=adapter_id, desired_replicas=1, reason="promote", fleet=fleet)
        key = valid.key().encode()
        raw, future, rows = await poison_then_valid(producer, pool, consumer, topic, key, valid, timeout=120)
        _assert_rows(rows, consumer, raw, future)

        async def kept() -> bool:
            return adapter_id in follower.latest

        await wait_until(kept, "the target after the poison kept", timeout=60)
        assert count(consumer, topic) - before >= 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def naive(event: Event) -> bytes:
    """The event with a well-formed occurred_at that carries no UTC offset: it decodes, and comparing it
    with the aware time of the event taken before it raises TypeError."""
    return event.model_copy(update={"occurred_at": datetime.now()}).to_bytes()  # noqa: DTZ005


async def test_the_autoscaler_dead_letters_a_signal_it_cannot_take_and_takes_the_next_one(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool
) -> None:
    consumer, topic = "autoscale-signals", "autoscale.signals"
    fleet = f"fleet-{uuid.uuid4().hex[:8]}"
    follower = SignalFollower(platform, fleet, max_age_s=600)
    task = asyncio.create_task(follower.run())
    try:
        first = AutoscaleSignal(fleet=fleet, current_replicas=1, desired_replicas=2, reason="test")
        key = first.key().encode()
        await send(producer, topic, first.to_bytes(), key)
        failing = await send(producer, topic, naive(first.model_copy(update={"desired_replicas": 9})), key)
        valid = AutoscaleSignal(fleet=fleet, current_replicas=1, desired_replicas=3, reason="test")
        await send(producer, topic, valid.to_bytes(), key)

        async def taken() -> bool:
            return follower.desired() == 3

        await wait_until(taken, "the signal after the one it could not take taken", timeout=60)
        reason = (await wait_dead_lettered(pool, consumer, [failing]))[failing]["reason"]
        assert reason.startswith("the handler failed: TypeError: can't compare"), reason
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_merged_actuator_dead_letters_a_target_it_cannot_take_and_keeps_the_next_one(
    platform: PlatformSettings, producer: AIOKafkaProducer, pool: asyncpg.Pool
) -> None:
    consumer, topic = "autoscale-merged-targets", "merged.targets"
    fleet = f"t{uuid.uuid4().hex[:8]}-r"
    follower = TargetFollower(platform, fleet)
    task = asyncio.create_task(follower.run())
    try:
        adapter_id = f"acme-{uuid.uuid4().hex[:8]}"
        first = MergedTarget(adapter_id=adapter_id, desired_replicas=1, reason="promote", fleet=fleet)
        key = first.key().encode()
        await send(producer, topic, first.to_bytes(), key)
        failing = await send(producer, topic, naive(first.model_copy(update={"desired_replicas": 5})), key)
        valid = MergedTarget(adapter_id=adapter_id, desired_replicas=2, reason="promote", fleet=fleet)
        await send(producer, topic, valid.to_bytes(), key)

        async def kept() -> bool:
            target = follower.latest.get(adapter_id)
            return target is not None and target.desired_replicas == 2

        await wait_until(kept, "the target after the one it could not take kept", timeout=120)
        reason = (await wait_dead_lettered(pool, consumer, [failing]))[failing]["reason"]
        assert reason.startswith("the handler failed: TypeError: can't compare"), reason
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_cli_lists_consumer_dead_letters_and_refused_outbox_rows(
    services, migrated_db: str, pool: asyncpg.Pool
) -> None:
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    letters = DeadLetters("placement-worker", pool, dead_letter_counter(CollectorRegistry()))
    await letters.record("replica.state", 3, 41, b"\xff not json", "invalid event: not JSON")
    await letters.record("replica.state", 3, 41, b"\xff not json", "invalid event: not JSON")  # redelivered
    await pool.execute(
        """INSERT INTO outbox (id, aggregate_type, aggregate_id, type, payload, failed_at, error)
           VALUES ($1, 'aliases.changed', 'a', 'alias.changed', '{}', now(), 'invalid alias.changed')""",
        uuid.uuid4(),
    )
    env = {**os.environ, **services.env(), "LORAFLEET_DATABASE_URL": platform.database_url}

    def cli(*args: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-m", "lorafleet.cli", "dead-letters", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    listed = [json.loads(line) for line in cli("--json")]
    assert [(d["consumer"], d["topic"], d["partition"], d["offset"]) for d in listed] == [
        ("outbox-relay", "aliases.changed", None, None),
        ("placement-worker", "replica.state", 3, 41),
    ]
    assert listed[1]["reason"] == "invalid event: not JSON" and listed[1]["value"].endswith("not json")
    (line,) = cli("--consumer", "placement-worker")
    assert "placement-worker replica.state[3]@41: invalid event: not JSON" in line


async def test_a_dead_letter_postgres_cannot_take_raises_for_a_committing_consumer_and_a_follower_skips_it(
    services,
) -> None:
    from harness.ports import free_port
    from lorafleet.db.pool import create_pool

    # a PostgreSQL that is down: nothing listens on the port
    down = services.settings().model_copy(
        update={"database_url": f"postgresql://lorafleet:lorafleet@127.0.0.1:{free_port()}/lorafleet"}
    )
    registry = CollectorRegistry()
    letters = DeadLetters(
        "placement-worker", lambda: create_pool(down, min_size=1, max_size=1), dead_letter_counter(registry)
    )
    with pytest.raises(OSError):  # the consumer commits nothing past it; its retry loop reads it again
        await letters.parse("replica.state", 0, 7, b"\xff not json")
    assert await letters.parse_following("replica.state", 0, 8, b"\xff not json") is None
    await letters.record_following("replica.state", 0, 9, b"{}", "the handler failed: TypeError: x")
    assert count("placement-worker", "replica.state", registry) == 0  # counted only once stored
