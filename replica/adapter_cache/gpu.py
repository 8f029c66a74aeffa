"""GPU tier: the slot table plus the layers' slot arenas, with slot writes that never stall running rows.

A load reserves its slot under the lock (a free slot, or the least recently used idle adapter's), pinned
and not yet ready, then writes the weights with the lock released: a forward pass reads only the slots
of its rows, and no row holds a reserved slot. The layers' pools are views into one arena per rank bucket
(replica.lora.arena) and a RAM entry is packed in the arena's row layout, so a write is the row plan's few
runs (replica.adapter_cache.slot_copy): host-to-device copies on a side stream on CUDA, memmoves when the
arenas are in host memory. The engine pins through acquire/release and checks rows with adapter_in_slot
(the SlotPins protocol); requests pin before admission too.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from replica.adapter_cache import slot_copy
from replica.adapter_cache.host import HostAdapter
from replica.errors import AdapterNotFoundError
from replica.lora.arena import SlotArena
from replica.lora.layers import LoraLinear
from replica.lora.row_layout import ModuleKey, RowLayout, RowPlan
from replica.lora.slots import SlotRef, SlotTable


@dataclass
class SlotWrite:
    """A slot reserved by GpuTier.begin and being written; finish() or abort() ends it."""

    adapter_id: str
    ref: SlotRef
    evicted: str | None  # the idle adapter whose slot this is
    arena: SlotArena | None
    plan: RowPlan | None
    host: bool  # the arena is in host memory
    done: bool = False


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


class Loaded(NamedTuple):
    ref: SlotRef  # the slot that holds the adapter
    evicted: str | None  # the idle adapter evicted for it


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

    def can_place(self, rank: int) -> bool:
        """A slot of rank's bucket is free or holds an idle adapter (NoFreeSlotError: no bucket fits)."""
        with self.lock:
            return self.table.can_place(rank)

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

    def load(self, host: HostAdapter, hold: bool = False) -> Loaded:
        """Write host's weights into a slot. Blocking. With hold, the slot comes back pinned once (also when
        it was resident already), so no other load evicts it before the caller hands the pin on or
        release()s it."""
        with self.lock:
            if host.adapter_id in self._ready:
                entry = self.table.lookup(host.adapter_id)
                assert entry is not None  # a ready adapter holds its slot-table entry
                if hold:
                    self.table.pin(host.adapter_id, self.clock())
                return Loaded(entry.ref, None)
        write = self.begin(host.adapter_id, host.rank, host.bucket, host.targets)
        try:
            self.copy_span(write, host.flat, 0, host.flat.numel())
            self.finish(write, host, hold)
        except BaseException:
            self.abort(write)
            raise
        return Loaded(write.ref, write.evicted)

    def begin(self, adapter_id: str, rank: int, bucket: int, targets: tuple[ModuleKey, ...]) -> SlotWrite:
        """Reserve a slot for an adapter of these modules (pinned, not ready) and zero what it will not
        write; then copy_span() its buffer in any number of spans, and finish() or abort(). Holds the write
        lock until then (one slot write at a time). NoFreeSlotError when every slot of the bucket runs;
        ValueError when the adapter is resident already or packed for another bucket."""
        if self.table.bucket_for_rank(rank) != bucket:
            raise ValueError(
                f"{adapter_id!r} is packed for rank {bucket}, its rank {rank} takes another bucket"
            )
        arena = self.arenas.get(bucket)
        plan = arena.layout.plan(targets) if arena is not None else None
        with self.lock:
            placement = self.table.place(adapter_id, rank, self.clock())  # NoFreeSlotError if full
            self.table.pin(adapter_id, self.clock())  # the loader's hold: not evictable while written
            if placement.evicted is not None:
                self._ready.discard(placement.evicted)
        write = SlotWrite(adapter_id, placement.ref, placement.evicted, arena, plan, self._stream is None)
        self._write_lock.acquire()
        try:
            with self._on_stream():
                if arena is not None and plan is not None:
                    row, scales = arena.data[write.ref.index], arena.scales[write.ref.index]
                    slot_copy.zero_gaps(plan, row, scales, write.host)
        except BaseException:
            self.abort(write)
            raise
        return write

    def copy_span(self, write: SlotWrite, flat: torch.Tensor, lo: int, hi: int) -> None:
        """Copy flat[lo:hi] (elements of the adapter's packed buffer) into the reserved slot."""
        if write.arena is None or write.plan is None:
            return
        if flat.dtype != self.dtype or not flat.is_contiguous():
            raise ValueError("the buffer must be contiguous, in the slot dtype")
        with self._on_stream():
            slot_copy.copy_span(write.plan, write.arena.data[write.ref.index], flat, lo, hi, write.host)

    def finish(self, write: SlotWrite, host: HostAdapter, hold: bool = False) -> None:
        """Write the scales, wait for the copies, and make the slot ready for requests; with hold, the
        write's pin stays (the caller release()s it)."""
        if write.arena is not None and write.plan is not None:
            plan, arena = write.plan, write.arena
            if host.flat.numel() != plan.numel or host.scales.numel() != plan.num_scales:
                raise ValueError(f"{host.adapter_id!r}'s buffer does not have its row plan's size")
            row, scales = arena.data[write.ref.index], arena.scales[write.ref.index]
            slot_copy.check(row, scales, host.flat, host.scales)
            with self._on_stream():
                slot_copy.copy_scales(plan, scales, host.scales, write.host)
            if self._stream is not None:
                self._stream.synchronize()
        self._write_lock.release()
        write.done = True
        with self.lock:
            if not hold:
                self.table.unpin(write.adapter_id, self.clock())
            self._ready.add(write.adapter_id)

    def abort(self, write: SlotWrite) -> None:
        """Give the reserved slot back (after a failed read or check); idempotent once finished."""
        if write.done:
            return
        write.done = True
        if self._stream is not None:
            self._stream.synchronize()
        if write.arena is not None:
            write.arena.data[write.ref.index].zero_()
            write.arena.scales[write.ref.index].zero_()
        self._write_lock.release()
        with self.lock:
            self.table.unpin(write.adapter_id, self.clock())
            self.table.remove(write.adapter_id)

    def remove(self, adapter_id: str) -> bool:
        """Free an idle adapter's slot (AdapterInUseError while it runs); False if it is not resident.

        The freed row keeps its bytes until the slot's next write, which rewrites all of it (the plan's
        copies and zeroed gaps cover the row); no request reaches a free slot, the table being the only
        map from requests to slots. Zeroing here could race a write already placed in the freed slot.
        """
        with self.lock:
            if self.table.lookup(adapter_id) is None or adapter_id not in self._ready:
                return False
            self.table.remove(adapter_id)
            self._ready.discard(adapter_id)
        return True

    # slot writes

    def _on_stream(self) -> contextlib.AbstractContextManager[object]:
        return torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
