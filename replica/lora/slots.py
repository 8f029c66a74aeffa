"""Slot table: which adapter sits in which GPU slot, with reference counts and LRU eviction of idle adapters.

Pure state, no torch. An adapter's id (a stable string) and its slot (a row of a rank bucket's stacked
tensors) are different things: SlotRef names a slot, adapter_id names an adapter, and the table maps one
to the other in both directions. Only adapters with no running request (ref_count 0) are ever evicted.

place() costs O(log S), not a scan of the S slots (the fleet simulator places millions of times): each
bucket keeps its free rows in a min-heap (the lowest free row first, as a scan would find) and its idle
adapters in a min-heap by (last_used, insertion order), the order a scan's min() breaks ties in. Heap items
go stale when their adapter is pinned, used again or dropped; a pop skips them, and the heap is rebuilt when
stale items outnumber the entries.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

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
    seq: int = field(default=0, compare=False, repr=False)  # insertion order: LRU ties go to the older


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
        self._free: dict[int, list[int]] = {b: list(range(n)) for b, n in self.capacities.items()}
        self._idle: dict[int, list[tuple[float, int, str]]] = {b: [] for b in self.capacities}
        self._seq = 0

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

    def __len__(self) -> int:
        return len(self._by_id)

    def adapter_ids(self) -> list[str]:
        return list(self._by_id)

    def can_place(self, rank: int) -> bool:
        """True when place() would succeed: a free slot, or an idle adapter to evict, in rank's bucket."""
        bucket = self.bucket_for_rank(rank)
        return bool(self._free[bucket]) or self._lru_idle(bucket) is not None

    def place(self, adapter_id: str, rank: int, now: float) -> Placement:
        """Give a non-resident adapter a slot: the lowest free one, else the least recently used idle one."""
        if adapter_id in self._by_id:
            raise ValueError(f"adapter {adapter_id!r} is already resident")
        bucket = self.bucket_for_rank(rank)
        free = self._free[bucket]
        if free:
            ref = SlotRef(bucket, heapq.heappop(free))
            self._insert(adapter_id, ref, now)
            return Placement(ref, None)
        victim = self._lru_idle(bucket)
        if victim is None:
            raise NoFreeSlotError(
                f"all {self.capacities[bucket]} rank-{bucket} slots hold running adapters", rank=rank
            )
        heapq.heappop(self._idle[bucket])
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
        if entry.ref_count == 0:
            self._push_idle(entry)

    def remove(self, adapter_id: str) -> SlotRef:
        """Free an idle adapter's slot (explicit unload)."""
        entry = self._require(adapter_id)
        if entry.ref_count > 0:
            raise AdapterInUseError(f"adapter {adapter_id!r} has {entry.ref_count} running requests")
        self._drop(entry)
        heapq.heappush(self._free[entry.ref.bucket], entry.ref.index)
        return entry.ref

    def _require(self, adapter_id: str) -> SlotEntry:
        entry = self._by_id.get(adapter_id)
        if entry is None:
            raise AdapterNotFoundError(f"adapter {adapter_id!r} is not in a GPU slot")
        return entry

    def _insert(self, adapter_id: str, ref: SlotRef, now: float) -> None:
        self._seq += 1
        entry = SlotEntry(adapter_id, ref, 0, now, self._seq)
        self._by_id[adapter_id] = entry
        self._by_slot[ref] = adapter_id
        self._push_idle(entry)

    def _push_idle(self, entry: SlotEntry) -> None:
        """Called when entry becomes idle (placed, or its last pin released)."""
        bucket = entry.ref.bucket
        heap = self._idle[bucket]
        if len(heap) <= 2 * len(self._by_id) + 16:
            heapq.heappush(heap, (entry.last_used, entry.seq, entry.adapter_id))
            return
        # mostly stale items: rebuild from the bucket's idle entries (entry among them)
        heap[:] = [
            (e.last_used, e.seq, e.adapter_id)
            for e in self._by_id.values()
            if e.ref_count == 0 and e.ref.bucket == bucket
        ]
        heapq.heapify(heap)

    def _lru_idle(self, bucket: int) -> SlotEntry | None:
        """The bucket's least recently used idle entry (its item left on top of the heap); None if all run."""
        heap = self._idle[bucket]
        while heap:
            last_used, seq, adapter_id = heap[0]
            entry = self._by_id.get(adapter_id)
            if entry is not None and (entry.seq, entry.ref_count, entry.last_used) == (seq, 0, last_used):
                return entry
            heapq.heappop(heap)  # stale: the adapter was pinned, used since, or dropped
        return None

    def _drop(self, entry: SlotEntry) -> None:
        del self._by_id[entry.adapter_id]
        del self._by_slot[entry.ref]
