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
