"""The gateway churn test's stack: gateway_stack's two SmolLM2 replica processes and public gateway, serving
canaries from their folders with one GPU slot each and host RAM for about two canaries, a private
redis-server for the rate limiter, the outbox relay in this process, and canary tenants in the database:
each owns two canary versions, its alias on the first."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from canary.churn_verdict import AliasVersions
from canary.gateway_churn import ChurnTenant
from canary.manifest import CanaryManifest
from canary.probe_setup import ProbeTarget, tenant_for
from gateway.registry import aliases
from harness.redis_server import redis_server
from harness.running import Running
from harness.seed import Alias, ReadyAdapter, Seed, Tenant
from harness.stack import private_stack
from harness.stacks.gateway import GatewayStack, gateway_spec, replica_ids_of
from harness.workers import outbox_relay
from lorafleet.config import PlatformSettings

ALIAS_NAME = "marker:churn"
TENANT_PREFIX = "churn"
RAM_ADAPTERS = 2  # host RAM holds this many of the largest canaries: a replica sent three versions evicts
TENANT_LIMITS = (1000.0, 1_000_000)  # requests/s, tokens/min: never refused, so every request reserves


@dataclass
class ChurnStack:
    gw: GatewayStack
    pool: asyncpg.Pool
    redis: Redis
    tenants: list[ChurnTenant]
    killed: dict[str, dict[str, float]] = field(default_factory=dict)  # victim -> its last metrics

    def survivors(self) -> list[Running]:
        return [r for rid, r in self.gw.replicas.items() if rid not in self.killed]

    async def flip(self) -> dict[str, float]:
        """Move every alias to its new version; alias -> when set_alias returned (row and event committed)."""
        acked = {}
        for t in self.tenants:
            _, changed = await aliases.set_alias(self.pool, t.versions.alias, t.versions.new)
            assert changed, t.versions
            acked[t.versions.alias] = time.monotonic()
        return acked

    async def kill_busy(self, timeout_s: float = 60.0) -> float:
        """SIGKILL the first replica seen running a request; when it was killed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for r in self.survivors():
                m = await replica_metrics(r)
                if m.get("vllm:num_requests_running", 0) > 0 and r.proc is not None:
                    os.kill(r.proc.pid, signal.SIGKILL)
                    killed_at = time.monotonic()
                    self.killed[r.name] = m
                    r.proc.wait(10)
                    return killed_at
            await asyncio.sleep(0.02)
        raise TimeoutError(f"no replica was running a request within {timeout_s}s")


