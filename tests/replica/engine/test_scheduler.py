"""Scheduler: admission (rows, blocks, token budget, adapter pins), chunked prefill, prefix hits and
preemption; no model involved.

The pins are a real GpuTier whose slots the adapter cache wrote (tests.replica.adapter_cache.helpers).
"""

from __future__ import annotations

from pathlib import Path

from replica.adapter_cache.gpu import GpuTier
from replica.engine.admission_queue import make_queue
from replica.engine.sampler import SamplingParams
from replica.engine.scheduler import Scheduled, Scheduler
from replica.engine.sequence import Sequence, SequenceStatus
from replica.kv.block_hash import CacheScope
from replica.kv.blocks import BlockManager
from tests.replica.adapter_cache.helpers import make_env

BS = 4


async def _slots_holding(tmp_path: Path, adapter_ids: list[str]) -> GpuTier:
    """A GPU tier with these adapters in its rank-8 slots, each written through the adapter cache."""
    env = make_env(tmp_path, {8: 2})
    for seed, adapter_id in enumerate(adapter_ids):
        env.add(adapter_id, seed)
        await env.cache.own(adapter_id, "gpu")
    return env.cache.gpu


def _seq(rid: str, n: int = 4, adapter: str | None = None, tokens: list[int] | None = None) -> Sequence:
    seq = Sequence(rid, tokens or list(range(n)), SamplingParams(), adapter)
    seq.scope = CacheScope("base", adapter).digest()
    return seq


def _ids(plan: list[Scheduled]) -> list[str]:
    return [p.seq.request_id for p in plan]


def _run(sched: Scheduler, plan: list[Scheduled], token: int = 9) -> None:
    """What the engine does after a step: the K/V are computed, and completed rows get a new token."""
    for p in plan:
        completes = p.completes
        sched.computed(p)
        if completes:
            p.seq.output_token_ids.append(token)


def test_admits_up_to_max_num_seqs() -> None:
    sched = Scheduler(2, 1000, BlockManager(16, BS), None)
    for i in range(3):
        sched.add(_seq(f"s{i}"))
    plan, failed = sched.schedule()
    assert _ids(plan) == ["s0", "s1"] and not failed
    assert [s.request_id for s in sched.waiting] == ["s2"]
    sched.finish(plan[0].seq, "stop")
    _run(sched, plan[1:])
    plan, _ = sched.schedule()
    assert _ids(plan) == ["s1", "s2"] and [p.num_new for p in plan] == [1, 4]


def test_admission_waits_for_blocks_for_the_whole_prompt() -> None:
    sched = Scheduler(8, 1000, BlockManager(4, BS), None)
    sched.add(_seq("a", 9))  # three blocks
    sched.add(_seq("b", 8))  # two: only one is left
    plan, _ = sched.schedule()
    assert _ids(plan) == ["a"]
    sched.finish(plan[0].seq, "stop")
    plan, _ = sched.schedule()
    assert _ids(plan) == ["b"]
    sched.blocks.check()


def test_a_long_prompt_is_chunked_and_decoding_rows_run_every_step() -> None:
    sched = Scheduler(4, 6, BlockManager(16, BS), None)
    sched.add(_seq("short", 2))
    plan, _ = sched.schedule()
    _run(sched, plan)
    sched.add(_seq("long", 20))
    chunks = []
    for _ in range(5):
        plan, _ = sched.schedule()
        assert plan[0].seq.request_id == "short" and plan[0].num_new == 1  # decoding first, every step
        chunks += [p.num_new for p in plan if p.seq.request_id == "long"]
        assert sum(p.num_new for p in plan) <= 6
        _run(sched, plan)
    assert chunks == [5, 5, 5, 5, 1] and sched.running[1].num_cached == 21


def test_without_chunking_a_prompt_runs_whole_and_alone_when_over_budget() -> None:
    sched = Scheduler(8, 10, BlockManager(32, BS), None, chunked_prefill=False)
    sched.add(_seq("big", 30))  # larger than the budget: admitted alone so it can ever run
    sched.add(_seq("a", 6))
    plan, _ = sched.schedule()
    assert _ids(plan) == ["big"] and plan[0].num_new == 30
    _run(sched, plan)
    plan, _ = sched.schedule()
    assert _ids(plan) == ["big", "a"]


