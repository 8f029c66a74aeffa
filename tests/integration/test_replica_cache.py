"""The replica's adapter cache on the real services: a registered adapter is pulled through the tiers on a
`load` command and replica.state shows it; bytes changed in the object store never reach any tier; a real
replica process heartbeats on replica.state and serves an adapter it pulled after a load command."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import httpx
import pytest
import uvicorn
from torch import nn

from gateway.registry.app import build_internal_app
from gateway.registry.validator.main import run_validator
from gateway.registry.weights_uri import ObjectLocation
from harness.ports import free_port
from harness.processes import stop, wait_http
from lorafleet.client.upload import upload_peft_dir
from lorafleet.config import RelaySettings
from lorafleet.kafka import make_producer
from lorafleet.s3 import async_client
from relay.publisher import Relay
from replica.adapter_cache.cache import AdapterCache
from replica.adapter_cache.disk import DiskTier
from replica.adapter_cache.errors import ChecksumMismatchError
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.host import HostTier
from replica.adapter_cache.object_store import ObjectStore
from replica.adapter_cache.registry_client import RegistryClient
from replica.control.events import EventPublisher
from replica.control.service import run_control
from replica.control.state_publisher import Load, build_state
from replica.lora.replace import lora_layers
from replica.lora.spec import AdapterSpec
from schemas.events import ReplicaCommand, parse_event
from schemas.llama import linear_shapes
from tests.gateway.adapter_files import (
    TARGETS,
    TINY_BASE_HASH,
    TINY_CONFIG,
    make_peft_adapter,
    write_base_config,
)
from tests.gateway.registry.internal_app import TOKEN, gateway_config, internal_client
from tests.integration.kafka_helpers import collect

pytestmark = pytest.mark.integration

BUCKET = "lorafleet-adapters"
RUN = uuid.uuid4().hex[:8]


def _spec() -> AdapterSpec:
    h, inter = TINY_CONFIG["hidden_size"], TINY_CONFIG["intermediate_size"]
    q, kv = TINY_CONFIG["num_attention_heads"] * 16, TINY_CONFIG["num_key_value_heads"] * 16
    return AdapterSpec(TINY_CONFIG["num_hidden_layers"], linear_shapes(h, inter, q, kv), 16, TINY_BASE_HASH)


def _cache(tmp: Path, spec: AdapterSpec, registry, s3, on_event) -> AdapterCache:  # noqa: ANN001
    layers = lora_layers(
        {
            (layer, name): nn.Linear(i, o, bias=False)
            for layer in range(spec.num_layers)
            for name, (i, o) in spec.shapes.items()
        },
        {8: 2},
    )
    return AdapterCache(
        spec,
        registry,
        ObjectStore(s3),
        DiskTier(tmp / "disk", 1 << 30),
        HostTier(1 << 30),
        GpuTier(layers, {8: 2}),
        on_event=on_event,
    )


@pytest.fixture
async def ready_adapter(services, migrated_db: str, pool: asyncpg.Pool, tmp_path: Path):
    """One adapter registered through the HTTP door and validated to ready; yields (config, id, location)."""
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme')")
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    config = gateway_config(
        platform,
        TINY_BASE_HASH,
        write_base_config(tmp_path / "base"),
        validator_group=f"t-{uuid.uuid4().hex[:8]}",
    )
    peft_dir = make_peft_adapter(tmp_path / "peft", r=4, alpha=8.0)
    stop, ready = asyncio.Event(), asyncio.Event()
    producer = make_producer(platform)
    await producer.start()
    relay = asyncio.create_task(Relay(pool, producer, RelaySettings(poll_interval_s=0.05)).run(stop))
    validator = asyncio.create_task(run_validator(config, stop, ready=ready, from_end=True))
    adapter_id = f"acme-cache-{RUN}-{uuid.uuid4().hex[:4]}"
    location = ObjectLocation(BUCKET, f"tests/{RUN}/{adapter_id}")
    try:
        await asyncio.wait_for(ready.wait(), 30)
        async with async_client(platform) as s3:
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
        async with internal_client(config) as client:
            assert (await client.post("/internal/adapters", json=body)).status_code == 202
            deadline = time.monotonic() + 30
            while (await client.get(f"/internal/adapters/{adapter_id}")).json()["status"] != "ready":
                assert time.monotonic() < deadline, "the adapter never became ready"
                await asyncio.sleep(0.1)
        yield config, adapter_id, location
    finally:
        stop.set()
        await asyncio.gather(relay, validator, return_exceptions=True)
        await producer.stop()


async def test_a_load_command_pulls_a_registered_adapter_through_the_tiers_and_state_shows_it(
    ready_adapter, tmp_path: Path
) -> None:
    config, adapter_id, _ = ready_adapter
    platform = config.platform
    replica_id = f"rc-{uuid.uuid4().hex[:10]}"
    events = EventPublisher(replica_id)
    stop = asyncio.Event()
    async with internal_client(config) as client, async_client(platform) as s3:
        cache = _cache(tmp_path, _spec(), RegistryClient(client), s3, events)

        def make_state():  # noqa: ANN202
            return build_state(replica_id, "http://127.0.0.1:1", "ready", cache, 2, Load(0, 0))

        control = asyncio.create_task(run_control(platform, replica_id, cache, events, make_state, stop, 0.2))
        try:
            producer = make_producer(platform)
            await producer.start()
            try:
                for _ in range(2):  # at-least-once: a duplicate must change nothing
                    cmd = ReplicaCommand(
                        replica_id=replica_id, command="load", adapter_id=adapter_id, target_tier="gpu"
                    )
                    await producer.send_and_wait(cmd.topic.name, cmd.to_bytes(), key=replica_id.encode())
            finally:
                await producer.stop()

            def mine(r) -> bool:  # noqa: ANN001
                return r.key == replica_id.encode()

            def shows_it(records: list) -> bool:
                for r in records:
                    s = parse_event(r.value, "replica.state")
                    if (
                        adapter_id in s.gpu_adapters
                        and adapter_id in s.ram_adapters
                        and adapter_id in s.disk_adapters
                    ):
                        return True
                return False

            states = await collect(
                platform.kafka_bootstrap, "replica.state", shows_it, timeout=60, accept=mine
            )
            assert shows_it(states)
            loads = await collect(
                platform.kafka_bootstrap, "replica.events", lambda rs: len(rs) >= 3, timeout=30, accept=mine
            )
            got = [parse_event(r.value, "replica.events") for r in loads]
            assert [(e.from_tier, e.to_tier) for e in got] == [
                ("remote", "ram"),  # hashed as it streamed in, validated into RAM
                ("ram", "gpu"),
                ("ram", "disk"),  # the owner's disk copy, written from the same bytes behind the slot
            ]
            assert all(e.kind == "load" and e.bytes > 0 for e in got)
            lease = await cache.acquire(adapter_id)
            assert lease.found_in == "gpu"
            cache.release(lease)
        finally:
            stop.set()
            await asyncio.wait_for(control, 30)


async def test_bytes_changed_in_the_object_store_after_registration_never_reach_any_tier(
    ready_adapter, tmp_path: Path
) -> None:
    config, adapter_id, location = ready_adapter
    async with internal_client(config) as client, async_client(config.platform) as s3:
        key = f"{location.key}/adapter_model.safetensors"
        raw = bytearray(await (await s3.get_object(Bucket=BUCKET, Key=key))["Body"].read())
        raw[-5] ^= 0x01
        await s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(raw))
        cache = _cache(tmp_path, _spec(), RegistryClient(client), s3, lambda _e: None)
        with pytest.raises(ChecksumMismatchError):
            await cache.own(adapter_id, "gpu")
        assert cache.disk.names() == [] and cache.host.adapter_ids() == [] and cache.gpu.adapter_ids() == []
        assert list((tmp_path / "disk" / ".partial").iterdir()) == []


def _tiny_base(path: Path) -> Path:
    """A random base with the registry's tiny config (its base hash is given to the replica)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(**TINY_CONFIG)).save_pretrained(path, safe_serialization=True)
    return path


