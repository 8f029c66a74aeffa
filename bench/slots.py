"""Adapter folders into GPU slots through a replica's adapter cache, before a benchmark times anything.

The cache is the one a replica opens for its configured folders (file:// records, no registry), so every
slot is written by the production path: sha256, validation and packing, the metadata checks, GpuTier.
"""

from __future__ import annotations

from pathlib import Path

from replica.adapter_cache.cache import AdapterCache
from replica.adapter_cache.disk import DiskTier
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.host import HostTier
from replica.adapter_cache.local_source import LocalRecords
from replica.adapter_cache.object_store import ObjectStore
from replica.lora.spec import AdapterSpec

BUDGET_BYTES = 16 << 30  # the RAM and disk tiers' caps (never allocated up front)


async def own_in_slots(spec: AdapterSpec, gpu: GpuTier, adapters: dict[str, Path], cache_dir: Path) -> None:
    """Load each adapter (adapter_id -> PEFT folder) into a slot, in order, as a load command does."""
    local = LocalRecords(adapters)
    disk, ram = DiskTier(cache_dir, BUDGET_BYTES), HostTier(BUDGET_BYTES)
    cache = AdapterCache(spec, local, ObjectStore(None, local.roots), disk, ram, gpu)
    for adapter_id in adapters:
        await cache.own(adapter_id, "gpu")
