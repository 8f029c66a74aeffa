"""Upload, register, wait until ready: how a client puts adapter versions into the registry.

Idempotent: a version the registry already holds (for the same tenant) is neither uploaded nor registered
again, so a rerun only waits. Every version must end `ready`; one that the registry validator rejects, or
that is still `pending` at the deadline, raises RegistrationError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from lorafleet.client.errors import RegistrationError
from lorafleet.client.peft_dir import describe_peft_dir
from lorafleet.client.upload import artifact_prefix, upload_peft_dir
from lorafleet.config import PlatformSettings
from lorafleet.s3 import async_client
from schemas.api import AdapterRegistration, AdapterView, RegistrationAccepted

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client

POLL_S = 0.5


@dataclass(frozen=True)
class AdapterUpload:
    """One version to register: its id, its owner, its version number and its local PEFT folder."""

    adapter_id: str
    tenant_id: str
    version: int
    peft_dir: Path


async def registered(client: httpx.AsyncClient, adapter_id: str) -> AdapterView | None:
    """The registry's view of a version, or None when it is not registered."""
    resp = await client.get(f"/internal/adapters/{adapter_id}")
    if resp.status_code == 404:
        return None
    if resp.status_code != 200:
        raise RegistrationError(adapter_id, f"reading {adapter_id} failed: {resp.status_code} {resp.text}")
    return AdapterView.model_validate(resp.json())


async def register_adapters(
    client: httpx.AsyncClient,
    platform: PlatformSettings,
    base_model_hash: str,
    uploads: Sequence[AdapterUpload],
    deadline: float,
) -> list[AdapterView]:
    """Upload and register every version not registered yet, then wait (until time.monotonic() passes
    deadline) for each to be ready; return their ready views in the order given.

    client talks to the internal API with the service token."""
    missing = []
    for upload in uploads:
        view = await registered(client, upload.adapter_id)
        if view is None:
            missing.append(upload)
        elif view.tenant_id != upload.tenant_id:
            raise RegistrationError(
                upload.adapter_id,
                f"{upload.adapter_id} is registered to {view.tenant_id}, not {upload.tenant_id}",
            )
    if missing:
        async with async_client(platform) as s3:
            for upload in missing:
                await _register(client, s3, platform.s3_bucket, base_model_hash, upload)
    return [await wait_ready(client, upload.adapter_id, deadline) for upload in uploads]


async def _register(
    client: httpx.AsyncClient, s3: S3Client, bucket: str, base_model_hash: str, upload: AdapterUpload
) -> None:
    facts = describe_peft_dir(upload.peft_dir)
    prefix = artifact_prefix(upload.tenant_id, upload.adapter_id)
    checksum = await upload_peft_dir(s3, upload.peft_dir, bucket, prefix)
    body = AdapterRegistration(
        adapter_id=upload.adapter_id,
        tenant_id=upload.tenant_id,
        version=upload.version,
        base_model_hash=base_model_hash,
        rank=facts.rank,
        alpha=facts.alpha,
        target_modules=facts.target_modules,
        weights_uri=f"s3://{bucket}/{prefix}",
        checksum=checksum,
    )
    await post_registration(client, body)


async def post_registration(client: httpx.AsyncClient, body: AdapterRegistration) -> RegistrationAccepted:
    """POST one version to the internal API; a 4xx/5xx answer raises RegistrationError with its body."""
    resp = await client.post("/internal/adapters", json=body.model_dump(mode="json"))
    if resp.status_code >= 400:
        raise RegistrationError(
            body.adapter_id, f"registering {body.adapter_id} failed: {resp.status_code} {resp.text}"
        )
    return RegistrationAccepted.model_validate(resp.json())


async def wait_ready(client: httpx.AsyncClient, adapter_id: str, deadline: float) -> AdapterView:
    """Poll a version until it leaves `pending`; return it when ready, raise when rejected or late."""
    while True:
        view = await registered(client, adapter_id)
        if view is None:
            raise RegistrationError(adapter_id, f"{adapter_id} is not registered")
        if view.status == "ready":
            return view
        if view.status == "rejected":
            raise RegistrationError(
                adapter_id, f"{adapter_id} was rejected: {view.reason_code}: {view.reason}", view.reason_code
            )
        if time.monotonic() > deadline:
            raise RegistrationError(
                adapter_id, f"{adapter_id} is still pending; is the registry validator running?"
            )
        await asyncio.sleep(POLL_S)


def register_and_wait(
    internal_url: str,
    service_token: str,
    platform: PlatformSettings,
    base_model_hash: str,
    uploads: Sequence[AdapterUpload],
    wait_s: float,
) -> list[AdapterView]:
    """register_adapters from synchronous code, against the internal API at internal_url."""

    async def run() -> list[AdapterView]:
        headers = {"Authorization": f"Bearer {service_token}"}
        async with httpx.AsyncClient(base_url=internal_url, headers=headers, timeout=60) as client:
            return await register_adapters(
                client, platform, base_model_hash, uploads, time.monotonic() + wait_s
            )

    return asyncio.run(run())
