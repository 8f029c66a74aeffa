"""Adapter folders into GPU slots through a replica's adapter cache, before a benchmark times anything.

The cache is Replica.start's (replica.adapter_cache.assemble) for its configured folders (file:// records,
no registry, no S3), so every slot is written by the production path: sha256, validation and packing, the
metadata checks, GpuTier.
"""

from __future__ import annotations

from pathlib import Path

from replica.adapter_cache.assemble import adapter_cache
from replica.adapter_cache.gpu import GpuTier
from replica.lora.spec import AdapterSpec

BUDGET_BYTES = 16 << 30  # the RAM and disk tiers' caps (never allocated up front)


async def own_in_slots(spec: AdapterSpec, gpu: GpuTier, adapters: dict[str, Path], cache_dir: Path) -> None:
    """Load each adapter (adapter_id -> PEFT folder) into a slot, in order, as a load command does."""
    cache = adapter_cache(spec, gpu, adapters, cache_dir, BUDGET_BYTES, BUDGET_BYTES)
    for adapter_id in adapters:
        await cache.own(adapter_id, "gpu")
