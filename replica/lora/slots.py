"""Slot table: which adapter sits in which GPU slot, with reference counts and LRU eviction of idle adapters.

Pure state, no torch. An adapter's id (a stable string) and its slot (a row of a rank bucket's stacked
tensors) are different things: SlotRef names a slot, adapter_id names an adapter, and the table maps one
to the other in both directions. Only adapters with no running request (ref_count 0) are ever evicted.
"""

from __future__ import annotations

from dataclasses import dataclass

from replica.errors import AdapterInUseError, AdapterNotFoundError, NoFreeSlotError


@dataclass(frozen=True, order=True)
class SlotRef:
    """A GPU slot: row `index` of the pool for rank bucket `bucket`."""

    bucket: int
    index: int


@dataclass
class SlotEntry:
    """One resident adapter."""

    adapter_id: str
    ref: SlotRef
    ref_count: int
    last_used: float


@dataclass(frozen=True)
class Placement:
    """Where place() put an adapter and which idle adapter, if any, it evicted to make room."""

    ref: SlotRef
    evicted: str | None


class SlotTable:
    """adapter_id -> {slot, ref_count, last_used} over several rank buckets of fixed capacity."""

    def __init__(self, capacities: dict[int, int]) -> None:
        self.capacities = dict(sorted(capacities.items()))
        self._by_id: dict[str, SlotEntry] = {}
        self._by_slot: dict[SlotRef, str] = {}
        self.evictions = 0

    def bucket_for_rank(self, rank: int) -> int:
        """Smallest bucket that holds this rank."""
        for bucket in self.capacities:
            if rank <= bucket:
                return bucket
        raise NoFreeSlotError(f"rank {rank} is larger than every bucket {list(self.capacities)}")

    def lookup(self, adapter_id: str) -> SlotEntry | None:
        return self._by_id.get(adapter_id)

    def adapter_at(self, ref: SlotRef) -> str | None:
        """The adapter whose weights are in this slot, or None if it is free."""
        return self._by_slot.get(ref)

    def entries(self) -> list[SlotEntry]:
        return list(self._by_id.values())

    def place(self, adapter_id: str, rank: int, now: float) -> Placement:
        """Give a non-resident adapter a slot: a free one, else the least recently used idle one."""
        if adapter_id in self._by_id:
            raise ValueError(f"adapter {adapter_id!r} is already resident")
        bucket = self.bucket_for_rank(rank)
        for index in range(self.capacities[bucket]):
            ref = SlotRef(bucket, index)
            if ref not in self._by_slot:
                self._insert(adapter_id, ref, now)
                return Placement(ref, None)
        idle = [e for e in self._by_id.values() if e.ref.bucket == bucket and e.ref_count == 0]
        if not idle:
            raise NoFreeSlotError(f"all {self.capacities[bucket]} rank-{bucket} slots hold running adapters")
        victim = min(idle, key=lambda e: e.last_used)
        self._drop(victim)
        self.evictions += 1
        self._insert(adapter_id, victim.ref, now)
        return Placement(victim.ref, victim.adapter_id)

    def pin(self, adapter_id: str, now: float) -> SlotRef:
        """A request starts using the adapter: it cannot be evicted until unpinned."""
        entry = self._require(adapter_id)
        entry.ref_count += 1
        entry.last_used = now
        return entry.ref

    def unpin(self, adapter_id: str, now: float) -> None:
        """A request using the adapter finished or was cancelled."""
        entry = self._require(adapter_id)
        if entry.ref_count <= 0:
            raise ValueError(f"adapter {adapter_id!r} unpinned more often than pinned")
        entry.ref_count -= 1
        entry.last_used = now

    def remove(self, adapter_id: str) -> SlotRef:
        """Free an idle adapter's slot (explicit unload)."""
        entry = self._require(adapter_id)
        if entry.ref_count > 0:
            raise AdapterInUseError(f"adapter {adapter_id!r} has {entry.ref_count} running requests")
        self._drop(entry)
        return entry.ref

    def _require(self, adapter_id: str) -> SlotEntry:
        entry = self._by_id.get(adapter_id)
        if entry is None:
            raise AdapterNotFoundError(f"adapter {adapter_id!r} is not in a GPU slot")
        return entry

    def _insert(self, adapter_id: str, ref: SlotRef, now: float) -> None:
        self._by_id[adapter_id] = SlotEntry(adapter_id, ref, 0, now)
        self._by_slot[ref] = adapter_id

    def _drop(self, entry: SlotEntry) -> None:
        del self._by_id[entry.adapter_id]
        del self._by_slot[entry.ref]
