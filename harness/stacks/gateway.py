"""The gateway's online path as a private stack: a database with two tenants, keys, ready adapters and
aliases; SmolLM2 replica processes serving random PEFT adapters from local folders and publishing their own
replica.state; the public gateway as a process, routing only to this stack's replicas."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from harness.ports import free_port
from harness.running import Running
from harness.seed import Alias, ReadyAdapter, Seed, Tenant
from harness.spec import HttpReady, ProcessSpec, StackSpec, app_args, replica_args
from harness.stack import RunningStack, private_stack
from lorafleet.config import PlatformSettings

TOKEN = "gw-test-replica-token"
ADMIN_TOKEN = "gw-test-service-token"  # the internal gateway's service token (internal API, /console/api)
ADAPTERS = {"acme-support-v1": "acme", "acme-support-v2": "acme", "globex-sales-v1": "globex"}
ALIASES = {"acme/support:prod": "acme-support-v1", "globex/sales:prod": "globex-sales-v1"}
TENANT_LIMITS = {"acme": (50, 200_000), "globex": (2, 200_000)}  # (requests/s, tokens/min)
GATEWAY = "public-gateway"
INTERNAL = "gateway"


def gateway_seed(base_hash: str) -> Seed:
    """Tenants acme and globex with their limits, their adapters (an id ending v2 is version 2), aliases."""
    return Seed(
        tuple(Tenant(t, rps, tpm) for t, (rps, tpm) in TENANT_LIMITS.items()),
        tuple(
            ReadyAdapter(a, t, base_hash, version=2 if a.endswith("v2") else 1) for a, t in ADAPTERS.items()
        ),
        tuple(Alias.of(alias, adapter_id) for alias, adapter_id in ALIASES.items()),
    )


def replica_env(adapter_root: Path, base_hash: str) -> dict[str, str]:
    """Replicas serving the adapters in adapter_root's folders, eight rows each."""
    return {
        "LORAFLEET_REPLICA_ADAPTER_ROOT": str(adapter_root),
        "LORAFLEET_REPLICA_MAX_NUM_SEQS": "8",
        "LORAFLEET_REPLICA_BASE_MODEL_HASH": base_hash,
    }


def public_gateway(ready: tuple[tuple[str, float], ...] = (("/health", 60), ("/ready", 30))) -> ProcessSpec:
    """The public gateway on a free port, ready once each (path, within seconds) answers 200 in turn."""
    port = free_port()
    probes = tuple(HttpReady(f"http://127.0.0.1:{port}{path}", within_s) for path, within_s in ready)
    return ProcessSpec(GATEWAY, app_args(GATEWAY), port, {"LORAFLEET_GATEWAY_PUBLIC_PORT": str(port)}, probes)


def internal_gateway() -> ProcessSpec:
    """The internal gateway (registry, aliases, the operator console) on a free port, ready once it answers
    the console page."""
    port = free_port()
    probe = HttpReady(f"http://127.0.0.1:{port}/console/", 60)
    env = {"LORAFLEET_GATEWAY_INTERNAL_PORT": str(port)}
    return ProcessSpec(INTERNAL, app_args(INTERNAL), port, env, (probe,))


