"""Slot table: LRU eviction of idle adapters only, never of a running one; ids and slots stay a bijection."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replica.errors import AdapterInUseError, NoFreeSlotError
from replica.lora.slots import SlotRef, SlotTable


def test_adapter_goes_to_smallest_bucket_that_fits() -> None:
    table = SlotTable({8: 1, 16: 1, 32: 1})
    assert table.place("a", 8, now=0).ref == SlotRef(8, 0)
    assert table.place("b", 12, now=0).ref == SlotRef(16, 0)
    assert table.place("c", 17, now=0).ref == SlotRef(32, 0)
    with pytest.raises(NoFreeSlotError):
        table.bucket_for_rank(64)


def test_evicts_least_recently_used_idle_adapter() -> None:
    table = SlotTable({8: 2})
    table.place("a", 8, now=1)
    table.place("b", 8, now=2)
    table.pin("a", now=3)
    table.unpin("a", now=4)  # a is now more recent than b
    placement = table.place("c", 8, now=5)
    assert placement.evicted == "b" and table.adapter_at(placement.ref) == "c"
    assert table.lookup("b") is None and table.evictions == 1


def test_running_adapter_is_never_evicted() -> None:
    table = SlotTable({8: 2})
    table.place("a", 8, now=0)
    table.place("b", 8, now=1)
    table.pin("a", now=2)
    table.pin("b", now=3)
    with pytest.raises(NoFreeSlotError):
        table.place("c", 8, now=4)
    table.unpin("b", now=5)
    assert table.place("c", 8, now=6).evicted == "b"
    assert table.lookup("a") is not None


def test_unload_of_running_adapter_is_refused() -> None:
    table = SlotTable({8: 1})
    table.place("a", 8, now=0)
    table.pin("a", now=0)
    with pytest.raises(AdapterInUseError):
        table.remove("a")
    table.unpin("a", now=1)
    assert table.remove("a") == SlotRef(8, 0)


ops = st.lists(
    st.tuples(
        st.sampled_from(["place", "pin", "unpin", "remove"]), st.integers(0, 7), st.sampled_from([4, 8, 16])
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_invariants_hold_under_any_sequence(steps: list[tuple[str, int, int]]) -> None:
    table = SlotTable({8: 2, 16: 1})
    pins: dict[str, int] = {}
    for t, (op, n, rank) in enumerate(steps):
        aid = f"ad{n}"
        try:
            if op == "place" and table.lookup(aid) is None:
                evicted = table.place(aid, rank, now=t).evicted
                assert evicted is None or pins.get(evicted, 0) == 0
                pins.pop(evicted, None)
            elif op == "pin" and table.lookup(aid) is not None:
                table.pin(aid, now=t)
                pins[aid] = pins.get(aid, 0) + 1
            elif op == "unpin" and pins.get(aid, 0) > 0:
                table.unpin(aid, now=t)
                pins[aid] -= 1
            elif op == "remove" and table.lookup(aid) is not None:
                table.remove(aid)
                pins.pop(aid, None)
        except (NoFreeSlotError, AdapterInUseError):
            pass
        for aid2, count in pins.items():  # every pinned adapter is resident with its count
            if count:
                entry = table.lookup(aid2)
                assert entry is not None and entry.ref_count == count
        refs = [e.ref for e in table.entries()]
        assert len(refs) == len(set(refs))
        assert all(table.adapter_at(e.ref) == e.adapter_id for e in table.entries())


class ScanTable:
    """The table's contract as a scan: the lowest free row, else the idle adapter with the oldest last_used
    (ties: the one placed first)."""

    def __init__(self, capacities: dict[int, int]) -> None:
        self.capacities = capacities
        self.rows: dict[str, list] = {}  # adapter -> [ref, ref_count, last_used, placed order]
        self.placed = 0

    def place(self, adapter_id: str, bucket: int, now: float) -> tuple[SlotRef, str | None] | None:
        taken = {row[0] for row in self.rows.values()}
        free = [SlotRef(bucket, i) for i in range(self.capacities[bucket]) if SlotRef(bucket, i) not in taken]
        idle = [(row[2], row[3], a) for a, row in self.rows.items() if row[0].bucket == bucket and not row[1]]
        if free:
            ref, evicted = free[0], None
        elif idle:
            evicted = min(idle)[2]
            ref = self.rows.pop(evicted)[0]
        else:
            return None
        self.placed += 1
        self.rows[adapter_id] = [ref, 0, now, self.placed]
        return ref, evicted


scan_ops = st.lists(
    st.tuples(
        st.sampled_from(["place", "place", "pin", "unpin", "unpin", "remove"]),
        st.integers(0, 9),
        st.sampled_from([8, 16]),
        st.integers(-1, 3),  # small steps, some back in time: many ties in last_used
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(scan_ops)
def test_place_picks_the_slot_and_victim_a_full_scan_would(steps: list[tuple[str, int, int, int]]) -> None:
    # the free rows and the idle LRU heap (with stale items and rebuilds) must pick the scan's slot and victim
    table, scan = SlotTable({8: 3, 16: 2}), ScanTable({8: 3, 16: 2})
    now = 0.0
    for op, n, rank, dt in steps:
        now += dt
        aid = f"ad{n}"
        row = scan.rows.get(aid)
        if op == "place" and row is None:
            want = scan.place(aid, table.bucket_for_rank(rank), now)
            assert table.can_place(rank) == (want is not None)
            if want is None:
                with pytest.raises(NoFreeSlotError):
                    table.place(aid, rank, now)
            else:
                got = table.place(aid, rank, now)
                assert (got.ref, got.evicted) == want
        elif op == "pin" and row is not None:
            table.pin(aid, now)
            row[1], row[2] = row[1] + 1, now
        elif op == "unpin" and row is not None and row[1]:
            table.unpin(aid, now)
            row[1], row[2] = row[1] - 1, now
        elif op == "remove" and row is not None and not row[1]:
            assert table.remove(aid) == scan.rows.pop(aid)[0]
        assert len(table) == len(scan.rows)
        assert {e.adapter_id: (e.ref, e.ref_count) for e in table.entries()} == {
            a: (r[0], r[1]) for a, r in scan.rows.items()
        }


def test_idle_heap_stays_bounded_under_pin_churn() -> None:
    table = SlotTable({8: 2})
    table.place("a", 8, now=0)
    table.place("b", 8, now=0)
    for t in range(1, 1000):
        table.pin("a", now=t)
        table.unpin("a", now=t)
    assert len(table._idle[8]) <= 2 * len(table) + 17
    assert table.place("c", 8, now=1000).evicted == "b"
