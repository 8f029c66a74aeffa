"""GPU tier: the slot table plus the layers' slot pools, with slot writes that never stall running rows.

A load reserves its slot under the lock (a free slot, or the least recently used idle adapter's), pinned
and not yet ready, then writes the weights with the lock released: a forward pass reads only the slots
of its rows, and no row holds a reserved slot. On CUDA the write runs on a side stream: one host-to-device
copy of the packed buffer into a staging tensor, then batched device copies into the slot views
(one foreach copy for all pools, with slot-view plans cached per (slot, signature)). When the pools are in
host memory (CPU), the same plan runs as memmoves (replica.adapter_cache.slot_copy): torch's per-op cost
over ~630 small copies would otherwise match the cost of the bytes.
The scheduler pins through acquire/release (the AdapterPins protocol); requests pin before admission too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

from replica.adapter_cache import slot_copy
from replica.adapter_cache.host import HostAdapter
from replica.errors import AdapterNotFoundError
from replica.lora.layers import LoraLinear
from replica.lora.slots import SlotRef, SlotTable
from replica.lora.weights import ModuleKey

PlanKey = tuple[SlotRef, tuple[tuple[tuple[ModuleKey, int], ...], tuple[tuple[int, int], ...]]]
Plan = tuple[
    list[torch.Tensor], list[torch.Tensor], list[tuple[int, tuple[int, int] | None]], list[torch.Tensor]
]
MAX_PLANS = 4096


class GpuTier:
    """adapter_id -> slot, for adapters whose weights are fully written ("ready")."""

    def __init__(
        self,
        layers: dict[ModuleKey, LoraLinear],
        capacities: dict[int, int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.layers = layers
        self.table = SlotTable(capacities)
        self.clock = clock
        self.lock = threading.RLock()  # the table; held only for bookkeeping, never across a copy
        self._write_lock = threading.Lock()  # one slot write at a time (they share the staging buffer)
        self._ready: set[str] = set()
        first = next(iter(layers.values()), None)
        self.device = first.base.weight.device if first is not None else torch.device("cpu")
        self.dtype = first.base.weight.dtype if first is not None else torch.float32
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._staging: torch.Tensor | None = None
        self._plans: dict[PlanKey, Plan | slot_copy.BytePlan] = {}

    # the scheduler's side (engine thread)

    def acquire(self, adapter_id: str) -> SlotRef:
        """Pin a ready adapter for one running row."""
        with self.lock:
            if adapter_id not in self._ready:
                raise AdapterNotFoundError(f"adapter {adapter_id!r} is not in a GPU slot")
            ref = self.table.pin(adapter_id, self.clock())
            # the security boundary: the row's slot must hold exactly the adapter it was admitted for
            assert self.table.adapter_at(ref) == adapter_id, f"slot {ref} does not hold {adapter_id}"
            return ref

    def release(self, adapter_id: str) -> None:
        with self.lock:
            self.table.unpin(adapter_id, self.clock())

    def adapter_in_slot(self, ref: SlotRef) -> str | None:
        with self.lock:
            name = self.table.adapter_at(ref)
            return name if name in self._ready else None

    # the cache's side

    def try_pin(self, adapter_id: str) -> SlotRef | None:
        """Pin if resident and ready (a request's hold from admission to its end); None otherwise."""
        with self.lock:
            if adapter_id not in self._ready:
                return None
            return self.table.pin(adapter_id, self.clock())

    def ref_count(self, adapter_id: str) -> int:
        with self.lock:
            entry = self.table.lookup(adapter_id)
            return entry.ref_count if entry is not None else 0

    def contains(self, adapter_id: str) -> bool:
        with self.lock:
            return adapter_id in self._ready

    def adapter_ids(self) -> list[str]:
        with self.lock:
            return sorted(self._ready)

    def load(self, host: HostAdapter) -> tuple[SlotRef, str | None]:
        """Write host's weights into a slot; return (slot, idle adapter evicted for it). Blocking."""
        with self.lock:
            if host.adapter_id in self._ready:
                return self.table.lookup(host.adapter_id).ref, None  # type: ignore[union-attr]
            placement = self.table.place(host.adapter_id, host.rank, self.clock())  # NoFreeSlotError if full
            self.table.pin(host.adapter_id, self.clock())  # the loader's hold: not evictable while written
            if placement.evicted is not None:
                self._ready.discard(placement.evicted)
        try:
            self._write(placement.ref, host)
        except BaseException:
            with self.lock:
                self.table.unpin(host.adapter_id, self.clock())
                self.table.remove(host.adapter_id)
            raise
        with self.lock:
            self.table.unpin(host.adapter_id, self.clock())
            self._ready.add(host.adapter_id)
        return placement.ref, placement.evicted

    def remove(self, adapter_id: str) -> bool:
        """Free an idle adapter's slot (AdapterInUseError while it runs); False if it is not resident."""
        with self.lock:
            if self.table.lookup(adapter_id) is None or adapter_id not in self._ready:
                return False
            ref = self.table.remove(adapter_id)
            self._ready.discard(adapter_id)
        for layer in self.layers.values():
            layer.reset_slot(ref.bucket, ref.index)
        return True

    # slot writes

    def _write(self, ref: SlotRef, host: HostAdapter) -> None:
        with self._write_lock:
            if self._stream is None:
                self._copy(ref, host, host.flat, host.scales)
                return
            with torch.cuda.stream(self._stream):
                flat = self._staging_for(host)
                flat.copy_(host.flat, non_blocking=True)  # the one host-to-device transfer
                scales = host.scales.to(self.device, non_blocking=True)
                self._copy(ref, host, flat, scales)
            self._stream.synchronize()

    def _staging_for(self, host: HostAdapter) -> torch.Tensor:
        n = host.flat.numel()
        if self._staging is None or self._staging.numel() < n:
            self._staging = torch.empty(n, dtype=self.dtype, device=self.device)
        return self._staging[:n]

    def _copy(self, ref: SlotRef, host: HostAdapter, flat: torch.Tensor, scales: torch.Tensor) -> None:
        # flat [numel] (slot dtype, on the slot device); scales [num_modules] fp32
        key: PlanKey = (ref, host.signature)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(ref, host)
            if self.device.type == "cpu":
                offsets = [offset for offset, _ in host.chunks]
                plan = slot_copy.build(*plan, offsets, host.flat.numel(), self.dtype)
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            self._plans[key] = plan
        if isinstance(plan, slot_copy.BytePlan):
            slot_copy.run(plan, flat, scales)
            return
        zeros, dsts, picks, scale_dsts = plan
        chunks = flat.split(host.chunk_sizes)  # one view per tensor, in buffer order
        srcs = [chunks[j] if shape is None else chunks[j].view(shape) for j, shape in picks]
        if zeros:
            torch._foreach_zero_(zeros)
        torch._foreach_copy_(dsts, srcs)
        torch._foreach_copy_(scale_dsts, list(scales.split(1)))

    def _plan(self, ref: SlotRef, host: HostAdapter) -> Plan:
        """Slot views to zero; slot views to fill, each with the buffer chunk (and shape) it takes; scales.

        The plan holds only slot views, so it is cached by (slot, signature) and reused for every adapter
        of that signature: the sources come from one split of the buffer per load. A contiguous destination
        takes a flat chunk; a padded one (rank below the bucket's) takes the chunk viewed in its shape.
        """
        zeros: list[torch.Tensor] = []
        dsts: list[torch.Tensor] = []
        picks: list[tuple[int, tuple[int, int] | None]] = []
        order = host.chunk_order
        i = ref.index
        by_key = {m.key: m for m in host.modules}
        for mkey, layer in self.layers.items():
            pool = layer.pools[ref.bucket]
            m = by_key.get(mkey)
            if m is None:
                zeros += [pool.a[i], pool.b[i], pool.scale[i : i + 1]]
                continue
            r = m.rank  # a [r, in_features]; b [out_features, r]
            for dst, offset, shape in (
                (pool.a[i, :r], m.a_offset, m.a_shape),
                (pool.b[i, :, :r], m.b_offset, m.b_shape),
            ):
                dsts.append(dst.view(-1) if dst.is_contiguous() else dst)
                picks.append((order[offset], None if dst.is_contiguous() else shape))
            if r < pool.rank:
                zeros += [pool.a[i, r:], pool.b[i, :, r:]]
        scale_dsts = [self.layers[m.key].pools[ref.bucket].scale[i : i + 1] for m in host.modules]
        return zeros, dsts, picks, scale_dsts
