"""Scheduler: admission logic (rows, token budget, adapter pins), no model involved.

The pins are a real GpuTier whose slots the adapter cache wrote (tests.replica.adapter_cache.helpers).
"""

from __future__ import annotations

from pathlib import Path

from replica.adapter_cache.gpu import GpuTier
from replica.engine.kv_cache import RowAllocator
from replica.engine.sampler import SamplingParams
from replica.engine.scheduler import Scheduler
from replica.engine.sequence import Sequence, SequenceStatus
from tests.replica.adapter_cache.helpers import make_env


async def _slots_holding(tmp_path: Path, adapter_ids: list[str]) -> GpuTier:
    """A GPU tier with these adapters in its rank-8 slots, each written through the adapter cache."""
    env = make_env(tmp_path, {8: 2})
    for seed, adapter_id in enumerate(adapter_ids):
        env.add(adapter_id, seed)
        await env.cache.own(adapter_id, "gpu")
    return env.cache.gpu


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


async def test_rows_of_one_adapter_share_its_slot_and_each_pins_it(tmp_path: Path) -> None:
    gpu = await _slots_holding(tmp_path, ["x", "y"])
    sched = Scheduler(4, 1000, RowAllocator(4), gpu)
    for rid, adapter in (("r1", "x"), ("r2", "y"), ("r3", "x"), ("r4", None)):
        sched.add(_seq(rid, adapter=adapter))
    running, failed = sched.schedule()
    assert [s.request_id for s in running] == ["r1", "r2", "r3", "r4"] and not failed
    assert running[0].slot == running[2].slot != running[1].slot and running[3].slot is None
    assert gpu.adapter_in_slot(running[0].slot) == "x" and gpu.adapter_in_slot(running[1].slot) == "y"
    assert gpu.ref_count("x") == 2 and gpu.ref_count("y") == 1
    sched.finish(running[0], "stop")
    assert gpu.ref_count("x") == 1


async def test_an_adapter_in_no_slot_fails_admission_and_frees_nothing(tmp_path: Path) -> None:
    rows = RowAllocator(2)
    sched = Scheduler(2, 1000, rows, await _slots_holding(tmp_path, ["x"]))
    sched.add(_seq("r1", adapter="missing"))
    sched.add(_seq("r2", adapter="x"))
    running, failed = sched.schedule()
    assert [s.request_id for s in running] == ["r2"] and rows.num_free == 1
    assert [s.request_id for s in failed] == ["r1"] and failed[0].finish_reason == "error"
    assert "missing" in failed[0].error and failed[0].row is None


async def test_finish_releases_row_and_pin(tmp_path: Path) -> None:
    gpu = await _slots_holding(tmp_path, ["x"])
    rows = RowAllocator(1)
    sched = Scheduler(1, 1000, rows, gpu)
    sched.add(_seq("r1", adapter="x"))
    (seq,), _ = sched.schedule()
    assert gpu.ref_count("x") == 1
    sched.finish(seq, "abort")
    assert seq.status is SequenceStatus.FINISHED and rows.num_free == 1
    assert gpu.ref_count("x") == 0 and seq.row is None and seq.slot is None
