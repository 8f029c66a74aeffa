"""The fleet benchmark's adapters, put in as a customer's pipeline puts them: a PEFT folder per adapter,
uploaded to the object store, registered through the internal API, passed by the registry validator (its
`adapters.validated` event reaching the placement worker through the outbox and the relay), and an alias
per adapter moved through the same API.

The stand-ins never fetch weights, so each adapter is the smallest folder the registry accepts at rank 16:
q_proj on the first decoder layer of the served base, in bf16. Adapter i has the same bytes in every run
(seeded by i), so two runs sharing the object store write the same objects.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from lorafleet.adapter_rules.base_spec import BaseSpec
from lorafleet.client.registration import AdapterUpload, register_adapters
from lorafleet.config import PlatformSettings
from lorafleet.peft_format import adapter_config, save_peft_adapter

RANK = 16
CONCURRENCY = 8  # registrations in flight: the internal API, the store and the validator stay busy


@dataclass(frozen=True)
class FleetAdapter:
    adapter_id: str
    tenant_id: str
    alias: str


def write_small_adapter(model_dir: Path, base_hash: str, out: Path, seed: int) -> Path:
    """A rank-16 PEFT folder on q_proj of layer 0 of the base in model_dir, the same for the same seed."""
    fan_in, fan_out = BaseSpec.from_model_dir(model_dir).shapes["q_proj"]
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(RANK, fan_in, generator=gen) * fan_in**-0.5).to(torch.bfloat16)
    b = (torch.randn(fan_out, RANK, generator=gen) * 0.01).to(torch.bfloat16)
    config = adapter_config(RANK, 2 * RANK, ["q_proj"], str(model_dir), base_hash, layers=[0])
    return save_peft_adapter(out, {(0, "q_proj"): (a, b)}, config)


async def _register_chunk(
    internal_url: str,
    token: str,
    platform: PlatformSettings,
    base_hash: str,
    uploads: list[AdapterUpload],
    wait_s: float,
) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=internal_url, headers=headers, timeout=60) as client:
        await register_adapters(client, platform, base_hash, uploads, time.monotonic() + wait_s)


async def _point_aliases(internal_url: str, token: str, adapters: list[FleetAdapter]) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=internal_url, headers=headers, timeout=60) as client:
        for a in adapters:
            resp = await client.put(f"/internal/aliases/{a.alias}", json={"adapter_id": a.adapter_id})
            resp.raise_for_status()


async def register_fleet(
    internal_url: str,
    token: str,
    platform: PlatformSettings,
    model_dir: Path,
    base_hash: str,
    adapters: list[FleetAdapter],
    work: Path,
    wait_s: float | None = None,
) -> dict[str, float]:
    """Every adapter ready and its alias pointed at it; the seconds each stage took. A version still pending
    after wait_s (default: a minute plus 0.2 s per adapter) raises RegistrationError."""
    wait_s = wait_s if wait_s is not None else 60.0 + 0.2 * len(adapters)
    folders = work / "adapters"
    started = time.monotonic()
    uploads = [
        AdapterUpload(
            a.adapter_id, a.tenant_id, 1, write_small_adapter(model_dir, base_hash, folders / a.adapter_id, i)
        )
        for i, a in enumerate(adapters)
    ]
    written = time.monotonic()
    chunks = [uploads[i::CONCURRENCY] for i in range(CONCURRENCY)]
    await asyncio.gather(
        *(_register_chunk(internal_url, token, platform, base_hash, c, wait_s) for c in chunks if c)
    )
    ready = time.monotonic()
    await asyncio.gather(
        *(_point_aliases(internal_url, token, adapters[i::CONCURRENCY]) for i in range(CONCURRENCY))
    )
    shutil.rmtree(folders, ignore_errors=True)
    return {
        "adapters": len(adapters),
        "write_s": round(written - started, 2),
        "register_until_ready_s": round(ready - written, 2),
        "aliases_s": round(time.monotonic() - ready, 2),
    }
