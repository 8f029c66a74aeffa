"""The production profile's slot counts hold a full batch of distinct adapters at once (tiny shapes, CPU)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from lorafleet.sizing import PRODUCTION
from replica.adapter_cache.cache import Lease
from replica.errors import NoFreeSlotError
from tests.replica.adapter_cache.helpers import SPEC, Env, make_env, slot_holds

BATCH = 32  # the brief's batch: 32 requests, each for another adapter


def _production_env(tmp_path: Path) -> Env:
    env = make_env(
        tmp_path, capacities=dict(PRODUCTION.lora_slots), slot_wait_s=0.2, spec=replace(SPEC, max_rank=64)
    )
    assert env.cache.gpu.table.capacities == {16: 250, 32: 8, 64: 4}
    return env


async def _fill_with_idle(env: Env, bucket: int, count: int) -> set[str]:
    """count idle adapters in the bucket's slots (the replica's steady state: every slot taken)."""
    ids = [f"idle-{bucket}-{i}" for i in range(count)]
    for n, adapter_id in enumerate(ids):
        env.add(adapter_id, seed=10_000 + bucket * 1_000 + n, rank=bucket)
    for adapter_id in ids:
        await env.cache.own(adapter_id, "gpu")
    return set(ids)


def _all_held_at_once(env: Env, leases: list[Lease], tensors: dict[str, dict]) -> None:
    assert len({lease.ref for lease in leases}) == len(leases)  # each its own slot
    for lease in leases:
        assert env.cache.gpu.ref_count(lease.adapter_id) == 1
        assert slot_holds(env.layers, lease.ref, tensors[lease.adapter_id])


async def test_32_distinct_rank_16_adapters_are_resident_and_pinned_together_on_the_production_slots(
    tmp_path: Path,
) -> None:
    """Every rank-16 slot already holds an idle adapter, so each of the 32 loads evicts one: only idle ones
    go, never one of the batch while the others load."""
    env = _production_env(tmp_path)
    idle = await _fill_with_idle(env, 16, PRODUCTION.lora_slots[16])
    batch = [f"batch-{i}" for i in range(BATCH)]
    tensors = {adapter_id: env.add(adapter_id, seed=i, rank=16) for i, adapter_id in enumerate(batch)}

    leases = await asyncio.wait_for(asyncio.gather(*(env.cache.acquire(a) for a in batch)), 120)

    _all_held_at_once(env, leases, tensors)
    assert {lease.ref.bucket for lease in leases} == {16}
    evicted = [e.adapter_id for e in env.evictions("gpu")]
    assert len(evicted) == BATCH and set(evicted) <= idle  # one idle adapter per load, no batch member
    assert all(sum(1 for e in env.loads("ram", a) if e.to_tier == "gpu") == 1 for a in batch)
    for lease in leases:
        env.cache.release(lease)
    assert all(env.cache.gpu.ref_count(a) == 0 for a in batch)


async def test_a_batch_with_8_rank_32_and_4_rank_64_adapters_alongside_fills_every_bucket_at_once(
    tmp_path: Path,
) -> None:
    """32 rank-16, 8 rank-32 and 4 rank-64 adapters requested together: all resident and pinned at once;
    the rank-32 and rank-64 buckets are then full, so one more of either rank waits and gets no slot."""
    env = _production_env(tmp_path)
    ranks = {16: BATCH, 32: PRODUCTION.lora_slots[32], 64: PRODUCTION.lora_slots[64]}
    batch = [(f"r{rank}-{i}", rank) for rank, count in ranks.items() for i in range(count)]
    tensors = {a: env.add(a, seed=n, rank=rank) for n, (a, rank) in enumerate(batch)}
    for rank in (32, 64):
        env.add(f"r{rank}-extra", seed=rank, rank=rank)

    leases = await asyncio.wait_for(asyncio.gather(*(env.cache.acquire(a) for a, _ in batch)), 120)

    _all_held_at_once(env, leases, tensors)
    by_bucket = {b: sum(1 for lease in leases if lease.ref.bucket == b) for b in ranks}
    assert by_bucket == ranks and env.evictions("gpu") == []
    for rank in (32, 64):
        with pytest.raises(NoFreeSlotError):
            await env.cache.acquire(f"r{rank}-extra")
    assert env.evictions("gpu") == []  # the extra requests evicted no running adapter
    for lease in leases:
        env.cache.release(lease)
    extra = await env.cache.acquire("r64-extra")  # a slot drained: the waiting rank now gets one
    assert extra.ref.bucket == 64
    env.cache.release(extra)
