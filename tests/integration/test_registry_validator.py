"""The registry validator on the real PostgreSQL, S3 and Kafka: both doors reach ready; every bad artifact is
rejected with its own reason code and never becomes ready; duplicates and conflicts change nothing."""

from __future__ import annotations

import asyncio
import json
import pickle
import shutil
import time
import uuid
from pathlib import Path

import asyncpg
import pytest

from gateway.config import GatewayConfig
from gateway.registry.registration_rules import RegistryRules
from gateway.registry.served_base import served_base_spec
from gateway.registry.validator.handler import RegistryValidator
from gateway.registry.validator.main import run_validator
from gateway.registry.weights_uri import ObjectLocation
from lorafleet.client.upload import upload_peft_dir
from lorafleet.config import RelaySettings
from lorafleet.kafka import make_producer
from lorafleet.s3 import async_client
from relay.publisher import Relay
from schemas.events import AdapterRegistered
from tests.gateway.adapter_files import (
    TARGETS,
    TINY_BASE_HASH,
    make_peft_adapter,
    read_safetensors,
    with_nan,
    write_base_config,
    write_safetensors,
)
from tests.gateway.registry.internal_app import gateway_config, internal_client
from tests.integration.kafka_helpers import collect

pytestmark = pytest.mark.integration

BUCKET = "lorafleet-adapters"
RUN = uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def peft_dir(tmp_path_factory) -> Path:
    return make_peft_adapter(tmp_path_factory.mktemp("peft") / "good", r=4, alpha=8.0)


@pytest.fixture
async def env(services, migrated_db: str, pool: asyncpg.Pool, tmp_path: Path):
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme'), ('globex')")
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    config = gateway_config(
        platform,
        TINY_BASE_HASH,
        write_base_config(tmp_path / "base"),
        validator_group=f"test-validator-{uuid.uuid4().hex[:8]}",
    )
    return config


def _location(name: str) -> ObjectLocation:
    return ObjectLocation(BUCKET, f"tests/{RUN}/{name}-{uuid.uuid4().hex[:6]}")


def _event(adapter_id: str, location: ObjectLocation, checksum: str, **changes) -> AdapterRegistered:
    fields = {
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
    return AdapterRegistered(**{**fields, **changes})


async def _status(pool: asyncpg.Pool, adapter_id: str) -> tuple[str, str | None] | None:
    row = await pool.fetchrow("SELECT status, reason_code FROM adapters WHERE adapter_id = $1", adapter_id)
    return (row["status"], row["reason_code"]) if row else None


async def _wait_status(pool: asyncpg.Pool, adapter_id: str, timeout: float = 30.0) -> tuple[str, str | None]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await _status(pool, adapter_id)
        if got and got[0] != "pending":
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"{adapter_id} still {await _status(pool, adapter_id)} after {timeout}s")


