"""Requests waiting for a GPU slot sleep until a hold ends: no reads and no slot writes meanwhile."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from replica.errors import NoFreeSlotError
from tests.replica.adapter_cache.helpers import make_env

WOKEN_WITHIN_S = 0.2  # by the release itself, before the 0.25 s recheck


async def test_waiters_read_nothing_until_a_hold_ends_then_take_the_slot_at_once(tmp_path: Path) -> None:
    # one slot and RAM for one adapter: b and c, both waiting, evict each other's RAM entry, so a request
    # that retried on a timer would read its adapter from disk again on every try
    env = make_env(tmp_path, capacities={8: 1}, slot_wait_s=30.0)
    for seed, name in enumerate("abc"):
        env.add(name, seed=seed)
    held = await env.cache.acquire("a")
    nbytes = env.cache.host.lru.used
    env.cache.host.lru.budget = nbytes  # room for one adapter in RAM from here on
    waiters = {name: asyncio.create_task(env.cache.acquire(name)) for name in "bc"}
    await asyncio.sleep(1.0)  # four rechecks' worth
    assert not any(t.done() for t in waiters.values())
    reads = {name: len(env.loads("disk", name)) + len(env.loads("remote", name)) for name in "bc"}
    assert all(count <= 2 for count in reads.values()), reads  # a cold fetch's load events, then nothing

    released = time.monotonic()
    env.cache.release(held)
    first, _ = await asyncio.wait(waiters.values(), return_when=asyncio.FIRST_COMPLETED, timeout=5)
    assert len(first) == 1 and time.monotonic() - released < WOKEN_WITHIN_S
    lease = first.pop().result()
    env.cache.release(lease)
    other = next(t for t in waiters.values() if not t.done())
    env.cache.release(await asyncio.wait_for(other, 5))


async def test_a_waiter_still_gives_up_at_its_deadline(tmp_path: Path) -> None:
    env = make_env(tmp_path, capacities={8: 1}, slot_wait_s=0.3)
    env.add("a", seed=1)
    env.add("b", seed=2)
    held = await env.cache.acquire("a")
    start = time.monotonic()
    with pytest.raises(NoFreeSlotError):
        await env.cache.acquire("b")
    assert 0.3 <= time.monotonic() - start < 2.0
    env.cache.release(held)


async def test_a_waiter_takes_its_adapter_once_another_request_brought_it_into_a_slot(tmp_path: Path) -> None:
    # the bucket is full again at once (the other request's hold), but the waiter's adapter is resident
    env = make_env(tmp_path, capacities={8: 1}, slot_wait_s=3.0)
    env.add("a", seed=1)
    env.add("b", seed=2)
    await env.cache.own("b", "ram")
    held = await env.cache.acquire("a")
    waiter = asyncio.create_task(env.cache.acquire("b"))
    await asyncio.sleep(0.05)
    env.cache.release(held)
    other = asyncio.create_task(env.cache.acquire("b"))
    leases = await asyncio.wait_for(asyncio.gather(waiter, other), 1.0)
    assert {lease.ref for lease in leases} == {leases[0].ref} and env.cache.gpu.ref_count("b") == 2
    for lease in leases:
        env.cache.release(lease)
