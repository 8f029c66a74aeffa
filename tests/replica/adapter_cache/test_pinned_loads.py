"""A slot load for a request comes back pinned for it: no other load can evict the slot in between."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from replica.adapter_cache.errors import TierFullError
from replica.adapter_cache.host import HostAdapter
from replica.adapter_cache.loader import Slotted
from replica.errors import NoFreeSlotError
from tests.replica.adapter_cache.helpers import Env, make_env, slot_holds


def _slot_loads(env: Env, adapter_id: str) -> int:
    return sum(1 for e in env.loads("ram", adapter_id) if e.to_tier == "gpu")


def _after_the_first_write_of(env: Env, adapter_id: str, then: Callable[[], None]) -> None:
    """Run then() on the worker thread right after adapter_id's first slot write lands, before the event
    loop sees that write: where another request's load could run on a busy replica."""
    load_checked = env.cache.loader.load_checked
    done = False

    def write(host: HostAdapter) -> str | None:
        nonlocal done
        evicted = load_checked(host)
        if host.adapter_id == adapter_id and not done:
            done = True
            then()
        return evicted

    env.cache.loader.load_checked = write  # type: ignore[method-assign]


def _request_on_the_loop(
    env: Env, loop: asyncio.AbstractEventLoop, adapter_id: str, outcome: list[str]
) -> Callable[[], None]:
    """From a worker thread: acquire adapter_id on the loop, wait for the answer, release at once."""

    def run() -> None:
        try:
            lease = asyncio.run_coroutine_threadsafe(env.cache.acquire(adapter_id), loop).result(30)
        except NoFreeSlotError:
            outcome.append("no free slot")
            return
        outcome.append("slot")
        loop.call_soon_threadsafe(env.cache.release, lease)

    return run


@pytest.mark.parametrize("requests", [1, 3])
async def test_a_load_for_another_adapter_cannot_evict_a_slot_before_its_requests_pin_it(
    tmp_path: Path, requests: int
) -> None:
    """One slot, two adapters in RAM: a's slot write lands on a worker thread, and before a's requests run
    again a request for b loads. b must not take a's slot: it waits, then fails with the no-free-slot error,
    and a's requests get the slot that was written for them, loaded once, each with its own pin."""
    env = make_env(tmp_path, capacities={8: 1}, slot_wait_s=0.2, inline_write_bytes=0)  # writes in threads
    tensors = env.add("a", seed=1)
    env.add("b", seed=2)
    await env.cache.own("a", "ram")
    await env.cache.own("b", "ram")
    b_outcome: list[str] = []
    loop = asyncio.get_running_loop()
    _after_the_first_write_of(env, "a", _request_on_the_loop(env, loop, "b", b_outcome))

    leases = await asyncio.wait_for(asyncio.gather(*(env.cache.acquire("a") for _ in range(requests))), 30)

    assert b_outcome == ["no free slot"]
    assert _slot_loads(env, "a") == 1 and env.evictions("gpu") == []
    assert {lease.ref for lease in leases} == {leases[0].ref} and slot_holds(
        env.layers, leases[0].ref, tensors
    )
    assert env.cache.gpu.ref_count("a") == requests
    for lease in leases:
        env.cache.release(lease)
    env.cache.release(await env.cache.acquire("b"))  # a is idle now: b takes its slot
    assert env.cache.gpu.adapter_ids() == ["b"] and env.cache.gpu.ref_count("b") == 0


async def test_a_slot_written_with_the_ram_read_is_pinned_for_its_request_too(tmp_path: Path) -> None:
    """The adapter comes from disk into RAM and its slot in one worker-thread call: the same hold."""
    env = make_env(tmp_path, capacities={8: 1}, slot_wait_s=0.2)
    tensors = env.add("a", seed=1)
    env.add("b", seed=2)
    await env.cache.own("a", "disk")
    await env.cache.own("b", "ram")
    b_outcome: list[str] = []
    loop = asyncio.get_running_loop()
    _after_the_first_write_of(env, "a", _request_on_the_loop(env, loop, "b", b_outcome))

    lease = await asyncio.wait_for(env.cache.acquire("a"), 30)

    assert lease.found_in == "disk" and b_outcome == ["no free slot"]
    assert _slot_loads(env, "a") == 1 and slot_holds(env.layers, lease.ref, tensors)
    assert env.cache.gpu.ref_count("a") == 1
    env.cache.release(lease)


@pytest.mark.parametrize("when", ["before_the_write_lands", "after_the_slot_was_pinned_for_it"])
async def test_a_request_cancelled_while_its_load_runs_leaves_no_pin(
    tmp_path: Path, when: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests share one load; the first is cancelled before the write reaches the loop, or after the
    slot was pinned for it but before it resumed. The other gets the slot with one pin; nothing leaks."""
    env = make_env(tmp_path, capacities={8: 1}, inline_write_bytes=0)
    env.add("a", seed=1)
    await env.cache.own("a", "ram")
    loop = asyncio.get_running_loop()
    first = asyncio.ensure_future(env.cache.acquire("a"))
    second = asyncio.ensure_future(env.cache.acquire("a"))

    async def cancel_first() -> None:
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)

    if when == "before_the_write_lands":
        _after_the_first_write_of(
            env, "a", lambda: asyncio.run_coroutine_threadsafe(cancel_first(), loop).result(30)
        )
    else:
        slotted = env.cache._slotted

        def then_cancel(host: HostAdapter, written: Slotted) -> None:
            slotted(host, written)
            assert env.cache.gpu.ref_count("a") == 2  # both requests hold their pin now
            first.cancel()

        monkeypatch.setattr(env.cache, "_slotted", then_cancel)

    lease = await asyncio.wait_for(second, 30)
    await asyncio.gather(first, return_exceptions=True)
    assert first.cancelled()
    assert env.cache.gpu.ref_count("a") == 1 and env.cache.claims.open == {}
    env.cache.release(lease)
    assert env.cache.gpu.ref_count("a") == 0


async def test_a_load_that_fails_after_its_slot_was_written_releases_the_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slot is written with the disk read, then the RAM entry cannot be kept: the request fails and
    the written slot is left idle, not pinned."""
    env = make_env(tmp_path, capacities={8: 1})
    env.add("a", seed=1)
    await env.cache.own("a", "disk")

    def full(_host: HostAdapter) -> list[str]:
        raise TierFullError("host RAM is held by running requests")

    monkeypatch.setattr(env.cache.host, "put", full)
    with pytest.raises(TierFullError):
        await env.cache.acquire("a")
    assert env.cache.gpu.contains("a") and env.cache.gpu.ref_count("a") == 0
    assert env.cache.claims.open == {}
