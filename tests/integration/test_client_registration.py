"""The client's upload-register-wait flow against the real internal API, relay, registry validator, S3 and
PostgreSQL: versions become ready, a rerun registers nothing, and every failure names its version."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from gateway.config import GatewayConfig
from gateway.registry.validator.main import run_validator
from lorafleet.client.errors import RegistrationError
from lorafleet.client.registration import AdapterUpload, register_adapters
from lorafleet.config import RelaySettings
from lorafleet.kafka import make_producer
from relay.publisher import Relay
from schemas.api import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
from tests.gateway.adapter_files import TINY_BASE_HASH, make_peft_adapter, with_nan, write_base_config
from tests.gateway.registry.internal_app import gateway_config, internal_client

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def peft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_peft_adapter(tmp_path_factory.mktemp("peft") / "good", r=4, alpha=8.0)


@pytest.fixture
async def config(services, migrated_db: str, pool: asyncpg.Pool, tmp_path: Path) -> GatewayConfig:
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme'), ('globex')")
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    return gateway_config(
        platform,
        TINY_BASE_HASH,
        write_base_config(tmp_path / "base"),
        validator_group=f"test-client-{uuid.uuid4().hex[:8]}",
    )


@pytest.fixture
async def api(config: GatewayConfig, pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    """The internal API in process, with the outbox relay and the registry validator running beside it."""
    stop, ready = asyncio.Event(), asyncio.Event()
    producer = make_producer(config.platform)
    await producer.start()
    tasks = [
        asyncio.create_task(Relay(pool, producer, RelaySettings(poll_interval_s=0.05)).run(stop)),
        asyncio.create_task(run_validator(config, stop, ready=ready, from_end=True)),
    ]
    try:
        await asyncio.wait_for(ready.wait(), 30)
        async with internal_client(config) as client:
            yield client
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await producer.stop()


def _id(name: str) -> str:
    return f"{name}-{RUN}-{uuid.uuid4().hex[:6]}"


async def test_versions_become_ready_and_a_rerun_registers_nothing(
    config: GatewayConfig, api: httpx.AsyncClient, pool: asyncpg.Pool, peft_dir: Path
) -> None:
    uploads = [
        AdapterUpload(_id("acme-a"), "acme", 1, peft_dir),
        AdapterUpload(_id("globex-b"), "globex", 2, peft_dir),
    ]
    views = await register_adapters(api, config.platform, TINY_BASE_HASH, uploads, time.monotonic() + 60)
    assert [(v.adapter_id, v.tenant_id, v.version, v.status) for v in views] == [
        (u.adapter_id, u.tenant_id, u.version, "ready") for u in uploads
    ]
    assert {(v.rank, v.alpha) for v in views} == {(4, 8.0)}
    assert views[0].weights_uri == f"s3://{config.platform.s3_bucket}/adapters/acme/{uploads[0].adapter_id}"

    sent: list[str] = []

    async def record(request: httpx.Request) -> None:
        sent.append(f"{request.method} {request.url.path}")

    api.event_hooks["request"].append(record)
    outbox = await pool.fetchval("SELECT count(*) FROM outbox")
    again = await register_adapters(api, config.platform, TINY_BASE_HASH, uploads, time.monotonic() + 5)
    assert [v.updated_at for v in again] == [v.updated_at for v in views]
    assert await pool.fetchval("SELECT count(*) FROM outbox") == outbox
    assert sent and all(line.startswith("GET ") for line in sent), sent


async def test_a_rejected_version_raises_with_the_registry_reason(
    config: GatewayConfig, api: httpx.AsyncClient, peft_dir: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "nan"
    bad.mkdir()
    shutil.copy(peft_dir / ADAPTER_CONFIG_NAME, bad / ADAPTER_CONFIG_NAME)
    with_nan(peft_dir / ADAPTER_WEIGHTS_NAME, bad / ADAPTER_WEIGHTS_NAME)
    upload = AdapterUpload(_id("acme-nan"), "acme", 1, bad)
    with pytest.raises(RegistrationError) as err:
        await register_adapters(api, config.platform, TINY_BASE_HASH, [upload], time.monotonic() + 60)
    assert (err.value.adapter_id, err.value.reason_code) == (upload.adapter_id, "non_finite_weights")


async def test_a_version_registered_to_another_tenant_is_refused_before_any_upload(
    config: GatewayConfig, api: httpx.AsyncClient, peft_dir: Path
) -> None:
    adapter_id = _id("shared")
    await register_adapters(
        api,
        config.platform,
        TINY_BASE_HASH,
        [AdapterUpload(adapter_id, "acme", 1, peft_dir)],
        time.monotonic() + 60,
    )
    with pytest.raises(RegistrationError, match="registered to acme, not globex"):
        await register_adapters(
            api,
            config.platform,
            TINY_BASE_HASH,
            [AdapterUpload(adapter_id, "globex", 1, peft_dir)],
            time.monotonic() + 60,
        )


async def test_a_version_still_pending_at_the_deadline_raises(config: GatewayConfig, peft_dir: Path) -> None:
    upload = AdapterUpload(_id("acme-late"), "acme", 1, peft_dir)
    async with internal_client(config) as api:  # no relay or validator: the version stays pending
        with pytest.raises(RegistrationError, match="still pending"):
            await register_adapters(api, config.platform, TINY_BASE_HASH, [upload], time.monotonic() + 1)
        assert (await api.get(f"/internal/adapters/{upload.adapter_id}")).json()["status"] == "pending"
