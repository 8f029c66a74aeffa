"""The adapter cache a replica serves from: its configured folders first, then the registry, over GpuTier.

Replica.start, the tests and the benchmarks all build the cache here, so each of them drives the same
construction: file:// records for the configured folders (FirstFound asks them before the registry), an
ObjectStore that reads those folders and, given an S3 client, the bucket, a disk tier and a RAM tier.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lorafleet.fetch_retry import FetchPolicy
from replica.adapter_cache.cache import (
    COLD_LOADS_PER_TENANT,
    COLD_LOADS_TOTAL,
    FAILURE_TTL_S,
    AdapterCache,
)
from replica.adapter_cache.disk import DiskTier
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.host import HostTier
from replica.adapter_cache.local_source import FirstFound, LocalRecords, RecordSource
from replica.adapter_cache.object_store import ObjectStore
from replica.adapter_cache.tier import CacheEvent
from replica.lora.spec import AdapterSpec


def adapter_cache(
    spec: AdapterSpec,
    gpu: GpuTier,
    adapter_dirs: dict[str, Path],
    cache_dir: Path,
    disk_budget_bytes: int,
    ram_budget_bytes: int,
    *,
    s3: Any | None = None,
    registry: RecordSource | None = None,
    on_event: Callable[[CacheEvent], None] = lambda _e: None,
    policy: FetchPolicy | None = None,
    cold_loads_per_tenant: int = COLD_LOADS_PER_TENANT,
    cold_loads_total: int = COLD_LOADS_TOTAL,
    failure_ttl_s: float = FAILURE_TTL_S,
) -> AdapterCache:
    """The cache over gpu for these folders (adapter_id -> PEFT directory), then registry when given.

    s3 is an open aioboto3 client (None: file:// weights only); the caller owns it and the registry.
    policy bounds each download from it (lorafleet.fetch_retry; its defaults when None)."""
    local = LocalRecords(adapter_dirs)
    sources: list[RecordSource] = [local] if registry is None else [local, registry]
    return AdapterCache(
        spec,
        FirstFound(sources),
        ObjectStore(s3, local.roots, policy),
        DiskTier(cache_dir, disk_budget_bytes),
        HostTier(ram_budget_bytes),
        gpu,
        on_event=on_event,
        cold_loads_per_tenant=cold_loads_per_tenant,
        cold_loads_total=cold_loads_total,
        failure_ttl_s=failure_ttl_s,
    )