def gateway_spec(
    adapter_root: Path,
    base_hash: str,
    replica_ids: tuple[str, ...] | None = None,
    extra_env: Mapping[str, str] | None = None,
    internal: bool = False,
) -> StackSpec:
    """The stack: replicas replica_ids (two of a fresh prefix by default), then the public gateway (and the
    internal one, with the operator console, when asked)."""
    # Parallel runs share Kafka's replica.state: the gateway routes only to ids with the replicas' common
    # prefix, so by default they get a prefix of this stack's own.
    if replica_ids is None:
        unique = f"gwt{uuid.uuid4().hex[:6]}-"
        replica_ids = (unique + "a", unique + "b")
    replicas = []
    for rid in replica_ids:
        port = free_port()
        health = HttpReady(f"http://127.0.0.1:{port}/health", 120)
        replicas.append(ProcessSpec(rid, replica_args(rid, port), port, ready=(health,)))
    env = {
        **replica_env(adapter_root, base_hash),
        # No placement worker here: nothing is placed on the replicas, so warming only waits out this.
        "LORAFLEET_REPLICA_WARMING_TIMEOUT_S": "1",
        "LORAFLEET_GATEWAY_SERVICE_TOKEN": ADMIN_TOKEN,
        "LORAFLEET_GATEWAY_KEY_CACHE_TTL_S": "0.5",
        # every client here is 127.0.0.1, and the fuzz tests send hundreds of bad keys from it
        # (tests/integration/test_auth_failures.py tests the limit)
        "LORAFLEET_GATEWAY_AUTH_FAILURE_LIMIT": "0",
        **(extra_env or {}),
    }
    gateways = (public_gateway(), internal_gateway()) if internal else (public_gateway(),)
    return StackSpec(
        processes=(*replicas, *gateways),
        database=f"gw_{uuid.uuid4().hex[:10]}",
        seed=gateway_seed(base_hash),
        prefix=os.path.commonprefix(list(replica_ids)),
        replica_token=TOKEN,
        fast_state=True,
        env=env,
    )


@dataclass
class GatewayStack:
    """The running stack as the gateway tests read it."""

    stack: RunningStack
    replica_ids: tuple[str, ...]

    @property
    def url(self) -> str:
        return self.stack.procs[GATEWAY].url

    @property
    def internal_url(self) -> str:
        """The internal gateway's URL (a stack built with internal=True)."""
        return self.stack.procs[INTERNAL].url

    @property
    def database_url(self) -> str:
        return self.stack.database_url

    @property
    def keys(self) -> dict[str, str]:
        return self.stack.keys

    @property
    def env(self) -> dict[str, str]:
        return self.stack.env

    @property
    def replicas(self) -> dict[str, Running]:
        return {rid: self.stack.procs[rid] for rid in self.replica_ids}

    @property
    def gateway(self) -> subprocess.Popen[bytes] | None:
        return self.stack.procs[GATEWAY].proc

    @property
    def gateway_log(self) -> Path:
        return self.stack.procs[GATEWAY].log

    async def state(self, replica_id: str) -> dict:
        """The replica's own state route's answer."""
        r = self.replicas[replica_id]
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            resp = await c.get(f"{r.url}/internal/replicas/{replica_id}/state", timeout=5)
            return resp.json()


def replica_ids_of(spec: StackSpec) -> tuple[str, ...]:
    """The names of the spec's replica processes."""
    return tuple(p.name for p in spec.processes if p.args[:2] == ("replica", "serve"))


async def random_adapters(root: Path, ids: list[str] | None = None) -> tuple[Path, str]:
    """The stack's adapters (ADAPTERS, or ids) as random PEFT folders under root, and the base's hash."""
    from harness.adapters import make_peft_adapters
    from lorafleet.model.base_hash import base_model_hash
    from lorafleet.model.prepare import ensure_default_model

    model_dir = ensure_default_model()
    base_hash = await asyncio.to_thread(base_model_hash, model_dir)
    await asyncio.to_thread(make_peft_adapters, model_dir, root, ids or list(ADAPTERS), base_hash)
    return root, base_hash


@contextlib.asynccontextmanager
async def gateway_stack(
    platform: PlatformSettings,
    adapter_root: Path,
    base_hash: str,
    work: Path,
    replica_ids: tuple[str, ...] | None = None,
    extra_env: Mapping[str, str] | None = None,
    internal: bool = False,
) -> AsyncIterator[GatewayStack]:
    """gateway_spec's stack on platform's services, up, with the gateways' probes and replicas healthy."""
    spec = gateway_spec(adapter_root, base_hash, replica_ids, extra_env, internal)
    async with private_stack(spec, platform, work) as stack:
        yield GatewayStack(stack, replica_ids_of(spec))