def _samples(text: str) -> dict[str, float]:
    """name{label=value,...} -> value, labels sorted; unlabelled samples under their bare name."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


async def replica_metrics(r: Running) -> dict[str, float]:
    async with httpx.AsyncClient() as c:
        return _samples((await c.get(f"{r.url}/metrics", timeout=10)).text)


async def gateway_metrics(url: str) -> dict[str, float]:
    async with httpx.AsyncClient() as c:
        return _samples((await c.get(f"{url}/metrics", timeout=10)).text)


def canary_tenants(manifest: CanaryManifest) -> list[tuple[str, AliasVersions]]:
    """(tenant, its alias's versions): tenant i owns canaries 2i (version 1, where its alias points) and 2i+1
    (version 2)."""
    entries = manifest.adapters
    out = []
    for i in range(len(entries) // 2):
        tenant, old, new = tenant_for(TENANT_PREFIX, i), entries[2 * i], entries[2 * i + 1]
        out.append((tenant, AliasVersions(f"{tenant}/{ALIAS_NAME}", old.adapter_id, new.adapter_id)))
    return out


def canary_seed(manifest: CanaryManifest) -> Seed:
    """Each canary tenant, its two versions and its alias on the first."""
    entry = {e.adapter_id: e for e in manifest.adapters}
    tenants, adapters, aliases_ = [], [], []
    for tenant, versions in canary_tenants(manifest):
        tenants.append(Tenant(tenant, *TENANT_LIMITS))
        for version, adapter_id in ((1, versions.old), (2, versions.new)):
            e = entry[adapter_id]
            adapters.append(
                ReadyAdapter(
                    adapter_id,
                    tenant,
                    manifest.base_model_hash,
                    version=version,
                    rank=e.rank,
                    alpha=int(e.lora_alpha),
                    target_modules=tuple(manifest.target_modules),
                )
            )
        aliases_.append(Alias(versions.alias, tenant, versions.old))
    return Seed(tuple(tenants), tuple(adapters), tuple(aliases_))


@contextlib.asynccontextmanager
async def churn_stack(platform: PlatformSettings, canaries: Path, work: Path) -> AsyncIterator[ChurnStack]:
    manifest = CanaryManifest.read(canaries)
    ranks = {e.rank for e in manifest.adapters}
    largest = max((canaries / e.path / "adapter_model.safetensors").stat().st_size for e in manifest.adapters)
    with redis_server(work / "redis") as server:
        extra = {
            "LORAFLEET_REDIS_URL": server.url,
            # one bucket at the largest rank, one slot: every canary competes for the same slot
            "LORAFLEET_REPLICA_LORA_SLOTS": json.dumps({str(max(ranks)): 1}),
            "LORAFLEET_REPLICA_MAX_LORA_RANK": str(max(ranks)),
            "LORAFLEET_REPLICA_RAM_BUDGET_BYTES": str(RAM_ADAPTERS * largest),
            "LORAFLEET_REPLICA_MAX_MODEL_LEN": "512",
        }
        spec = gateway_spec(canaries, manifest.base_model_hash, extra_env=extra)
        spec = replace(spec, seed=spec.seed + canary_seed(manifest), pool_size=3, workers=(outbox_relay,))
        async with private_stack(spec, platform, work) as stack:
            assert stack.pool is not None
            entry = {e.adapter_id: e for e in manifest.adapters}
            tenants = []
            for tenant, versions in canary_tenants(manifest):
                old = entry[versions.old]
                key = stack.keys[tenant]
                target = ProbeTarget(
                    old.adapter_id, tenant, versions.alias, key, old.marker, len(old.marker_token_ids)
                )
                tenants.append(ChurnTenant(target, versions))
            redis = Redis.from_url(server.url)
            try:
                yield ChurnStack(GatewayStack(stack, replica_ids_of(spec)), stack.pool, redis, tenants)
            finally:
                await redis.aclose()


class RateLedger:
    """Every rate-limit script call the gateways make on a Redis (MONITOR): per bucket key, the reserves
    (six arguments) and the refunds (one) and the tokens refunded. Once MONITOR has ended, calls go
    uncounted, so by_tenant raises rather than answer with partial counts."""

    def __init__(self, url: str) -> None:
        # MONITOR says nothing while the gateways make no call (every chat mid-stream); a read timeout
        # would end the watch in such a quiet spell
        self.client = Redis.from_url(url, socket_timeout=None)
        self.reserves: Counter[str] = Counter()
        self.refunds: Counter[str] = Counter()
        self.refunded_tokens: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def __aenter__(self) -> RateLedger:
        self._task = asyncio.create_task(self._watch())
        await asyncio.wait_for(self._ready.wait(), 10)
        return self

    async def _watch(self) -> None:
        async with self.client.monitor() as monitor:
            self._ready.set()
            async for info in monitor.listen():
                parts = str(info.get("command", "")).split()
                if len(parts) < 4 or parts[0].upper() != "EVALSHA":
                    continue
                key, args = parts[3], parts[4:]
                if len(args) == 6:
                    self.reserves[key] += 1
                elif len(args) == 1:
                    self.refunds[key] += 1
                    self.refunded_tokens[key] += int(float(args[0]))

    @property
    def stopped(self) -> str | None:
        """Why the watch ended before the ledger was closed (it has counted nothing since), or None."""
        if self._task is None or not self._task.done() or self._task.cancelled():
            return None
        return f"MONITOR ended: {self._task.exception()!r}"

    def by_tenant(self, tenant: str) -> tuple[int, int, int]:
        """(reserves, refunds, tokens refunded) on the tenant's bucket."""
        if self.stopped is not None:
            raise RuntimeError(f"the rate ledger stopped counting ({self.stopped})")
        keys = [k for k in self.reserves.keys() | self.refunds.keys() if k.endswith(":" + tenant)]
        return (
            sum(self.reserves[k] for k in keys),
            sum(self.refunds[k] for k in keys),
            sum(self.refunded_tokens[k] for k in keys),
        )

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.client.aclose()
