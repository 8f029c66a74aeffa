"""A replica's adapter cache over local PEFT folders: how tests put adapters in GPU slots.

The cache is Replica.start's (replica.adapter_cache.assemble) for the folders a replica is configured with
(file:// records, no registry, no S3), so every slot write takes the production path: the record and its
sha256, the fetch, validation and packing into a RAM entry, the metadata checks, the GpuTier write, and the
disk copy behind it.
"""

from __future__ import annotations

from pathlib import Path

from replica.adapter_cache.assemble import adapter_cache
from replica.adapter_cache.cache import AdapterCache
from replica.adapter_cache.gpu import GpuTier
from replica.lora.spec import AdapterSpec

RAM_BYTES = 1 << 30
DISK_BYTES = 1 << 30


def local_cache(spec: AdapterSpec, gpu: GpuTier, adapters: dict[str, Path], cache_dir: Path) -> AdapterCache:
    """The adapter cache of a replica serving these folders (adapter_id -> PEFT directory) through gpu."""
    return adapter_cache(spec, gpu, adapters, cache_dir, DISK_BYTES, RAM_BYTES)


async def own_in_slots(cache: AdapterCache, adapter_ids: list[str]) -> None:
    """Bring each adapter into a GPU slot, as a replica's load command does (AdapterCache.own)."""
    for adapter_id in adapter_ids:
        await cache.own(adapter_id, "gpu")
