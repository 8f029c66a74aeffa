"""Put a canary set into a running deployment: tenants with keys, registered versions, aliases, all servable.

Everything is idempotent: a version already registered is reused, a tenant is created or kept, and an
alias is pointed again at its canary. Keys are fresh each run (the secret is shown once and never stored).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from canary.errors import CanaryError
from canary.manifest import CanaryManifest
from gateway.config import GatewayConfig
from gateway.registry.served_base import served_base_hash
from lorafleet.client.errors import PeftDirError, RegistrationError
from lorafleet.client.registration import AdapterUpload, register_and_wait

log = logging.getLogger(__name__)

ALIAS_NAME = "marker:probe"


@dataclass(frozen=True)
class ProbeTarget:
    """One canary as the probe calls it: whose it is, its alias, the tenant's key and its marker."""

    adapter_id: str
    tenant_id: str
    alias: str
    key: str
    marker: str
    marker_tokens: int


def tenant_for(prefix: str, index: int) -> str:
    """One tenant per canary, so every alias has exactly one owner and every other key is a stranger."""
    return f"{prefix}-{index}"


async def _tenants_and_keys(database_url: str, tenants: list[str]) -> dict[str, str]:
    """Create (or keep) each tenant with a generous limit and issue it a fresh key."""
    import asyncpg

    from gateway.tenants import create_key, create_tenant

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        keys = {}
        for tenant in tenants:
            await create_tenant(pool, tenant, 1000.0, 10_000_000)
            keys[tenant] = (await create_key(pool, tenant)).secret
        return keys
    finally:
        await pool.close()


def wait_servable(gateway: str, targets: list[ProbeTarget], deadline: float) -> None:
    """Each alias answers its owner with a 200 (the public gateway has seen the alias and a live replica)."""
    with httpx.Client(base_url=gateway, timeout=60) as client:
        for t in targets:
            while True:
                body = {"model": t.alias, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
                resp = client.post(
                    "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {t.key}"}
                )
                if resp.status_code == 200:
                    break
                if time.monotonic() > deadline:
                    raise CanaryError(f"{t.alias} is not servable: {resp.status_code} {resp.text}")
                time.sleep(0.5)


def install_canaries(
    config: GatewayConfig, canaries: Path, gateway: str, tenant_prefix: str, wait_s: float
) -> list[ProbeTarget]:
    """Register every canary of the manifest, give each its own tenant, key and alias; wait until servable."""
    manifest = CanaryManifest.read(canaries)
    if manifest.marker_kind != "text":
        raise CanaryError("the probe needs text markers: train the canaries on the served base, not --tiny")
    tenants = [tenant_for(tenant_prefix, i) for i in range(len(manifest.adapters))]
    keys = asyncio.run(_tenants_and_keys(config.platform.database_url, tenants))
    deadline = time.monotonic() + wait_s
    token = config.gateway.service_token.get_secret_value()
    targets = []
    uploads = [
        AdapterUpload(entry.adapter_id, tenant, 1, manifest.adapter_dir(canaries, entry.adapter_id))
        for entry, tenant in zip(manifest.adapters, tenants, strict=True)
    ]
    try:
        register_and_wait(
            config.gateway.internal_base_url(),
            token,
            config.platform,
            served_base_hash(config.gateway),
            uploads,
            deadline - time.monotonic(),
        )
    except (RegistrationError, PeftDirError) as exc:
        raise CanaryError(str(exc)) from exc
    with httpx.Client(
        base_url=config.gateway.internal_base_url(), headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        for entry, tenant in zip(manifest.adapters, tenants, strict=True):
            alias = f"{tenant}/{ALIAS_NAME}"
            resp = client.put(f"/internal/aliases/{alias}", json={"adapter_id": entry.adapter_id})
            if resp.status_code >= 400:
                raise CanaryError(
                    f"alias {alias} -> {entry.adapter_id} failed: {resp.status_code} {resp.text}"
                )
            targets.append(
                ProbeTarget(
                    entry.adapter_id, tenant, alias, keys[tenant], entry.marker, len(entry.marker_token_ids)
                )
            )
    wait_servable(gateway, targets, deadline)
    log.info("installed %d canaries behind %s", len(targets), gateway)
    return targets
