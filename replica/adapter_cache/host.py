"""Host-RAM tier: validated adapters packed into one flat (pinned, when a GPU is present) buffer each.

An entry exists only after it passed every check (replica.adapter_cache.promote) and is never written
afterwards: holding one is the verdict, so RAM -> slot checks only its metadata (rank, base hash, shapes).
Packing once at promotion means the copy into a GPU slot is one host-to-device transfer of the same bytes,
followed by device-side copies into the slot views (replica.adapter_cache.gpu).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cached_property

import torch

from replica.adapter_cache.lru import ByteLru
from replica.lora.weights import AdapterWeights, ModuleKey


@dataclass(frozen=True)
class PackedModule:
    """Where one adapted linear's A [rank, in_features] and B [out_features, rank] sit in the flat buffer."""

    key: ModuleKey
    rank: int
    a_offset: int
    a_shape: tuple[int, int]
    b_offset: int
    b_shape: tuple[int, int]


@dataclass(frozen=True)
class HostAdapter:
    """One validated adapter in host RAM: flat [numel] in the slot dtype, scales [num_modules] fp32."""

    adapter_id: str
    digest: str
    rank: int
    flat: torch.Tensor
    scales: torch.Tensor
    modules: tuple[PackedModule, ...]
    base_model_hash: str = ""  # the served base it was validated against

    @property
    def nbytes(self) -> int:
        return self.flat.nbytes + self.scales.nbytes

    @property
    def layout(self) -> tuple[tuple[ModuleKey, int], ...]:
        """The shape signature: which modules, at which rank; adapters sharing it share slot-copy plans."""
        return tuple((m.key, m.rank) for m in self.modules)

    @cached_property
    def signature(self) -> tuple[tuple[tuple[ModuleKey, int], ...], tuple[tuple[int, int], ...]]:
        """Layout plus where each A and B sit: adapters sharing it share one slot-copy plan per slot."""
        return self.layout, tuple((m.a_offset, m.b_offset) for m in self.modules)

    @cached_property
    def chunk_sizes(self) -> list[int]:
        """The numel of every A and B in buffer order: flat.split(chunk_sizes) gives one view per tensor."""
        return [n for _, n in self.chunks]

    @cached_property
    def chunk_order(self) -> dict[int, int]:
        """Buffer offset of a tensor -> its index in flat.split(chunk_sizes)."""
        return {offset: j for j, (offset, _) in enumerate(self.chunks)}

    @cached_property
    def chunks(self) -> list[tuple[int, int]]:
        """(offset, numel) of every A and B, in buffer order; they tile the buffer."""
        spans = [(m.a_offset, m.a_shape[0] * m.a_shape[1]) for m in self.modules]
        spans += [(m.b_offset, m.b_shape[0] * m.b_shape[1]) for m in self.modules]
        spans.sort()
        assert all(o == p + n for (p, n), (o, _) in zip(spans, spans[1:], strict=False)), "tensors must tile"
        assert spans[0][0] == 0 and spans[-1][0] + spans[-1][1] == self.flat.numel(), "tensors must tile"
        return spans

    def views(self, flat: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(A, B) views for every module into `flat` (this buffer or a device copy of it)."""
        out = []
        for m in self.modules:
            a = flat[m.a_offset : m.a_offset + m.a_shape[0] * m.a_shape[1]].view(m.a_shape)
            b = flat[m.b_offset : m.b_offset + m.b_shape[0] * m.b_shape[1]].view(m.b_shape)
            out.append((a, b))
        return out


def pack(weights: AdapterWeights, digest: str, dtype: torch.dtype, pin: bool) -> HostAdapter:
    """Copy validated weights (converting to the slot dtype) into one contiguous buffer."""
    modules: list[PackedModule] = []
    offset = 0
    for key in sorted(weights.modules):
        lora = weights.modules[key]
        a_shape, b_shape = tuple(lora.a.shape), tuple(lora.b.shape)
        a_off, offset = offset, offset + a_shape[0] * a_shape[1]
        b_off, offset = offset, offset + b_shape[0] * b_shape[1]
        modules.append(PackedModule(key, a_shape[0], a_off, a_shape, b_off, b_shape))  # type: ignore[arg-type]
    flat = torch.empty(offset, dtype=dtype, pin_memory=pin)  # [numel]
    scales = torch.empty(len(modules), dtype=torch.float32, pin_memory=pin)  # [num_modules]
    host = HostAdapter(
        weights.adapter_id, digest, weights.rank, flat, scales, tuple(modules), weights.base_model_hash
    )
    for i, (m, (a, b)) in enumerate(zip(modules, host.views(flat), strict=True)):
        lora = weights.modules[m.key]
        a.copy_(lora.a)
        b.copy_(lora.b)
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