async def _wait_for(pred, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def _validator(pool, s3, config: GatewayConfig) -> RegistryValidator:
    rules = RegistryRules.build(
        TINY_BASE_HASH, config.gateway.max_rank, config.platform.object_store_prefixes
    )
    return RegistryValidator(pool, s3, rules, served_base_spec(config.gateway), config.gateway)


async def test_both_doors_reach_ready_and_duplicates_change_nothing(env, pool, peft_dir) -> None:
    config: GatewayConfig = env
    stop, ready = asyncio.Event(), asyncio.Event()
    producer = make_producer(config.platform)
    await producer.start()
    relay = asyncio.create_task(Relay(pool, producer, RelaySettings(poll_interval_s=0.05)).run(stop))
    validator = asyncio.create_task(run_validator(config, stop, ready=ready, from_end=True))
    try:
        await asyncio.wait_for(ready.wait(), 30)
        http_id, kafka_id = f"acme-http-{RUN}", f"acme-kafka-{RUN}"
        async with async_client(config.platform) as s3:
            http_loc, kafka_loc = _location("http"), _location("kafka")
            checksum = await upload_peft_dir(s3, peft_dir, http_loc.bucket, http_loc.key)
            await upload_peft_dir(s3, peft_dir, kafka_loc.bucket, kafka_loc.key)
        async with internal_client(config) as client:
            body = _event(http_id, http_loc, checksum).model_dump(mode="json", include=set(_BODY_FIELDS))
            assert (await client.post("/internal/adapters", json=body)).status_code == 202
        event = _event(kafka_id, kafka_loc, checksum)
        await producer.send_and_wait("adapters.registered", event.to_bytes(), key=kafka_id.encode())
        assert await _wait_status(pool, http_id) == ("ready", None)
        assert await _wait_status(pool, kafka_id) == ("ready", None)
        assert await pool.fetchval("SELECT size_bytes FROM adapters WHERE adapter_id = $1", kafka_id) > 0

        # A redelivered event and a conflicting re-registration: the ready versions stay as they are.
        await producer.send_and_wait("adapters.registered", event.to_bytes(), key=kafka_id.encode())
        conflict = _event(kafka_id, kafka_loc, "sha256:" + "0" * 64)
        await producer.send_and_wait("adapters.registered", conflict.to_bytes(), key=kafka_id.encode())
        sent = "SELECT id FROM outbox WHERE aggregate_type = 'adapters.validated' AND sent_at IS NOT NULL"

        async def three_sent() -> bool:
            return len(await pool.fetch(sent)) == 3

        await _wait_for(three_sent)
        # Filter by this database's event ids: other stacks may consume the same shared topics.
        ours = {str(r["id"]).encode() for r in await pool.fetch(sent)}
        records = await collect(
            config.platform.kafka_bootstrap,
            "adapters.validated",
            lambda recs: len(recs) >= 3,
            timeout=30,
            accept=lambda r: dict(r.headers).get("id") in ours,
        )
        got = sorted((json.loads(r.value)["adapter_id"], json.loads(r.value)["status"]) for r in records)
        got_codes = sorted(str(json.loads(r.value)["reason_code"]) for r in records)
        assert got == sorted([(http_id, "ready"), (kafka_id, "ready"), (kafka_id, "rejected")])
        assert got_codes == ["None", "None", "adapter_conflict"]
        assert await _status(pool, kafka_id) == ("ready", None)
        validated = await pool.fetchval(
            "SELECT count(*) FROM outbox WHERE aggregate_type = 'adapters.validated'"
        )
        assert validated == 3
    finally:
        stop.set()
        await asyncio.gather(relay, validator)
        await producer.stop()


_BODY_FIELDS = (
    "adapter_id",
    "tenant_id",
    "version",
    "base_model_hash",
    "rank",
    "alpha",
    "target_modules",
    "weights_uri",
    "checksum",
)


def _rename_first_key(src: Path, dst: Path) -> None:
    header, data = read_safetensors(src)
    key = next(k for k in header if k.endswith("q_proj.lora_A.weight"))
    header[key.replace("q_proj", "lm_head")] = header.pop(key)
    write_safetensors(dst, header, data)


def _truncate(src: Path, dst: Path) -> None:
    dst.write_bytes(src.read_bytes()[:-100])


def _corrupt_header(src: Path, dst: Path) -> None:
    raw = bytearray(src.read_bytes())
    raw[8:20] = b"{not json!!!"
    dst.write_bytes(bytes(raw))


def _pickled(_src: Path, dst: Path) -> None:
    dst.write_bytes(pickle.dumps({"lora_A": [1.0, 2.0]}, protocol=4))


# case -> (how to change the weights file, registration changes, extra object, expected reason code)
BAD_ARTIFACTS = {
    "checksum_mismatch": (None, {"checksum": "sha256:" + "0" * 64}, None, "checksum_mismatch"),
    "truncated": (_truncate, {}, None, "invalid_safetensors"),
    "corrupt_header": (_corrupt_header, {}, None, "invalid_safetensors"),
    "pickle_as_weights": (_pickled, {}, None, "unsupported_format"),
    "pickle_beside": (None, {}, "adapter_model.bin", "unsupported_format"),
    "nan_weights": (with_nan, {}, None, "non_finite_weights"),
    "unknown_module_tensor": (_rename_first_key, {}, None, "unknown_target_module"),
    "rank_mismatch": (None, {"rank": 8}, None, "rank_mismatch"),
    "modules_mismatch": (None, {"target_modules": ["q_proj"]}, None, "target_modules_mismatch"),
    "file_uri": (None, {"weights_uri": "file:///etc/passwd"}, None, "invalid_weights_uri"),
    "ip_literal": (None, {"weights_uri": "s3://127.0.0.1/adapters/x"}, None, "invalid_weights_uri"),
    "base_mismatch": (None, {"base_model_hash": "sha256:" + "e" * 64}, None, "base_model_mismatch"),
    "rank_over_cap": (None, {"rank": 65}, None, "adapter_rank_exceeds_limit"),
    "unknown_module_field": (None, {"target_modules": ["lm_head"]}, None, "unknown_target_module"),
    "missing_files": ("missing", {}, None, "artifact_missing"),
    "unknown_tenant": (None, {"tenant_id": "initech"}, None, "unknown_tenant"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARTIFACTS))
async def test_bad_artifacts_are_rejected_with_their_code(env, pool, peft_dir, tmp_path, case) -> None:
    config: GatewayConfig = env
    change, reg_changes, extra, code = BAD_ARTIFACTS[case]
    variant = tmp_path / "variant"
    shutil.copytree(peft_dir, variant)
    if callable(change):
        change(peft_dir / "adapter_model.safetensors", variant / "adapter_model.safetensors")
    location = _location(case)
    adapter_id = f"acme-{case.replace('_', '-')}"
    async with async_client(config.platform) as s3:
        checksum = (
            await upload_peft_dir(s3, variant, location.bucket, location.key)
            if change != "missing"
            else "sha256:" + "1" * 64
        )
        if extra:
            await s3.put_object(Bucket=BUCKET, Key=f"{location.key}/{extra}", Body=pickle.dumps([1]))
        event = _event(adapter_id, location, checksum).model_copy(update=reg_changes)
        outcome = await _validator(pool, s3, config).handle(event)
        assert outcome == f"rejected:{code}"
        # Replaying the same event is a no-op.
        assert await _validator(pool, s3, config).handle(event) == "duplicate"
    if case == "unknown_tenant":
        assert await _status(pool, adapter_id) is None
    else:
        assert await _status(pool, adapter_id) == ("rejected", code)
    rows = await pool.fetch("SELECT payload FROM outbox WHERE aggregate_type = 'adapters.validated'")
    payloads = [json.loads(r["payload"]) for r in rows]
    assert [(p["status"], p["reason_code"]) for p in payloads] == [("rejected", code)]
    assert await pool.fetchval("SELECT count(*) FROM adapters WHERE status = 'ready'") == 0