async def test_a_replica_process_heartbeats_and_serves_an_adapter_it_pulled_on_a_load_command(
    services, ready_adapter, tmp_path: Path
) -> None:
    config, adapter_id, _ = ready_adapter
    platform = config.platform
    replica_id, port, gw_port = f"rp-{uuid.uuid4().hex[:10]}", free_port(), free_port()
    gateway = uvicorn.Server(
        uvicorn.Config(build_internal_app(config), host="127.0.0.1", port=gw_port, log_level="warning")
    )
    serving = asyncio.create_task(gateway.serve())
    env = {
        **os.environ,
        **services.env(),
        "LORAFLEET_REPLICA_REGISTRY_URL": f"http://127.0.0.1:{gw_port}",
        "LORAFLEET_REPLICA_REGISTRY_TOKEN": TOKEN,
        "LORAFLEET_REPLICA_SERVICE_TOKEN": "rp-token",
        "LORAFLEET_REPLICA_BASE_MODEL_HASH": TINY_BASE_HASH,
        "LORAFLEET_REPLICA_CACHE_DIR": str(tmp_path / "cache"),
        "LORAFLEET_REPLICA_LORA_SLOTS": json.dumps({"8": 2}),
        "LORAFLEET_REPLICA_MAX_NUM_SEQS": "2",
        "LORAFLEET_REPLICA_MAX_MODEL_LEN": "64",
        "LORAFLEET_REPLICA_STATE_INTERVAL_S": "0.3",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [sys.executable, "-m", "lorafleet.cli", "replica", "serve", "--replica-id", replica_id]
    cmd += ["--port", str(port), "--model-dir", str(await asyncio.to_thread(_tiny_base, tmp_path / "base"))]
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "replica.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        await wait_http(f"{url}/health", 120, proc)

        def mine(r) -> bool:  # noqa: ANN001
            return r.key == replica_id.encode()

        def states(records: list) -> list:
            return [parse_event(r.value, "replica.state") for r in records]

        beats = await collect(platform.kafka_bootstrap, "replica.state", lambda rs: len(rs) >= 2, 30, mine)
        # no placement worker: the replica warms until its timeout, then reports ready
        assert len(beats) >= 2 and all(
            s.url == url and s.status in ("warming", "ready") for s in states(beats)
        )

        producer = make_producer(platform)
        await producer.start()
        try:
            cmd_ = ReplicaCommand(replica_id=replica_id, command="load", adapter_id=adapter_id)  # to RAM
            await producer.send_and_wait(cmd_.topic.name, cmd_.to_bytes(), key=replica_id.encode())
        finally:
            await producer.stop()

        def holds_it(records: list) -> bool:
            return any(
                adapter_id in s.ram_adapters and adapter_id in s.disk_adapters for s in states(records)
            )

        assert holds_it(await collect(platform.kafka_bootstrap, "replica.state", holds_it, 60, mine))

        body = {"prompt_token_ids": [1, 2, 3], "adapter_id": adapter_id, "max_tokens": 4, "ignore_eos": True}
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer rp-token"}) as client:
            resp = await client.post(f"/internal/replicas/{replica_id}/generate", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-adapter-id"] == adapter_id and resp.headers["x-adapter-tier"] == "ram"
        lines = [json.loads(line) for line in resp.text.splitlines() if line]
        assert [e["type"] for e in lines] == ["token"] * 4 + ["done"]

        loads = await collect(platform.kafka_bootstrap, "replica.events", lambda rs: len(rs) >= 3, 30, mine)
        got = [parse_event(r.value, "replica.events") for r in loads]
        assert [(e.from_tier, e.to_tier) for e in got] == [
            ("remote", "ram"),
            ("ram", "disk"),  # the load command returns once the owner holds it on disk too
            ("ram", "gpu"),  # the request
        ]
    finally:
        stop(proc)
        gateway.should_exit = True
        await asyncio.wait_for(serving, 30)
