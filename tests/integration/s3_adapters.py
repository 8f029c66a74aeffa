"""Adapters in the real S3 behind a fault proxy, and the replica's adapter cache over them.

The cache is built the way Replica.start builds it (replica.adapter_cache.assemble) over a tiny base's
LoRA layers; only the record source is a dict here (the registry's answer, not what is under test).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from lorafleet.client.upload import upload_peft_dir
from lorafleet.config import PlatformSettings
from lorafleet.fetch_retry import FetchPolicy
from lorafleet.s3 import async_client
from replica.adapter_cache.assemble import adapter_cache
from replica.adapter_cache.cache import AdapterCache
from replica.adapter_cache.errors import AdapterNotRegisteredError
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.record import AdapterRecord, digest_of
from replica.lora.replace import lora_layers
from replica.lora.spec import AdapterSpec
from schemas.llama import linear_shapes
from tests.gateway.adapter_files import TARGETS, TINY_BASE_HASH, TINY_CONFIG
from tests.integration.fault_proxy import FaultProxy

BUCKET = "lorafleet-adapters"
RUN = uuid.uuid4().hex[:8]


def tiny_spec() -> AdapterSpec:
    h, inter = TINY_CONFIG["hidden_size"], TINY_CONFIG["intermediate_size"]
    q, kv = TINY_CONFIG["num_attention_heads"] * 16, TINY_CONFIG["num_key_value_heads"] * 16
    return AdapterSpec(TINY_CONFIG["num_hidden_layers"], linear_shapes(h, inter, q, kv), 16, TINY_BASE_HASH)


class Records:
    """adapter_id -> its record, as the registry would answer."""

    def __init__(self) -> None:
        self.records: dict[str, AdapterRecord] = {}

    async def get(self, adapter_id: str) -> AdapterRecord:
        if adapter_id not in self.records:
            raise AdapterNotRegisteredError(f"no ready adapter {adapter_id!r}")
        return self.records[adapter_id]


async def upload(
    s3: Any,
    peft_dir: Path,
    adapter_id: str,
    records: Records,
    base_model_hash: str = TINY_BASE_HASH,
    target_modules: tuple[str, ...] = tuple(TARGETS),
) -> AdapterRecord:
    """Put the adapter's files in the real store under a fresh prefix and record where they are."""
    key = f"tests/{RUN}/{adapter_id}-{uuid.uuid4().hex[:6]}"
    checksum = await upload_peft_dir(s3, peft_dir, BUCKET, key)
    record = AdapterRecord(
        adapter_id, f"s3://{BUCKET}/{key}", digest_of(checksum), base_model_hash, target_modules
    )
    records.records[adapter_id] = record
    return record


def tiny_gpu(spec: AdapterSpec, slots: int = 2) -> GpuTier:
    layers = lora_layers(
        {
            (layer, name): nn.Linear(i, o, bias=False)
            for layer in range(spec.num_layers)
            for name, (i, o) in spec.shapes.items()
        },
        {8: slots},
    )
    return GpuTier(layers, {8: slots})


@dataclass
class ProxiedStore:
    proxy: FaultProxy
    s3: Any  # a client through the proxy
    direct: Any  # a client straight to the store (uploads)
    settings: PlatformSettings


@asynccontextmanager
async def proxied_store(
    platform: PlatformSettings, read_timeout_s: float = 1.0
) -> AsyncIterator[ProxiedStore]:
    """A fault proxy in front of the real S3, a client through it (short read timeout) and a direct one."""
    proxy = FaultProxy(platform.s3_endpoint)
    url = await proxy.start()
    through = platform.model_copy(update={"s3_endpoint": url, "s3_read_timeout_s": read_timeout_s})
    try:
        async with async_client(through) as s3, async_client(platform) as direct:
            yield ProxiedStore(proxy, s3, direct, through)
    finally:
        await proxy.stop()


def cache_over(
    store: ProxiedStore,
    records: Records,
    cache_dir: Path,
    policy: FetchPolicy,
    slots: int = 2,
    ram_bytes: int = 1 << 30,
) -> AdapterCache:
    """The replica's cache over the proxied store: `slots` GPU slots, ram_bytes of host RAM."""
    spec = tiny_spec()
    gpu = tiny_gpu(spec, slots)
    return adapter_cache(
        spec, gpu, {}, cache_dir, 1 << 30, ram_bytes, s3=store.s3, registry=records, policy=policy
    )


def partial_files(cache_dir: Path) -> list[Path]:
    """Files of the disk tier that are not whole entries (anything under or named `.partial`)."""
    return [
        p
        for p in cache_dir.rglob("*")
        if p.is_file() and any(part.endswith(".partial") for part in p.relative_to(cache_dir).parts)
    ]
