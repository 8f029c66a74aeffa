"""What the deployment-file runs drive through the processes they start: a tenant with a key (the operator's
CLI, on the database), adapter versions registered through the internal API (upload, validation), an alias
moved, and chats through the public gateway."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx

from gateway.tenants import create_key, create_tenant
from harness.adapters import make_peft_adapters
from lorafleet.client.registration import AdapterUpload, register_adapters
from lorafleet.config import PlatformSettings

PROMPT = [{"role": "user", "content": "Say hello."}]


async def tenant_with_key(owner_url: str, tenant_id: str) -> str:
    """A tenant and an API key of its own, made as `lorafleet tenants create` and `keys issue` make them."""
    pool = await asyncpg.create_pool(owner_url, min_size=1, max_size=1)
    try:
        await create_tenant(pool, tenant_id, 50.0, 1_000_000)
        return (await create_key(pool, tenant_id)).secret
    finally:
        await pool.close()


async def register_versions(
    internal_url: str,
    service_token: str,
    store: PlatformSettings,
    model_dir: Path,
    base_hash: str,
    work: Path,
    tenant_id: str,
    adapter_ids: list[str],
) -> None:
    """Random PEFT adapters on the base, uploaded to the store and registered through the internal API,
    each ready once the registry validator passed it."""
    dirs = await asyncio.to_thread(make_peft_adapters, model_dir, work / "adapters", adapter_ids, base_hash)
    uploads = [AdapterUpload(a, tenant_id, 1, dirs[a]) for a in adapter_ids]
    headers = {"Authorization": f"Bearer {service_token}"}
    async with httpx.AsyncClient(base_url=internal_url, headers=headers, timeout=60) as client:
        views = await register_adapters(client, store, base_hash, uploads, time.monotonic() + 120)
    assert [v.status for v in views] == ["ready"] * len(adapter_ids), views


async def move_alias(internal_url: str, service_token: str, alias: str, adapter_id: str) -> None:
    headers = {"Authorization": f"Bearer {service_token}"}
    async with httpx.AsyncClient(base_url=internal_url, headers=headers, timeout=30) as client:
        resp = await client.put(f"/internal/aliases/{alias}", json={"adapter_id": adapter_id})
    assert resp.status_code == 200, resp.text


@dataclass(frozen=True)
class Answer:
    status: int
    adapter_id: str | None
    replayed: bool
    text: str


async def chat(public_url: str, key: str, alias: str, idempotency_key: str | None = None) -> Answer:
    """One chat through the public gateway (temperature 0, a few tokens)."""
    headers = {"Authorization": f"Bearer {key}"}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    body = {"model": alias, "messages": PROMPT, "max_tokens": 4, "temperature": 0}
    async with httpx.AsyncClient(base_url=public_url, timeout=120) as client:
        resp = await client.post("/v1/chat/completions", json=body, headers=headers)
    replayed = resp.headers.get("idempotent-replayed") == "true"
    return Answer(resp.status_code, resp.headers.get("x-adapter-id"), replayed, resp.text)


async def served_by(public_url: str, key: str, alias: str, adapter_id: str, within_s: float) -> Answer:
    """Chat until the answer comes from adapter_id (an alias move reaches the gateway's cache through
    aliases.changed); the last answer, which must be a success from that adapter."""
    deadline = time.monotonic() + within_s
    while True:
        answer = await chat(public_url, key, alias)
        if (answer.status == 200 and answer.adapter_id == adapter_id) or time.monotonic() > deadline:
            assert answer.status == 200, answer.text[:500]
            assert answer.adapter_id == adapter_id, (answer.adapter_id, adapter_id)
            return answer
        await asyncio.sleep(1.0)
