"""A real stack for the replica lifecycle tests: a migrated database with tenants, keys, ready adapters and
aliases (gateway_stack's seed, plus a tenant with a small token limit); the placement worker and the
outbox relay (in this process, from the topics' ends: the shared Kafka holds every earlier run's events);
the public gateway as a process; SmolLM2 replica processes started one by one, all under one id prefix."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
from aiokafka.structs import TopicPartition

from harness.ports import free_port
from harness.running import Running
from harness.seed import Alias, ReadyAdapter, Seed, Tenant
from harness.spec import ProcessSpec, StackSpec, replica_args
from harness.stack import RunningStack, private_stack
from harness.stacks.gateway import ADAPTERS, GATEWAY, TOKEN, gateway_seed, public_gateway, replica_env
from harness.workers import outbox_relay, placement_worker
from lorafleet.config import PlatformSettings
from placement_worker.config import PlacementSettings
from schemas.events import Event, parse_event
from schemas.topics import ALL_TOPICS
from tests.integration.kafka_helpers import consumer_at, decodable

LEAN = Tenant("lean", 50, 1_000)  # a tenant whose tokens/min admit two long requests, not a third
LEAN_ADAPTER, LEAN_ALIAS = "lean-app-v1", "lean/app:prod"
ADAPTER_IDS = (*ADAPTERS, LEAN_ADAPTER)  # every ready adapter: the replicas' folders must hold them all


@dataclass
class LifecycleStack:
    stack: RunningStack

    @property
    def url(self) -> str:
        return self.stack.procs[GATEWAY].url

    @property
    def pool(self) -> asyncpg.Pool:
        assert self.stack.pool is not None
        return self.stack.pool

    @property
    def keys(self) -> dict[str, str]:
        return self.stack.keys

    @property
    def env(self) -> dict[str, str]:
        return self.stack.env

    @property
    def replicas(self) -> dict[str, Running]:
        return {name: p for name, p in self.stack.procs.items() if name != GATEWAY}

    def start(self, name: str) -> Running:
        """Replica <prefix><name> started (SIGINT stops it at once; SIGTERM would drain it)."""
        rid, port = f"{self.stack.spec.prefix}{name}", free_port()
        return self.stack.add(
            ProcessSpec(rid, replica_args(rid, port), port, stop_signal=signal.SIGINT)
        ).start()

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


def lifecycle_spec(adapter_root: Path, base_hash: str) -> StackSpec:
    """gateway_stack's seed and a lean tenant, the relay and the placement worker, the public gateway."""
    prefix = f"lc{uuid.uuid4().hex[:6]}-"
    lean = Seed(
        (LEAN,),
        (ReadyAdapter(LEAN_ADAPTER, LEAN.tenant_id, base_hash),),
        (Alias(LEAN_ALIAS, LEAN.tenant_id, LEAN_ADAPTER),),
    )
    placement = PlacementSettings(
        group_id=f"placement-{prefix}",
        replica_id_prefix=prefix,
        membership_ttl_s=10.0,
        tick_s=0.2,
        metrics_port=0,
    )
    return StackSpec(
        processes=(public_gateway(ready=(("/health", 60),)),),
        database=f"lc_{uuid.uuid4().hex[:10]}",
        seed=gateway_seed(base_hash) + lean,
        prefix=prefix,
        replica_token=TOKEN,
        fast_state=True,
        env={
            **replica_env(adapter_root, base_hash),
            "LORAFLEET_REPLICA_WARMING_TIMEOUT_S": "60",
            "LORAFLEET_REPLICA_LIFECYCLE_POLL_S": "0.1",
            "LORAFLEET_GATEWAY_KEY_CACHE_TTL_S": "0.5",
        },
        pool_size=4,
        workers=(outbox_relay, lambda platform, _pool: placement_worker(platform, placement)),
    )


@contextlib.asynccontextmanager
async def lifecycle_stack(
    platform: PlatformSettings, adapter_root: Path, base_hash: str, work: Path
) -> AsyncIterator[LifecycleStack]:
    async with private_stack(lifecycle_spec(adapter_root, base_hash), platform, work) as stack:
        yield LifecycleStack(stack)


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
