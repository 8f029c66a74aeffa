"""Adapter downloads against a faulty object store (the real S3 behind a fault proxy), on both sides.

The replica's adapter cache and the registry validator fetch under one policy: a 503 storm longer than
botocore's own retries, and a stream that stalls once, succeed on a later try; a store that trickles or
stalls for good is given up at the total deadline; no half-written file is left; a transient failure
leaves the version pending (the validator retries it) and a missing object is final at once.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import asyncpg
import pytest

from gateway.config import GatewayConfig
from gateway.registry.registration_rules import RegistryRules
from gateway.registry.served_base import served_base_spec
from gateway.registry.validator.artifact_fetch import TransientFetchError
from gateway.registry.validator.handler import RegistryValidator
from gateway.registry.weights_uri import ObjectLocation
from lorafleet.client.upload import upload_peft_dir
from lorafleet.fetch_retry import FetchPolicy
from replica.adapter_cache.errors import AdapterCacheError, ObjectStoreUnavailableError
from schemas.api import ADAPTER_WEIGHTS_NAME
from schemas.events import AdapterRegistered
from tests.gateway.adapter_files import TARGETS, TINY_BASE_HASH, make_peft_adapter, write_base_config
from tests.gateway.registry.internal_app import gateway_config
from tests.integration.s3_adapters import (
    BUCKET,
    RUN,
    Records,
    cache_over,
    partial_files,
    proxied_store,
    upload,
)

pytestmark = pytest.mark.integration

DEADLINE_S = 4.0
POLICY = FetchPolicy(deadline_s=DEADLINE_S, attempts=4, initial_s=0.05, max_s=0.2)
# the retry cases: a deadline well past botocore's own backoff between its three tries
RETRYING = FetchPolicy(deadline_s=60.0, attempts=4, initial_s=0.05, max_s=0.2)


@pytest.fixture(scope="module")
def peft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_peft_adapter(tmp_path_factory.mktemp("peft") / "a", r=4, alpha=8.0)


async def test_the_replica_cache_retries_transient_faults_and_gives_up_at_the_deadline(
    services, peft_dir: Path, tmp_path: Path
) -> None:
    async with proxied_store(services.settings()) as store:
        records = Records()
        record = await upload(store.direct, peft_dir, "acme-faulty", records)
        weights = ADAPTER_WEIGHTS_NAME
        size = (peft_dir / weights).stat().st_size
        assert size > 20_000  # the trickle below takes longer than the deadline

        # 503 five times: more than botocore's three attempts, so only the policy's retry gets it through
        cache = cache_over(store, records, tmp_path / "c1", RETRYING)
        store.proxy.fail(5, match=weights)
        lease = await asyncio.wait_for(cache.acquire(record.adapter_id), 120)
        cache.release(lease)
        assert [s.status for s in store.proxy.gets(weights)] == [503] * 5 + [200]

        # a body that stalls once after 1 KiB: the read timeout ends that try, the next one succeeds
        cache = cache_over(store, records, tmp_path / "c2", RETRYING)
        store.proxy.stall(1024, times=1, match=weights)
        lease = await asyncio.wait_for(cache.acquire(record.adapter_id), 120)
        cache.release(lease)
        assert cache.tier_of(record.adapter_id) == "gpu"

        # bytes trickling in, and a stall that never ends: both given up at the total deadline
        for name, fault in (
            ("trickle", lambda: store.proxy.trickle(2000, match=weights)),
            ("stall", lambda: store.proxy.stall(1024, match=weights)),
        ):
            cache_dir = tmp_path / name
            cache = cache_over(store, records, cache_dir, POLICY)
            fault()
            start = time.monotonic()
            with pytest.raises(ObjectStoreUnavailableError, match="within") as failed:
                await asyncio.wait_for(cache.acquire(record.adapter_id), 60)
            took = time.monotonic() - start
            assert DEADLINE_S * 0.9 <= took < DEADLINE_S + 10, (name, took)
            assert failed.value.status == 503
            assert failed.value.headers() == {"Retry-After": str(math.ceil(cache.failure_ttl_s))}
            await cache.settle()
            assert cache.tier_of(record.adapter_id) == "remote"
            assert partial_files(cache_dir) == [] and cache.disk.names() == []
            store.proxy.heal()

        # a missing object is final: one GET, a plain load failure, never retried by the policy
        gone = records.records[record.adapter_id]
        records.records["acme-gone"] = type(gone)(
            "acme-gone", gone.weights_uri + "-missing", gone.digest, gone.base_model_hash, gone.target_modules
        )
        before = len(store.proxy.gets("-missing"))
        cache = cache_over(store, records, tmp_path / "c3", POLICY)
        with pytest.raises(AdapterCacheError) as missing:
            await asyncio.wait_for(cache.acquire("acme-gone"), 60)
        assert not isinstance(missing.value, ObjectStoreUnavailableError)
        assert len([s for s in store.proxy.gets("-missing") if weights in s.path]) - before <= 1


def _event(adapter_id: str, location: ObjectLocation, checksum: str) -> AdapterRegistered:
    return AdapterRegistered(
        adapter_id=adapter_id,
        tenant_id="acme",
        version=1,
        base_model_hash=TINY_BASE_HASH,
        rank=4,
        alpha=8.0,
        target_modules=TARGETS,
        weights_uri=location.uri(),
        checksum=checksum,
    )


async def _status(pool: asyncpg.Pool, adapter_id: str) -> str | None:
    return await pool.fetchval("SELECT status FROM adapters WHERE adapter_id = $1", adapter_id)


async def test_the_validator_keeps_a_version_pending_through_store_faults_and_readies_it_after(
    services, migrated_db: str, pool: asyncpg.Pool, peft_dir: Path, tmp_path: Path
) -> None:
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    config: GatewayConfig = gateway_config(platform, TINY_BASE_HASH, write_base_config(tmp_path / "base"))
    rules = RegistryRules.build(
        TINY_BASE_HASH, config.gateway.max_rank, config.platform.object_store_prefixes
    )
    async with proxied_store(platform) as store:
        validator = RegistryValidator(
            pool, store.s3, rules, served_base_spec(config.gateway), config.gateway, POLICY
        )
        for n, (name, fault) in enumerate(
            (
                ("storm", lambda: store.proxy.fail(1000)),  # every request, the listing included
                ("stall", lambda: store.proxy.stall(1024, match=ADAPTER_WEIGHTS_NAME)),
            )
        ):
            location = ObjectLocation(BUCKET, f"tests/{RUN}/validator-{name}")
            checksum = await upload_peft_dir(store.direct, peft_dir, location.bucket, location.key)
            event = _event(f"acme-{name}-{n}", location, checksum)
            fault()
            start = time.monotonic()
            with pytest.raises(TransientFetchError):
                await asyncio.wait_for(validator.handle(event), 60)
            assert time.monotonic() - start < DEADLINE_S + 10
            assert await _status(pool, event.adapter_id) in (None, "pending")  # not rejected: retried later
            store.proxy.heal()
            assert await asyncio.wait_for(validator.handle(event), 60) == "ready"
            assert await _status(pool, event.adapter_id) == "ready"

        # 503 five times on the weights: one handle() gets through, on the policy's retry
        location = ObjectLocation(BUCKET, f"tests/{RUN}/validator-flaky")
        checksum = await upload_peft_dir(store.direct, peft_dir, location.bucket, location.key)
        event = _event("acme-flaky", location, checksum)
        store.proxy.fail(5, match=f"validator-flaky/{ADAPTER_WEIGHTS_NAME}")
        validator = RegistryValidator(
            pool, store.s3, rules, served_base_spec(config.gateway), config.gateway, RETRYING
        )
        assert await asyncio.wait_for(validator.handle(event), 120) == "ready"
        assert [s.status for s in store.proxy.gets(f"validator-flaky/{ADAPTER_WEIGHTS_NAME}")] == [
            503
        ] * 5 + [200]
