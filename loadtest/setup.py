"""`lorafleet loadtest --setup N`: a load-test tenant with N ready adapters and one alias each, idempotently.

The adapters are real PEFT LoRA folders on the served base, random and written without peft (every
projection the replica adapts, so they have the brief's shape: rank 16 on attention and MLP), each seeded
by its index so adapter i has the same bytes whatever N is (a registered version is immutable). They are
uploaded and registered through the internal API like any pipeline's; the registry validator marks them
ready; aliases `<tenant>/a<i>:prod` point at them. The tenant's limits are high enough for bursts of
concurrent requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import httpx

from gateway.config import GatewayConfig
from harness.adapters import RandomLora, write_random_adapter
from lorafleet.client.registration import AdapterUpload, register_and_wait
from schemas.api import ADAPTER_WEIGHTS_NAME

log = logging.getLogger(__name__)

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
REQUESTS_PER_S = 500.0  # a burst of 32 concurrent requests is one second's allowance many times over
TOKENS_PER_MIN = 50_000_000


def adapter_id(tenant: str, rank: int, i: int) -> str:
    return f"{tenant}-r{rank}-a{i:03d}"


def alias(tenant: str, i: int) -> str:
    return f"{tenant}/a{i:03d}:prod"


def make_adapters(model_dir: Path, root: Path, ids: list[str], base_hash: str, rank: int) -> dict[str, Path]:
    """root/<id>/ PEFT folders; adapter ids[i] is seeded by i. Existing complete folders are kept."""
    lora = RandomLora(rank=rank, alpha=2 * rank, target_modules=TARGETS, b_std=0.01)
    dirs = {aid: root / aid for aid in ids}
    missing = [i for i, aid in enumerate(ids) if not (dirs[aid] / ADAPTER_WEIGHTS_NAME).is_file()]
    for i in missing:
        write_random_adapter(model_dir, dirs[ids[i]], lora, i, base_hash)
    if missing:
        log.info("made %d PEFT adapters (rank %d) under %s", len(missing), rank, root)
    return dirs


async def tenant_key(config: GatewayConfig, tenant: str, keys_path: Path) -> str:
    """The tenant with load-test limits, and a working key (reused from keys_path while it works)."""
    import asyncpg

    from gateway.tenants import create_key, create_tenant, find_caller, key_hash

    saved = json.loads(keys_path.read_text()) if keys_path.is_file() else {}
    pool = await asyncpg.create_pool(config.platform.database_url, min_size=1, max_size=2)
    try:
        await create_tenant(pool, tenant, REQUESTS_PER_S, TOKENS_PER_MIN)
        secret = saved.get(tenant)
        if secret is None or await find_caller(pool, key_hash(secret)) is None:
            secret = (await create_key(pool, tenant)).secret
    finally:
        await pool.close()
    keys_path.parent.mkdir(parents=True, exist_ok=True)
    keys_path.write_text(json.dumps({**saved, tenant: secret}))
    os.chmod(keys_path, 0o600)
    return secret


def register(config: GatewayConfig, tenant: str, dirs: dict[str, Path], wait_s: float) -> None:
    """Upload and register each adapter (version 1) not registered yet; wait until every one is ready."""
    from gateway.registry.served_base import served_base_hash

    uploads = [AdapterUpload(aid, tenant, 1, folder) for aid, folder in dirs.items()]
    token = config.gateway.service_token.get_secret_value()
    base_hash = served_base_hash(config.gateway)
    register_and_wait(config.gateway.internal_base_url(), token, config.platform, base_hash, uploads, wait_s)


def setup(count: int, tenant: str, rank: int = 16, wait_s: float = 300.0) -> tuple[list[str], dict[str, str]]:
    """Ensure `count` ready adapters with aliases for `tenant`; return (aliases, {tenant: key}).

    Adapter folders and the tenant's key (mode 600) are kept under <data dir>/loadtest/."""
    from lorafleet.model.base_hash import base_model_hash
    from lorafleet.model.prepare import ensure_default_model

    config = GatewayConfig.from_env()
    model_dir = ensure_default_model()
    ids = [adapter_id(tenant, rank, i) for i in range(count)]
    home = config.platform.data_path / "loadtest"
    dirs = make_adapters(model_dir, home / "adapters", ids, base_model_hash(model_dir), rank)
    key = asyncio.run(tenant_key(config, tenant, home / "keys.json"))
    register(config, tenant, dirs, wait_s)
    token = config.gateway.service_token.get_secret_value()
    with httpx.Client(
        base_url=config.gateway.internal_base_url(), headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as client:
        names = [alias(tenant, i) for i in range(count)]
        for name, aid in zip(names, ids, strict=True):
            current = client.get(f"/internal/aliases/{name}")
            if current.status_code != 200 or current.json().get("adapter_id") != aid:
                client.put(f"/internal/aliases/{name}", json={"adapter_id": aid}).raise_for_status()
    return names, {tenant: key}
