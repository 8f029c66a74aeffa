"""Scheduler: pure admission logic (rows, token budget, adapter slots), no model involved."""

from __future__ import annotations

from replica.engine.kv_cache import RowAllocator
from replica.engine.sampler import SamplingParams
from replica.engine.scheduler import Scheduler
from replica.engine.sequence import Sequence, SequenceStatus
from replica.errors import AdapterNotFoundError
from replica.lora.slots import SlotRef, SlotTable


class TablePins:
    """AdapterPins over a plain SlotTable: known adapters take a slot on first use (rank 8)."""

    def __init__(self, capacities: dict[int, int], known: set[str]) -> None:
        self.table, self.known, self.now = SlotTable(capacities), known, 0.0

    def acquire(self, adapter_id: str) -> SlotRef:
        if adapter_id not in self.known:
            raise AdapterNotFoundError(adapter_id)
        if self.table.lookup(adapter_id) is None:
            self.table.place(adapter_id, 8, self.now)
        return self.table.pin(adapter_id, self.now)

    def release(self, adapter_id: str) -> None:
        self.table.unpin(adapter_id, self.now)


def _seq(rid: str, n: int = 4, adapter: str | None = None) -> Sequence:
    return Sequence(rid, list(range(n)), SamplingParams(), adapter)


def test_admits_up_to_max_num_seqs_and_rows() -> None:
    sched = Scheduler(2, 1000, RowAllocator(2), None)
    for i in range(3):
        sched.add(_seq(f"s{i}"))
    running, failed = sched.schedule()
    assert [s.request_id for s in running] == ["s0", "s1"] and not failed
    assert [s.request_id for s in sched.waiting] == ["s2"]
    sched.finish(running[0], "stop")
    running, _ = sched.schedule()
    assert [s.request_id for s in running] == ["s1", "s2"] and running[1].row == 0


def test_prompt_token_budget_limits_new_prefills_per_step() -> None:
    sched = Scheduler(8, 10, RowAllocator(8), None)
    sched.add(_seq("big", 30))  # larger than the budget: admitted alone so it can ever run
    sched.add(_seq("a", 6))
    running, _ = sched.schedule()
    assert [s.request_id for s in running] == ["big"]
    running, _ = sched.schedule()
    assert [s.request_id for s in running] == ["big", "a"]


def test_full_adapter_bucket_waits_without_blocking_others() -> None:
    pins = TablePins({8: 1}, {"x", "y"})
    sched = Scheduler(4, 1000, RowAllocator(4), pins)
    sched.add(_seq("r1", adapter="x"))
    sched.add(_seq("r2", adapter="y"))  # x holds the only slot while it runs
    sched.add(_seq("r3"))
    running, _ = sched.schedule()
    assert [s.request_id for s in running] == ["r1", "r3"] and [s.request_id for s in sched.waiting] == ["r2"]
    assert running[0].slot == SlotRef(8, 0) and pins.table.adapter_at(running[0].slot) == "x"
    sched.finish(running[0], "stop")
    running, _ = sched.schedule()
    assert [s.request_id for s in running] == ["r3", "r2"] and pins.table.adapter_at(running[1].slot) == "y"


def test_unknown_adapter_fails_admission_and_frees_nothing() -> None:
    rows = RowAllocator(2)
    sched = Scheduler(2, 1000, rows, TablePins({8: 1}, set()))
    sched.add(_seq("r1", adapter="missing"))
    running, failed = sched.schedule()
    assert not running and failed[0].finish_reason == "error" and rows.num_free == 2


def test_finish_releases_row_and_pin() -> None:
    pins = TablePins({8: 1}, {"x"})
    rows = RowAllocator(1)
    sched = Scheduler(1, 1000, rows, pins)
    sched.add(_seq("r1", adapter="x"))
    (seq,), _ = sched.schedule()
    sched.finish(seq, "abort")
    assert seq.status is SequenceStatus.FINISHED and rows.num_free == 1
    assert pins.table.lookup("x").ref_count == 0 and seq.row is None and seq.slot is None
