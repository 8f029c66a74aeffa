"""GPU tier: the slot table plus the layers' slot arenas, with slot writes that never stall running rows.

A load reserves its slot under the lock (a free slot, or the least recently used idle adapter's), pinned
and not yet ready, then writes the weights with the lock released: a forward pass reads only the slots
of its rows, and no row holds a reserved slot. The layers' pools are views into one arena per rank bucket
(replica.lora.arena) and a RAM entry is packed in the arena's row layout, so a write is the row plan's few
runs (replica.adapter_cache.slot_copy): host-to-device copies on a side stream on CUDA, memmoves when the
arenas are in host memory. The scheduler pins through acquire/release (the AdapterPins protocol);
requests pin before admission too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

from replica.adapter_cache import slot_copy
from replica.adapter_cache.host import HostAdapter
from replica.errors import AdapterNotFoundError
from replica.lora.arena import SlotArena
from replica.lora.layers import LoraLinear
from replica.lora.row_layout import ModuleKey, RowLayout
from replica.lora.slots import SlotRef, SlotTable


def arenas_of(layers: dict[ModuleKey, LoraLinear]) -> dict[int, SlotArena]:
    """The arena behind every bucket's pools; ValueError unless all layers share one per bucket."""
    first = next(iter(layers.values()), None)
    if first is None:
        return {}
    arenas = {bucket: pool.arena for bucket, pool in first.pools.items()}
    for key, layer in layers.items():
        for bucket, pool in layer.pools.items():
            arena = arenas.get(bucket)
            if arena is None or pool.arena is not arena or key not in arena.layout.index:
                raise ValueError(
                    f"layer {key}'s rank-{bucket} pool is not in the shared arena: build the layers with "
                    "replica.lora.replace.lora_layers"
                )
    for bucket, arena in arenas.items():
        if len(arena.layout.modules) != len(layers):
            raise ValueError(f"the rank-{bucket} arena holds modules that are not among the layers")
    return arenas


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
        self._write_lock = threading.Lock()  # one slot write at a time (they share the copy engine)
        self._ready: set[str] = set()
        first = next(iter(layers.values()), None)
        self.device = first.base.weight.device if first is not None else torch.device("cpu")
        self.dtype = first.base.weight.dtype if first is not None else torch.float32
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.arenas = arenas_of(layers)

    def row_layout(self, rank: int) -> RowLayout:
        """The slot-row layout a RAM entry of this rank is packed in (its bucket's); NoFreeSlotError if no
        bucket holds the rank."""
        bucket = self.table.bucket_for_rank(rank)
        arena = self.arenas.get(bucket)
        return arena.layout if arena is not None else RowLayout(bucket, ())

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
        arena = self.arenas.get(ref.bucket)
        if arena is not None:
            with self._write_lock:
                arena.data[ref.index].zero_()
                arena.scales[ref.index].zero_()
        return True

    # slot writes

    def _write(self, ref: SlotRef, host: HostAdapter) -> None:
        arena = self.arenas.get(ref.bucket)
        if arena is None:
            return  # no adapted layers: nothing to write
        if host.bucket != ref.bucket:
            raise ValueError(f"{host.adapter_id!r} is packed for rank {host.bucket}, slot {ref} is not")
        plan = arena.layout.plan(host.targets)
        if host.flat.numel() != plan.numel or host.scales.numel() != plan.num_scales:
            raise ValueError(f"{host.adapter_id!r}'s buffer does not have its row plan's size")
        row, scales = arena.data[ref.index], arena.scales[ref.index]  # [row_numel], [num_modules]
        with self._write_lock:
            if self._stream is None:
                slot_copy.run_host(plan, row, scales, host.flat, host.scales)
                return
            with torch.cuda.stream(self._stream):
                slot_copy.run_device(plan, row, scales, host.flat, host.scales)
            self._stream.synchronize()
