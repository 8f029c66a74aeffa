"""The fault soak's stack: harness.stacks.outage's private PostgreSQL and Kafka with the app processes under
`lorafleet services supervise` (relay, internal and public gateways, registry validator, placement worker),
two SmolLM2 replica processes serving the canaries from their folders, a private redis-server for the rate
limiter, and the canary tenants of the churn test (each owns two canary versions, its alias on the first).
Every process is one this stack started, and each is stopped by its pid on the way out."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import asyncpg

from canary.churn_verdict import AliasVersions
from canary.manifest import CanaryManifest
from harness.ports import free_port
from harness.redis_server import redis_server
from harness.running import Running
from harness.seed import write_seed
from harness.spec import HttpReady, ProcessSpec, replica_args
from harness.stack import private_stack
from harness.stacks import outage as ostack
from harness.stacks.churn import canary_seed, canary_tenants
from harness.stacks.gateway import TOKEN, replica_env
from lorafleet.config import PlatformSettings

REPLICAS = (ostack.PREFIX + "a", ostack.PREFIX + "b")
REPLICA_READY_S = 240.0  # two SmolLM2 loads beside a JVM on two cores


@dataclass(frozen=True)
class SoakTenant:
    tenant_id: str
    key: str
    versions: AliasVersions


@dataclass
class SoakStack:
    infra: ostack.Stack  # the private services and the supervised apps
    replicas: dict[str, Running]
    pool: asyncpg.Pool
    redis_url: str
    tenants: list[SoakTenant]
    manifest: CanaryManifest
    canaries: Path

    @property
    def settings(self) -> PlatformSettings:
        return self.infra.settings

    def tail(self, name: str, lines: int = 30) -> str:
        if name in self.replicas:
            return self.replicas[name].tail(lines * 120)
        return ostack.tail(self.infra, name, lines)


def _replica(rid: str) -> ProcessSpec:
    port = free_port()
    return ProcessSpec(
        rid, replica_args(rid, port), port, ready=(HttpReady(f"{_url(port)}/health", REPLICA_READY_S),)
    )


def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def soak_stack(s3: PlatformSettings, canaries: Path) -> AsyncIterator[SoakStack]:
    manifest = CanaryManifest.read(canaries)
    ranks = {e.rank for e in manifest.adapters}
    async with ostack.private_infra(s3) as settings:
        work = settings.data_path / "logs"
        pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
        try:
            keys = await write_seed(pool, canary_seed(manifest))
            tenants = [SoakTenant(t, keys[t], v) for t, v in canary_tenants(manifest)]
            with redis_server(settings.data_path / "redis") as redis:
                internal_port, public_port = free_port(), free_port()
                base = ostack.outage_spec(settings, internal_port, public_port)
                env = {
                    **base.env,
                    **replica_env(canaries, manifest.base_model_hash),
                    "LORAFLEET_REDIS_URL": redis.url,
                    # every canary rank in a bucket of two slots: the four versions keep evicting
                    "LORAFLEET_REPLICA_LORA_SLOTS": json.dumps({str(max(ranks)): 2}),
                    "LORAFLEET_REPLICA_MAX_LORA_RANK": str(max(ranks)),
                    "LORAFLEET_REPLICA_MAX_MODEL_LEN": "512",
                    "LORAFLEET_REPLICA_WARMING_TIMEOUT_S": "1",
                    "LORAFLEET_GATEWAY_AUTH_FAILURE_LIMIT": "0",
                }
                spec = replace(
                    base,
                    processes=(*(_replica(r) for r in REPLICAS), *base.processes),
                    env=env,
                    replica_token=TOKEN,
                    fast_state=True,
                )
                async with private_stack(spec, settings, work) as running:
                    infra = ostack.Stack(settings, running.env, _url(internal_port), _url(public_port))
                    yield SoakStack(
                        infra,
                        {r: running.procs[r] for r in REPLICAS},
                        pool,
                        redis.url,
                        tenants,
                        manifest,
                        canaries,
                    )
        finally:
            await pool.close()
