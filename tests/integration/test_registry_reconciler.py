"""No registration stays pending for good, and no failing object holds the validator's partition.

The real internal gateway (the HTTP door), relay and registry validator (with its reconciler) run against the
real PostgreSQL, Kafka and S3; the validator reads the store through a fault proxy.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import httpx
import pytest
from aiokafka.partitioner import DefaultPartitioner

from gateway.config import GatewayConfig
from gateway.registry.validator.main import run_validator
from gateway.registry.weights_uri import ObjectLocation
from lorafleet.client.upload import upload_peft_dir
from lorafleet.config import RelaySettings
from lorafleet.kafka import make_producer
from relay.publisher import Relay
from schemas.api import ADAPTER_WEIGHTS_NAME
from schemas.topics import ADAPTERS_REGISTERED
from tests.gateway.adapter_files import TARGETS, TINY_BASE_HASH, make_peft_adapter, write_base_config
from tests.gateway.registry.internal_app import gateway_config, internal_client
from tests.integration.s3_adapters import BUCKET, ProxiedStore, proxied_store

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def peft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_peft_adapter(tmp_path_factory.mktemp("peft") / "good", r=4, alpha=8.0)


def _config(platform, tmp_path: Path, **overrides) -> GatewayConfig:
    return gateway_config(
        platform,
        TINY_BASE_HASH,
        write_base_config(tmp_path / "base"),
        validator_group=f"test-validator-{uuid.uuid4().hex[:8]}",
        registry_recheck_initial_s=0.5,
        registry_recheck_max_s=1.0,
        registry_reconcile_interval_s=0.2,
        **overrides,
    )


def _same_partition_ids(prefix: str, n: int) -> list[str]:
    """n adapter ids whose records share one partition of adapters.registered (keyed by adapter id)."""
    parts = list(range(ADAPTERS_REGISTERED.partitions))
    partition = DefaultPartitioner()
    by_partition: dict[int, list[str]] = {}
    for i in range(10_000):
        adapter_id = f"{prefix}-{RUN}-{i}"
        found = by_partition.setdefault(partition(adapter_id.encode(), parts, parts), [])
        found.append(adapter_id)
        if len(found) == n:
            return found
    raise AssertionError("no partition got n ids")


async def _register(client: httpx.AsyncClient, s3, peft_dir: Path, adapter_id: str) -> None:
    location = ObjectLocation(BUCKET, f"tests/{RUN}/{adapter_id}")
    checksum = await upload_peft_dir(s3, peft_dir, location.bucket, location.key)
    body = {
        "adapter_id": adapter_id,
        "tenant_id": "acme",
        "version": 1,
        "base_model_hash": TINY_BASE_HASH,
        "rank": 4,
        "alpha": 8.0,
        "target_modules": TARGETS,
        "weights_uri": location.uri(),
        "checksum": checksum,
    }
    response = await client.post("/internal/adapters", json=body)
    assert response.status_code == 202, response.text


async def _wait_for(pred, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def _status(pool: asyncpg.Pool, adapter_id: str) -> str | None:
    return await pool.fetchval("SELECT status FROM adapters WHERE adapter_id = $1", adapter_id)


@asynccontextmanager
async def _running(pool: asyncpg.Pool, config: GatewayConfig) -> AsyncIterator[None]:
    """The relay and the registry validator (consumer and reconciler), until the block ends."""
    stop, ready = asyncio.Event(), asyncio.Event()
    producer = make_producer(config.platform)
    await producer.start()
    relay = asyncio.create_task(Relay(pool, producer, RelaySettings(poll_interval_s=0.05)).run(stop))
    validator = asyncio.create_task(run_validator(config, stop, ready=ready, from_end=True))
    try:
        await asyncio.wait_for(ready.wait(), 30)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(relay, validator), 30)
        await producer.stop()


async def test_a_failing_object_is_checked_again_with_visible_status_and_holds_no_partition(
    services, migrated_db: str, pool: asyncpg.Pool, peft_dir: Path, tmp_path: Path
) -> None:
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    failing, healthy = _same_partition_ids("acme-obj", 2)
    async with proxied_store(platform) as store:
        proxied: ProxiedStore = store
        through = proxied.settings.model_copy(
            update={"s3_fetch_deadline_s": 2.0, "s3_fetch_attempts": 2, "s3_retry_max_s": 0.2}
        )
        config = _config(through, tmp_path)
        proxied.proxy.fail(100_000, match=f"{failing}/{ADAPTER_WEIGHTS_NAME}")
        async with _running(pool, config), internal_client(config) as client:
            await _register(client, proxied.direct, peft_dir, failing)
            await _register(client, proxied.direct, peft_dir, healthy)
            # the healthy one, behind the failing one on the same partition, settles while the store fails
            await _wait_for(lambda: _pending_not(pool, healthy), 30)
            assert await _status(pool, healthy) == "ready"

            async def failed_twice() -> bool:
                view = (await client.get(f"/internal/adapters/{failing}")).json()
                return view["check_attempts"] >= 2

            await _wait_for(failed_twice, 30)
            view = (await client.get(f"/internal/adapters/{failing}")).json()
            assert view["status"] == "pending", view
            assert failing in view["last_check_error"], view  # the fetch that failed, and why
            assert view["next_check_at"] is not None, view

            proxied.proxy.heal()
            await _wait_for(lambda: _pending_not(pool, failing), 30)
            assert await _status(pool, failing) == "ready"
    # the version was checked again through new events, and settled once
    rows = await pool.fetch("SELECT aggregate_type FROM outbox WHERE aggregate_id = $1", failing)
    topics = [r["aggregate_type"] for r in rows]
    assert topics.count("adapters.validated") == 1, topics
    assert topics.count("adapters.registered") >= 2, topics


async def _pending_not(pool: asyncpg.Pool, adapter_id: str) -> bool:
    return await _status(pool, adapter_id) not in (None, "pending")


async def test_a_registration_whose_event_is_lost_is_checked_after_the_bound(
    services, migrated_db: str, pool: asyncpg.Pool, peft_dir: Path, tmp_path: Path
) -> None:
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    config = _config(platform, tmp_path, registry_reconcile_after_s=2.0)
    lost = f"acme-lost-{RUN}"
    async with proxied_store(platform) as store, internal_client(config) as client:
        await _register(client, store.direct, peft_dir, lost)
    # the event never reaches Kafka: its outbox row is gone before any relay ran
    assert await pool.execute("DELETE FROM outbox WHERE aggregate_id = $1", lost) == "DELETE 1"
    async with _running(pool, config):
        await _wait_for(lambda: _pending_not(pool, lost), 30)
    assert await _status(pool, lost) == "ready"
    # asked for again once the bound passed, not before (the database's clock, on both ends)
    waited = await pool.fetchval(
        "SELECT extract(epoch FROM updated_at - created_at)::float8 FROM adapters WHERE adapter_id = $1", lost
    )
    assert 2.0 <= waited < 2.0 + 20.0, waited
