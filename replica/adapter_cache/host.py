"""Host-RAM tier: validated adapters, each packed in its rank bucket's slot-row layout, in one flat buffer.

An entry exists only after it passed every check (replica.adapter_cache.promote) and is never written
afterwards: holding one is the verdict, so RAM -> slot checks only its metadata (rank, base hash, modules).
The buffer is laid out as the slot row (replica.lora.row_layout) restricted to the modules the adapter
targets, each padded to the bucket's rank, so the copy into a slot is a few contiguous runs: one memcpy
(or one host-to-device transfer) when the adapter adapts every module at the bucket's rank. The price: an
adapter whose rank is below its bucket's is held padded (at most 2x for power-of-two buckets).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from replica.adapter_cache.lru import ByteLru
from replica.errors import AdapterTargetModuleError
from replica.lora.row_layout import ModuleKey, RowLayout, name_order

if TYPE_CHECKING:  # the slot code runs with torch alone; the adapter rules behind weights need more
    from replica.lora.weights import AdapterWeights


@dataclass(frozen=True)
class HostAdapter:
    """One validated adapter in host RAM.

    flat [numel] in the slot dtype: for each target module in row order, A [bucket, in_features] then
    B [out_features, bucket], zero past the module's rank; scales [num_targets] fp32, in the same order.
    """

    adapter_id: str
    digest: str
    rank: int  # the adapter's largest module rank
    bucket: int  # the rank bucket the buffer is padded to
    targets: tuple[ModuleKey, ...]  # in row order
    flat: torch.Tensor
    scales: torch.Tensor
    base_model_hash: str = ""  # the served base it was validated against

    @property
    def nbytes(self) -> int:
        return self.flat.nbytes + self.scales.nbytes

    def views(
        self, row: RowLayout, flat: torch.Tensor | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(A [bucket, in], B [out, bucket]) views of every target, into flat (default: this buffer)."""
        flat = self.flat if flat is None else flat
        out, cursor = [], 0
        for key in self.targets:
            _key, fan_in, fan_out = row.modules[row.index[key]]
            a = flat[cursor : cursor + self.bucket * fan_in].view(self.bucket, fan_in)
            cursor += self.bucket * fan_in
            b = flat[cursor : cursor + fan_out * self.bucket].view(fan_out, self.bucket)
            cursor += fan_out * self.bucket
            out.append((a, b))
        return out


def row_targets(keys: list[ModuleKey], row: RowLayout) -> tuple[ModuleKey, ...]:
    """The modules in row order; AdapterTargetModuleError for one this replica's slots do not hold."""
    unknown = sorted(k for k in keys if k not in row.index)
    if unknown:
        raise AdapterTargetModuleError(f"modules {unknown} are not adapted on this replica")
    return tuple(sorted(keys, key=name_order))


def pack(weights: AdapterWeights, digest: str, dtype: torch.dtype, pin: bool, row: RowLayout) -> HostAdapter:
    """Copy validated weights (converting to the slot dtype) into one buffer in row's layout."""
    if weights.rank > row.rank:
        raise ValueError(f"rank {weights.rank} does not fit the rank-{row.rank} row")
    targets = row_targets(list(weights.modules), row)
    numel = sum(row.module_numel(k) for k in targets)
    flat = torch.zeros(numel, dtype=dtype, pin_memory=pin)  # [numel]
    scales = torch.empty(len(targets), dtype=torch.float32, pin_memory=pin)  # [num_targets]
    host = HostAdapter(
        adapter_id=weights.adapter_id,
        digest=digest,
        rank=weights.rank,
        bucket=row.rank,
        targets=targets,
        flat=flat,
        scales=scales,
        base_model_hash=weights.base_model_hash,
    )
    for i, (key, (a, b)) in enumerate(zip(targets, host.views(row), strict=True)):
        lora = weights.modules[key]
        a[: lora.rank].copy_(lora.a)
        b[:, : lora.rank].copy_(lora.b)
        scales[i] = lora.scale
    return host


class HostTier:
    """adapter_id -> HostAdapter within a byte budget, LRU; adapters being copied to a slot are pinned."""

    def __init__(self, budget_bytes: int) -> None:
        self.lru: ByteLru[str] = ByteLru(budget_bytes, "host RAM")
        self._items: dict[str, HostAdapter] = {}
        self.lock = threading.Lock()

    def __contains__(self, adapter_id: object) -> bool:
        with self.lock:
            return adapter_id in self._items

    def get(self, adapter_id: str) -> HostAdapter | None:
        with self.lock:
            item = self._items.get(adapter_id)
            if item is not None:
                self.lru.touch(adapter_id)
            return item

    def get_pinned(self, adapter_id: str) -> HostAdapter | None:
        """Get and pin in one step, so it cannot be evicted while it is copied to a slot."""
        with self.lock:
            item = self._items.get(adapter_id)
            if item is not None:
                self.lru.touch(adapter_id)
                self.lru.pin(adapter_id)
            return item

    def unpin(self, adapter_id: str) -> None:
        with self.lock:
            if adapter_id in self.lru and self.lru.pins(adapter_id) > 0:
                self.lru.unpin(adapter_id)

    def put(self, item: HostAdapter, pinned: bool = False) -> list[str]:
        """Keep item; return the adapter ids evicted for room (TierFullError if all RAM is in use)."""
        with self.lock:
            evicted = self.lru.add(item.adapter_id, item.nbytes)
            for victim in evicted:
                del self._items[victim]
            self._items[item.adapter_id] = item
            if pinned:
                self.lru.pin(item.adapter_id)
            return evicted

    def remove(self, adapter_id: str) -> bool:
        with self.lock:
            self.lru.remove(adapter_id)
            return self._items.pop(adapter_id, None) is not None

    def adapter_ids(self) -> list[str]:
        with self.lock:
            return sorted(self._items)

    @property
    def used_bytes(self) -> int:
        return self.lru.used
