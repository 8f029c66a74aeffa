"""SlotPins: what the engine needs from the slot manager (replica.adapter_cache.gpu.GpuTier implements it).

The scheduler pins an adapter's slot for each row it admits and unpins it when the row ends; before every
forward pass the engine asks which adapter each row's slot holds. Slot writes are not the engine's: an
adapter is in a slot before its request is queued (the adapter cache's acquire), so acquire only pins.
"""

from __future__ import annotations

from typing import Protocol

from replica.lora.slots import SlotRef


class SlotPins(Protocol):
    def acquire(self, adapter_id: str) -> SlotRef:
        """Pin the slot of an adapter that is in one; AdapterNotFoundError when it is not."""
        ...

    def release(self, adapter_id: str) -> None:
        """Unpin after a row finished or was cancelled."""
        ...

    def adapter_in_slot(self, ref: SlotRef) -> str | None:
        """The adapter whose weights the slot holds, or None when it holds none that is ready."""
        ...
