"""A real online path for the gateway tests: a migrated database with two tenants, keys, ready adapters and
aliases; two replica processes on SmolLM2 serving real PEFT adapters from local folders and publishing their
own replica.state; the public gateway as a process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest

from gateway.tenants import create_key, create_tenant
from harness.databases import create_database, drop_database
from harness.ports import free_port
from harness.processes import stop, wait_http
from harness.seed import ReadyAdapter, insert_alias, insert_ready_adapters
from lorafleet.config import PlatformSettings
from lorafleet.db.migrate import migrate

REPO = Path(__file__).resolve().parents[2]
TOKEN = "gw-test-replica-token"
ADMIN_TOKEN = "gw-test-service-token"  # the gateway's own service token (internal API, /console/api)
ADAPTERS = {"acme-support-v1": "acme", "acme-support-v2": "acme", "globex-sales-v1": "globex"}
ALIASES = {"acme/support:prod": "acme-support-v1", "globex/sales:prod": "globex-sales-v1"}
TENANT_LIMITS = {"acme": (50, 200_000), "globex": (2, 200_000)}  # (requests/s, tokens/min)


@dataclass
class ReplicaProc:
    replica_id: str
    port: int
    log: Path
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class GatewayStack:
    url: str
    database_url: str
    keys: dict[str, str]
    replicas: dict[str, ReplicaProc]
    env: dict[str, str]
    gateway_log: Path
    gateway: subprocess.Popen | None = None

    async def state(self, replica_id: str) -> dict:
        r = self.replicas[replica_id]
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            resp = await c.get(f"{r.url}/internal/replicas/{replica_id}/state", timeout=5)
            return resp.json()


async def random_adapters(
    tmp_path_factory: pytest.TempPathFactory, ids: list[str] | None = None
) -> tuple[Path, str]:
    """The stack's adapters (ADAPTERS, or ids) as random PEFT folders under a fresh root, and the base hash."""
    from harness.adapters import make_peft_adapters
    from lorafleet.model.base_hash import base_model_hash
    from lorafleet.model.prepare import ensure_default_model

    model_dir = ensure_default_model()
    base_hash = await asyncio.to_thread(base_model_hash, model_dir)
    root = tmp_path_factory.mktemp("adapters")
    await asyncio.to_thread(make_peft_adapters, model_dir, root, ids or list(ADAPTERS), base_hash)
    return root, base_hash


async def _seed(database_url: str, adapter_dirs: dict[str, Path], base_hash: str) -> dict[str, str]:
    await migrate(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        for tenant, (requests_per_s, tokens_per_min) in TENANT_LIMITS.items():
            await create_tenant(pool, tenant, requests_per_s, tokens_per_min)
        await insert_ready_adapters(
            pool,
            [
                ReadyAdapter(adapter_id, tenant, base_hash, version=2 if adapter_id.endswith("v2") else 1)
                for adapter_id, tenant in ADAPTERS.items()
            ],
        )
        for alias, adapter_id in ALIASES.items():
            await insert_alias(pool, alias, alias.split("/")[0], adapter_id)
        return {t: (await create_key(pool, t)).secret for t in TENANT_LIMITS}
    finally:
        await pool.close()


def start_replica(r: ReplicaProc, env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "lorafleet.cli", "replica", "serve", "--replica-id", r.replica_id]
    with open(r.log, "ab") as log:
        r.proc = subprocess.Popen(
            [*cmd, "--port", str(r.port)], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT
        )


@contextlib.asynccontextmanager
async def gateway_stack(
    platform: PlatformSettings,
    adapter_root: Path,
    base_hash: str,
    work: Path,
    replica_ids: tuple[str, ...] | None = None,
    extra_env: dict[str, str] | None = None,
) -> AsyncIterator[GatewayStack]:
    name = f"gw_{uuid.uuid4().hex[:10]}"
    # Two replicas with ids of this stack's own by default: parallel runs share Kafka's replica.state, and
    # the gateway routes only to ids with the given ones' common prefix.
    if replica_ids is None:
        unique = f"gwt{uuid.uuid4().hex[:6]}-"
        replica_ids = (unique + "a", unique + "b")
    prefix = os.path.commonprefix(list(replica_ids))
    database_url = await create_database(platform.database_url, name)
    keys = await _seed(database_url, {k: adapter_root / k for k in ADAPTERS}, base_hash)
    env = {
        **os.environ,
        "LORAFLEET_KAFKA_BOOTSTRAP": platform.kafka_bootstrap,
        "LORAFLEET_DATABASE_URL": database_url,
        "LORAFLEET_REPLICA_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_REPLICA_ADAPTER_ROOT": str(adapter_root),
        "LORAFLEET_REPLICA_MAX_NUM_SEQS": "8",
        "LORAFLEET_REPLICA_BASE_MODEL_HASH": base_hash,
        "LORAFLEET_REPLICA_STATE_INTERVAL_S": "0.5",  # well inside the gateway's staleness below
        # No placement worker here: nothing is placed on the replicas, so warming only waits out this.
        "LORAFLEET_REPLICA_WARMING_TIMEOUT_S": "1",
        "LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_GATEWAY_SERVICE_TOKEN": ADMIN_TOKEN,
        "LORAFLEET_GATEWAY_REPLICA_STALE_S": "1.5",
        "LORAFLEET_GATEWAY_KEY_CACHE_TTL_S": "0.5",
        # every client here is 127.0.0.1, and the fuzz tests send hundreds of bad keys from it
        # (tests/integration/test_auth_failures.py tests the limit)
        "LORAFLEET_GATEWAY_AUTH_FAILURE_LIMIT": "0",
        # route only to this stack's replicas, never to a `make up` fleet sharing the same Kafka
        "LORAFLEET_GATEWAY_REPLICA_ID_PREFIX": prefix,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        **(extra_env or {}),
    }
    replicas = {rid: ReplicaProc(rid, free_port(), work / f"{rid}.log") for rid in replica_ids}
    port = free_port()
    env["LORAFLEET_GATEWAY_PUBLIC_PORT"] = str(port)
    stack = GatewayStack(f"http://127.0.0.1:{port}", database_url, keys, replicas, env, work / "gateway.log")
    for r in replicas.values():
        start_replica(r, env)
    with open(stack.gateway_log, "ab") as log:
        gw = subprocess.Popen(
            [sys.executable, "-m", "lorafleet.cli", "public-gateway"],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    stack.gateway = gw
    try:
        for r in replicas.values():
            await wait_http(f"{r.url}/health", 120, r.proc)
        await wait_http(f"{stack.url}/health", 60, gw)
        await wait_http(f"{stack.url}/ready", 30, gw)
        yield stack
    finally:
        stop(gw)
        for r in replicas.values():
            stop(r.proc)
        await drop_database(platform.database_url, name)
