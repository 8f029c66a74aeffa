"""LoraManager: the adapters a replica holds, in host RAM and in GPU slots, behind one lock.

The engine thread pins adapters for running requests; the server thread loads and unloads. A slot's
weights are written only while no request holds it (a free slot, or an idle adapter evicted LRU), so a
forward pass never reads a slot that is being rewritten.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from replica.errors import AdapterNotFoundError
from replica.lora.layers import LoraLinear
from replica.lora.slots import SlotRef, SlotTable
from replica.lora.weights import AdapterWeights, ModuleKey


class LoraManager:
    """Host cache (adapter_id -> validated weights) plus the slot table and the layers' slot pools."""

    def __init__(
        self,
        layers: dict[ModuleKey, LoraLinear],
        capacities: dict[int, int],
        host_capacity: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.layers = layers
        self.table = SlotTable(capacities)
        self.host: OrderedDict[str, AdapterWeights] = OrderedDict()
        self.host_capacity = host_capacity
        self.clock = clock
        self.lock = threading.RLock()
        self._eviction_times: deque[float] = deque()

    # tiers

    def tier(self, adapter_id: str) -> str | None:
        """'gpu' when in a slot, 'ram' when only in host memory, None when not held here."""
        with self.lock:
            if self.table.lookup(adapter_id) is not None:
                return "gpu"
            return "ram" if adapter_id in self.host else None

    def gpu_adapters(self) -> list[str]:
        with self.lock:
            return sorted(e.adapter_id for e in self.table.entries())

    def ram_adapters(self) -> list[str]:
        with self.lock:
            return sorted(self.host)

    def evictions_per_min(self) -> float:
        """Slot evictions in the last 60 seconds."""
        with self.lock:
            cutoff = self.clock() - 60.0
            while self._eviction_times and self._eviction_times[0] < cutoff:
                self._eviction_times.popleft()
            return float(len(self._eviction_times))

    # loading

    def add_to_host(self, weights: AdapterWeights) -> None:
        """Keep validated weights in host RAM (LRU bounded; adapters in GPU slots stay too)."""
        with self.lock:
            self.host[weights.adapter_id] = weights
            self.host.move_to_end(weights.adapter_id)
            while len(self.host) > self.host_capacity:
                oldest = next(iter(self.host))
                if oldest == weights.adapter_id:
                    break
                del self.host[oldest]

    def load(self, weights: AdapterWeights) -> SlotRef:
        """Put a validated adapter in host RAM and in a GPU slot (idempotent)."""
        with self.lock:
            self.add_to_host(weights)
            return self._ensure_gpu(weights.adapter_id)

    def unload(self, adapter_id: str) -> None:
        """Drop an idle adapter from its slot and from host RAM (AdapterInUseError while it runs)."""
        with self.lock:
            entry = self.table.lookup(adapter_id)
            if entry is None and adapter_id not in self.host:
                raise AdapterNotFoundError(f"adapter {adapter_id!r} is not loaded on this replica")
            if entry is not None:
                ref = self.table.remove(adapter_id)
                self._reset(ref)
            self.host.pop(adapter_id, None)

    # requests

    def acquire(self, adapter_id: str) -> SlotRef:
        """Pin the adapter for one request, copying it from host RAM into a slot if needed."""
        with self.lock:
            self._ensure_gpu(adapter_id)
            ref = self.table.pin(adapter_id, self.clock())
            # the security boundary: the row's slot must hold exactly the adapter it was admitted for
            assert self.table.adapter_at(ref) == adapter_id, f"slot {ref} does not hold {adapter_id}"
            return ref

    def release(self, adapter_id: str) -> None:
        """Unpin after a request finished or was cancelled."""
        with self.lock:
            self.table.unpin(adapter_id, self.clock())

    def adapter_in_slot(self, ref: SlotRef) -> str | None:
        with self.lock:
            return self.table.adapter_at(ref)

    # slot writes

    def _ensure_gpu(self, adapter_id: str) -> SlotRef:
        entry = self.table.lookup(adapter_id)
        if entry is not None:
            return entry.ref
        weights = self.host.get(adapter_id)
        if weights is None:
            raise AdapterNotFoundError(f"adapter {adapter_id!r} is not loaded on this replica")
        self.host.move_to_end(adapter_id)
        placement = self.table.place(adapter_id, weights.rank, self.clock())
        if placement.evicted is not None:
            self._eviction_times.append(self.clock())
        self._write(placement.ref, weights)
        return placement.ref

    def _write(self, ref: SlotRef, weights: AdapterWeights) -> None:
        for key, layer in self.layers.items():
            module = weights.modules.get(key)
            if module is None:
                layer.reset_slot(ref.bucket, ref.index)
            else:
                layer.set_slot(ref.bucket, ref.index, module.a, module.b, module.scale)

    def _reset(self, ref: SlotRef) -> None:
        for layer in self.layers.values():
            layer.reset_slot(ref.bucket, ref.index)
