"""A real stack for the replica lifecycle tests: a migrated database with tenants, keys, ready adapters and
aliases (gateway_stack's seed, plus a tenant with a small token limit); the placement worker and the
outbox relay (in this process, from the topics' ends: the shared Kafka holds every earlier run's events);
the public gateway as a process; SmolLM2 replica processes started one by one, all under one id prefix."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
from aiokafka.structs import TopicPartition

from gateway.tenants import create_key, create_tenant
from harness.databases import create_database, drop_database
from harness.ports import free_port
from harness.processes import stop, wait_http
from harness.seed import ReadyAdapter, insert_alias, insert_ready_adapters
from lorafleet.config import PlatformSettings, RelaySettings
from lorafleet.kafka import make_producer
from lorafleet.retry import run_with_retry
from placement_worker.config import PlacementConfig, PlacementSettings
from placement_worker.main import run_worker
from relay.publisher import Relay
from schemas.events import Event, parse_event
from schemas.topics import ALL_TOPICS
from tests.integration.gateway_stack import ADAPTERS, REPO, TOKEN, ReplicaProc, _seed, start_replica
from tests.integration.kafka_helpers import consumer_at, decodable

LEAN = ("lean", 50, 1_000)  # a tenant whose tokens/min admit two long requests, not a third
LEAN_ADAPTER, LEAN_ALIAS = "lean-app-v1", "lean/app:prod"
ADAPTER_IDS = (*ADAPTERS, LEAN_ADAPTER)  # every ready adapter: the replicas' folders must hold them all


@dataclass
class LifecycleStack:
    url: str
    pool: asyncpg.Pool
    keys: dict[str, str]
    env: dict[str, str]
    work: Path
    prefix: str
    replicas: dict[str, ReplicaProc] = field(default_factory=dict)

    def start(self, name: str) -> ReplicaProc:
        rid = f"{self.prefix}{name}"
        r = self.replicas[rid] = ReplicaProc(rid, free_port(), self.work / f"{rid}.log")
        start_replica(r, self.env)
        return r

    async def placements(self) -> dict[str, set[str]]:
        """adapter_id -> its owners."""
        out: dict[str, set[str]] = {}
        for row in await self.pool.fetch(
            "SELECT adapter_id, replica_id FROM placements WHERE role = 'owner'"
        ):
            out.setdefault(row["adapter_id"], set()).add(row["replica_id"])
        return out

    async def live(self) -> set[str]:
        """The replicas the gateway routes to now (GET /ready)."""
        async with httpx.AsyncClient() as c:
            return set((await c.get(f"{self.url}/ready")).json()["replicas"])


@contextlib.asynccontextmanager
async def lifecycle_stack(
    platform: PlatformSettings, adapter_root: Path, base_hash: str, work: Path
) -> AsyncIterator[LifecycleStack]:
    name = f"lc_{uuid.uuid4().hex[:10]}"
    database_url = await create_database(platform.database_url, name)
    keys = await _seed(database_url, {}, base_hash)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    tenant, requests_per_s, tokens_per_min = LEAN
    await create_tenant(pool, tenant, requests_per_s, tokens_per_min)
    keys[tenant] = (await create_key(pool, tenant)).secret
    await insert_ready_adapters(pool, [ReadyAdapter(LEAN_ADAPTER, tenant, base_hash)])
    await insert_alias(pool, LEAN_ALIAS, tenant, LEAN_ADAPTER)
    prefix = f"lc{uuid.uuid4().hex[:6]}-"
    port = free_port()
    env = {
        **os.environ,
        "LORAFLEET_KAFKA_BOOTSTRAP": platform.kafka_bootstrap,
        "LORAFLEET_DATABASE_URL": database_url,
        "LORAFLEET_REPLICA_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_REPLICA_ADAPTER_ROOT": str(adapter_root),
        "LORAFLEET_REPLICA_MAX_NUM_SEQS": "8",
        "LORAFLEET_REPLICA_BASE_MODEL_HASH": base_hash,
        "LORAFLEET_REPLICA_STATE_INTERVAL_S": "0.5",
        "LORAFLEET_REPLICA_WARMING_TIMEOUT_S": "60",
        "LORAFLEET_REPLICA_LIFECYCLE_POLL_S": "0.1",
        "LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_GATEWAY_REPLICA_STALE_S": "1.5",
        "LORAFLEET_GATEWAY_KEY_CACHE_TTL_S": "0.5",
        "LORAFLEET_GATEWAY_REPLICA_ID_PREFIX": prefix,
        "LORAFLEET_GATEWAY_PUBLIC_PORT": str(port),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    placement = PlacementSettings(
        group_id=f"placement-{prefix}",
        replica_id_prefix=prefix,
        membership_ttl_s=10.0,
        tick_s=0.2,
        metrics_port=0,
    )
    config = PlacementConfig(platform.model_copy(update={"database_url": database_url}), placement)
    stop_event, worker_ready = asyncio.Event(), asyncio.Event()
    producer = make_producer(platform)
    await producer.start()
    relay = asyncio.create_task(
        Relay(pool, producer, RelaySettings(poll_interval_s=0.05, metrics_port=0)).run(stop_event)
    )
    # as `lorafleet placement-worker` runs it: a failed statement restarts the worker instead of ending it
    worker = asyncio.create_task(
        run_with_retry(
            "placement-worker",
            lambda stop: run_worker(config, stop, ready=worker_ready, from_end=True),
            stop_event,
            config.platform,
        )
    )
    stack = LifecycleStack(f"http://127.0.0.1:{port}", pool, keys, env, work, prefix)
    with open(work / "gateway.log", "ab") as log:
        gw = subprocess.Popen(
            [sys.executable, "-m", "lorafleet.cli", "public-gateway"],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        await asyncio.wait_for(worker_ready.wait(), 60)
        await wait_http(f"{stack.url}/health", 60, gw)
        yield stack
    finally:
        stop(gw)
        for r in stack.replicas.values():  # SIGINT: stop at once (SIGTERM would drain each in turn)
            if r.proc is not None and r.proc.poll() is None:
                r.proc.send_signal(signal.SIGINT)
        for r in stack.replicas.values():
            stop(r.proc)
        stop_event.set()
        await asyncio.gather(relay, worker, return_exceptions=True)
        await producer.stop()
        await pool.close()
        await drop_database(platform.database_url, name)


class Tap:
    """Everything published on some topics from now on (no group: every partition, from its end)."""

    def __init__(self, bootstrap: str, *topic_names: str) -> None:
        self.consumer = consumer_at(bootstrap)
        self.topic_names = topic_names
        self.events: list[Event] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Tap:
        await self.consumer.start()
        parts = [
            TopicPartition(t.name, p)
            for t in ALL_TOPICS
            if t.name in self.topic_names
            for p in range(t.partitions)
        ]
        self.consumer.assign(parts)
        await self.consumer.seek_to_end(*parts)
        for p in parts:
            await self.consumer.position(p)
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        async for record in self.consumer:
            if decodable(record):  # another test's poison records are not this stack's events
                self.events.append(parse_event(record.value, record.topic))

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.stop()