def test_a_prefix_hit_skips_the_cached_blocks_and_leaves_the_last_token_to_compute() -> None:
    sched = Scheduler(4, 1000, BlockManager(16, BS), None)
    prompt = list(range(100, 112))  # three full blocks
    sched.add(_seq("first", tokens=prompt))
    plan, _ = sched.schedule()
    _run(sched, plan)
    sched.add(_seq("again", tokens=prompt))
    plan, _ = sched.schedule()
    again = next(p for p in plan if p.seq.request_id == "again")
    assert again.seq.cached_tokens == 8 and again.num_new == 4  # two blocks hit, the last recomputed
    assert sched.counters.hits == 8 and sched.counters.queries == 24
    sched.add(_seq("other-adapter", adapter="v2", tokens=prompt))
    plan, _ = sched.schedule()
    other = next(p for p in plan if p.seq.request_id == "other-adapter")
    assert other.seq.cached_tokens == 0 and other.num_new == 12


def test_a_decoding_row_short_of_a_block_preempts_the_latest_admitted_and_nothing_is_lost() -> None:
    sched = Scheduler(4, 1000, BlockManager(4, BS), None, make_queue("fair", 4))
    sched.add(_seq("old", 4, tokens=[1, 2, 3, 4]))
    sched.add(_seq("new", 4, tokens=[5, 6, 7, 8]))
    for _ in range(10):  # one block each, then a second each: full; the next block needs a preemption
        plan, _ = sched.schedule()
        _run(sched, plan)
        if sched.counters.preemptions:
            break
    new = next(iter(sched.waiting))
    assert new.request_id == "new" and new.status is SequenceStatus.WAITING and new.num_cached == 0
    assert new.preemptions == 1 and [s.request_id for s in sched.running] == ["old"]
    assert len(new.output_token_ids) == 5 and sched.running[0].num_cached == 9
    sched.blocks.check()
    sched.finish(sched.running[0], "stop")
    hits = sched.counters.hits
    plan, _ = sched.schedule()
    # readmitted: its prompt block is still cached (the free list gave its newer block away first)
    assert _ids(plan) == ["new"] and plan[0].num_new == new.num_tokens - 4
    assert sched.counters.hits == hits + 4 and new.cached_tokens == 0
    sched.blocks.check()


async def test_rows_of_one_adapter_share_its_slot_and_each_pins_it(tmp_path: Path) -> None:
    gpu = await _slots_holding(tmp_path, ["x", "y"])
    sched = Scheduler(4, 1000, BlockManager(16, BS), gpu)
    for rid, adapter in (("r1", "x"), ("r2", "y"), ("r3", "x"), ("r4", None)):
        sched.add(_seq(rid, adapter=adapter))
    plan, failed = sched.schedule()
    seqs = [p.seq for p in plan]
    assert _ids(plan) == ["r1", "r2", "r3", "r4"] and not failed
    assert seqs[0].slot == seqs[2].slot != seqs[1].slot and seqs[3].slot is None
    assert gpu.adapter_in_slot(seqs[0].slot) == "x" and gpu.adapter_in_slot(seqs[1].slot) == "y"
    assert gpu.ref_count("x") == 2 and gpu.ref_count("y") == 1
    sched.finish(seqs[0], "stop")
    assert gpu.ref_count("x") == 1


async def test_a_preempted_row_keeps_its_pin_until_it_ends(tmp_path: Path) -> None:
    gpu = await _slots_holding(tmp_path, ["x"])
    sched = Scheduler(4, 1000, BlockManager(8, BS), gpu)
    sched.add(_seq("r1", 4, adapter="x"))
    (p,), _ = sched.schedule()
    sched.preempt(p.seq)
    assert gpu.ref_count("x") == 1 and sched.blocks.num_free == 8
    plan, _ = sched.schedule()  # readmitted: pinned once, not twice
    assert _ids(plan) == ["r1"] and gpu.ref_count("x") == 1
    sched.finish(plan[0].seq, "stop")
    assert gpu.ref_count("x") == 0


async def test_an_adapter_in_no_slot_fails_admission_and_frees_nothing(tmp_path: Path) -> None:
    sched = Scheduler(2, 1000, BlockManager(8, BS), await _slots_holding(tmp_path, ["x"]))
    sched.add(_seq("r1", adapter="missing"))
    sched.add(_seq("r2", adapter="x"))
    plan, failed = sched.schedule()
    assert _ids(plan) == ["r2"] and sched.blocks.num_free == 7
    assert [s.request_id for s in failed] == ["r1"] and failed[0].finish_reason == "error"
    assert "missing" in failed[0].error and "r1" not in sched.blocks.tables


async def test_finish_releases_blocks_and_pin(tmp_path: Path) -> None:
    gpu = await _slots_holding(tmp_path, ["x"])
    sched = Scheduler(1, 1000, BlockManager(4, BS), gpu)
    sched.add(_seq("r1", adapter="x"))
    (p,), _ = sched.schedule()
    assert gpu.ref_count("x") == 1
    sched.finish(p.seq, "abort")
    assert p.seq.status is SequenceStatus.FINISHED and sched.blocks.num_free == 4
    assert gpu.ref_count("x") == 0 and p.seq.slot is None
