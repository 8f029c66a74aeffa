"""A private broker started the way `lorafleet services up` starts one (SASL/SCRAM, the fleet's ACLs):
each service's principal may write only its own topics, a client without the right password is refused,
and the real relay publishes to the gateway's real alias-cache consumer over SASL."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncpg
import pytest
from aiokafka.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError
from prometheus_client import CollectorRegistry

from gateway.public.routing.alias_cache import AliasCache, consume_alias_changes
from gateway.public.routing.rollout import AliasTarget
from gateway.registry.aliases import set_alias
from harness.ports import free_port
from harness.processes import stop
from harness.seed import ReadyAdapter, insert_ready_adapters
from lorafleet.config import PlatformSettings
from lorafleet.dead_letters import DeadLetters, dead_letter_counter
from lorafleet.kafka import ensure_topics
from ops.stack import kafka
from schemas import principals
from schemas import topics as t
from tests.integration.kafka_helpers import connects, login, produce
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DENIED = (TopicAuthorizationFailedError, ClusterAuthorizationFailedError)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformSettings]:
    """A broker of its own (own data dir and ports), stopped by its pid afterwards."""
    settings = PlatformSettings(
        data_dir=tmp_path_factory.mktemp("sasl-kafka"),
        kafka_bootstrap=f"127.0.0.1:{free_port()}",
        kafka_controller_port=free_port(),
    )
    # in a thread: up() and ensure_topics use asyncio.run, which must not touch pytest-asyncio's loop
    with ThreadPoolExecutor(1) as pool:
        try:
            pool.submit(kafka.up, settings, 240.0).result()
            pool.submit(asyncio.run, ensure_topics(kafka.admin_settings(settings))).result()
            yield settings
        finally:
            kafka.down(settings)


async def test_only_a_replica_writes_replica_state_and_replica_events(broker: PlatformSettings) -> None:
    for topic in (t.REPLICA_STATE.name, t.REPLICA_EVENTS.name):
        await produce(login(broker, principals.REPLICA), topic)
        for other in set(principals.SERVICES) - {principals.REPLICA}:
            with pytest.raises(DENIED):
                await produce(login(broker, other), topic)


async def test_the_gateway_forging_replica_state_gets_topic_authorization_failed(
    broker: PlatformSettings,
) -> None:
    with pytest.raises(TopicAuthorizationFailedError):
        await produce(login(broker, principals.GATEWAY), t.REPLICA_STATE.name)
    await produce(login(broker, principals.GATEWAY), t.REQUESTS_COMPLETED.name)  # its own output


@pytest.mark.parametrize("topic", [c.name for c in t.CONTROL_TOPICS])
async def test_only_the_relay_writes_a_control_plane_topic(broker: PlatformSettings, topic: str) -> None:
    await produce(login(broker, principals.RELAY), topic)
    for other in set(principals.SERVICES) - {principals.RELAY}:
        with pytest.raises(DENIED):
            await produce(login(broker, other), topic)


async def test_the_relay_writes_nothing_but_the_control_plane(broker: PlatformSettings) -> None:
    with pytest.raises(TopicAuthorizationFailedError):
        await produce(login(broker, principals.RELAY), t.REPLICA_STATE.name)


async def test_a_client_without_credentials_or_with_a_wrong_password_is_refused(
    broker: PlatformSettings,
) -> None:
    assert await connects(login(broker, principals.GATEWAY))
    assert not await connects(login(broker, principals.GATEWAY, password="not-the-password"))
    assert not await connects(login(broker, "nobody", password="dev-kafka-nobody"))
    plaintext = broker.model_copy(update={"kafka_security_protocol": "PLAINTEXT"})
    assert not await connects(plaintext)


async def test_the_relay_publishes_an_alias_move_the_gateway_cache_applies(
    broker: PlatformSettings, pool: asyncpg.Pool, migrated_db: str, tmp_path: Path
) -> None:
    """Both neighbours real and each on its own principal: the relay process, the gateway's consumer."""
    tenant = f"t{uuid.uuid4().hex[:8]}"
    alias = f"{tenant}/support:prod"
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ($1)", tenant)
    versions = [ReadyAdapter(f"{tenant}-v{v}", tenant, "sha256:" + "a" * 64, v) for v in (1, 2)]
    await insert_ready_adapters(pool, versions)
    await set_alias(pool, alias, versions[0].adapter_id)
    cache = AliasCache(pool, ttl_s=3600.0)
    assert await cache.resolve(tenant, alias) == AliasTarget(versions[0].adapter_id)

    ready = asyncio.Event()
    letters = DeadLetters("alias-cache", pool, dead_letter_counter(CollectorRegistry()))
    gateway = login(broker, principals.GATEWAY)
    consumer = asyncio.create_task(consume_alias_changes(gateway, cache, ready, letters))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LORAFLEET_KAFKA_")},
        "LORAFLEET_KAFKA_BOOTSTRAP": broker.kafka_bootstrap,
        "LORAFLEET_DATABASE_URL": migrated_db,
        "LORAFLEET_RELAY_POLL_INTERVAL_S": "0.05",
        "LORAFLEET_RELAY_METRICS_PORT": "0",
    }
    log = tmp_path / "relay.log"
    with log.open("ab") as out:
        relay = subprocess.Popen(
            [sys.executable, "-m", "lorafleet.cli", "relay"], env=env, cwd=REPO, stdout=out, stderr=out
        )
    try:
        await asyncio.wait_for(ready.wait(), 60)
        await asyncio.sleep(1.0)  # the consumer follows from the end: let its first fetch position it
        await set_alias(pool, alias, versions[1].adapter_id)

        async def moved() -> bool:
            assert relay.poll() is None, log.read_text()[-3000:]
            return await cache.resolve(tenant, alias) == AliasTarget(versions[1].adapter_id)

        await wait_until(moved, "the relay's aliases.changed to reach the gateway's cache", timeout=90)

        async def all_sent() -> bool:  # the relay marks a row sent after Kafka acked it
            return await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0

        await wait_until(all_sent, "the relay to mark its rows sent", timeout=30)
    finally:
        stop(relay)
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
