"""The four-tier cache on real files, real safetensors and real LoRA layers (CPU)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from replica.adapter_cache import promote
from replica.adapter_cache.disk import DiskTier
from replica.adapter_cache.errors import ChecksumMismatchError
from replica.errors import AdapterBaseMismatchError, AdapterNonFiniteError, NoFreeSlotError
from tests.replica.adapter_cache.helpers import make_env, slot_holds


async def test_a_miss_promotes_through_every_tier_and_reports_where_it_was_found(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    tensors = env.add("acme-1", seed=1)
    lease = await env.cache.acquire("acme-1")
    assert lease.found_in == "remote"
    assert slot_holds(env.layers, lease.ref, tensors)
    await env.cache.settle()  # the disk copy is written behind the load, from the same verified bytes
    assert [(e.from_tier, e.to_tier) for e in env.events if e.kind == "load"] == [
        ("remote", "ram"),
        ("ram", "gpu"),
        ("ram", "disk"),
    ]
    assert all(e.bytes > 0 for e in env.events)
    env.cache.release(lease)
    again = await env.cache.acquire("acme-1")
    assert again.found_in == "gpu" and again.ref == lease.ref
    env.cache.release(again)
    state = env.cache.state()
    assert state.gpu_adapters == ["acme-1"] and state.ram_adapters == ["acme-1"]
    assert state.disk_adapters == ["acme-1"] and state.loads_per_min == 1.0


async def test_concurrent_requests_for_one_missing_adapter_trigger_a_single_load(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.add("acme-1", seed=1)
    leases = await asyncio.gather(*(env.cache.acquire("acme-1") for _ in range(8)))
    assert len({lease.ref for lease in leases}) == 1
    await env.cache.settle()
    assert len(env.loads("remote")) == 1 and len(env.loads("ram")) == 2  # -> gpu, -> disk
    assert env.registry.calls == 1
    assert env.cache.gpu.ref_count("acme-1") == 8
    for lease in leases:
        env.cache.release(lease)
    assert env.cache.gpu.ref_count("acme-1") == 0


async def test_a_bad_checksum_never_reaches_any_tier(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.add("acme-bad", seed=1, digest="0" * 64)
    with pytest.raises(ChecksumMismatchError):
        await env.cache.acquire("acme-bad")
    assert env.cache.disk.names() == [] and env.cache.host.adapter_ids() == []
    assert env.cache.gpu.adapter_ids() == []
    assert list((tmp_path / "disk" / ".partial").iterdir()) == []  # no half-written download left behind


async def test_a_file_corrupted_on_disk_after_verification_is_caught_at_promotion_and_fetched_again(
    tmp_path: Path,
) -> None:
    env = make_env(tmp_path)
    tensors = env.add("acme-1", seed=1)
    assert await env.cache.own("acme-1", "disk") == "remote"
    (name,) = env.cache.disk.names()
    weights = tmp_path / "disk" / name / "adapter_model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-3] ^= 0xFF  # one flipped bit in the tensor data: still parses, wrong numbers
    weights.write_bytes(bytes(raw))
    lease = await env.cache.acquire("acme-1")
    assert lease.found_in == "disk"
    assert len(env.loads("remote")) == 2
    assert slot_holds(env.layers, lease.ref, tensors)


@pytest.mark.parametrize("lost", ["entry", "weights", "config", "entry_after_restart"])
async def test_a_disk_entry_deleted_before_a_reload_is_fetched_again_from_the_object_store(
    tmp_path: Path, lost: str
) -> None:
    """An operator removes the entry (or one of its files) while only the disk tier holds the adapter: the
    reload re-fetches and re-verifies it from the object store; no FileNotFoundError reaches the caller."""
    env = make_env(tmp_path)
    tensors = env.add("acme-1", seed=1)
    assert await env.cache.own("acme-1", "disk") == "remote"
    (name,) = env.cache.disk.names()
    entry = tmp_path / "disk" / name
    files = {"weights": "adapter_model.safetensors", "config": "adapter_config.json"}
    if lost == "entry_after_restart":  # a restarted replica knows the entry, unverified, by its folder
        env.cache.disk = DiskTier(tmp_path / "disk", 1 << 30)
    if lost.startswith("entry"):
        shutil.rmtree(entry)
    else:
        (entry / files[lost]).unlink()
    assert env.cache.tier_of("acme-1") == "disk"  # the index still lists it
    lease = await env.cache.acquire("acme-1")
    assert len(env.loads("remote")) == 2  # fetched again, hashed as it streamed in
    assert slot_holds(env.layers, lease.ref, tensors)
    env.cache.release(lease)
    await env.cache.settle()
    assert (tmp_path / "disk" / name / files["weights"]).is_file()  # and written back whole


async def test_a_verified_disk_entry_streams_into_its_slot_as_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 8 in rank-8 slots, fp32: the file is its RAM entry, and the slot is written chunk by chunk (the
    default on CUDA; run here on host memory)."""
    monkeypatch.setattr(promote, "READ_CHUNK_BYTES", 256)
    env = make_env(tmp_path, stream_disk_to_slot=True)
    tensors = env.add("acme-1", seed=1, rank=8)
    assert await env.cache.own("acme-1", "disk") == "remote"
    spans = []
    copy_span = env.cache.gpu.copy_span
    monkeypatch.setattr(
        env.cache.gpu, "copy_span", lambda w, f, lo, hi: (spans.append((lo, hi)), copy_span(w, f, lo, hi))
    )
    lease = await env.cache.acquire("acme-1")
    assert lease.found_in == "disk" and len(env.loads("remote")) == 1
    assert slot_holds(env.layers, lease.ref, tensors)
    assert len(spans) > 4 and spans == sorted(spans) and spans[0][0] == 0  # in order, as the chunks landed
    assert [(e.from_tier, e.to_tier) for e in env.events if e.kind == "load"][-2:] == [
        ("disk", "ram"),
        ("ram", "gpu"),
    ]
    env.cache.release(lease)


async def test_a_streamed_slot_write_is_given_back_when_the_file_proves_bad(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header is compared once the whole file is read, after the chunks went into the reserved slot:
    that slot is never made ready, and the adapter is fetched again and written whole."""
    monkeypatch.setattr(promote, "READ_CHUNK_BYTES", 256)
    env = make_env(tmp_path, capacities={8: 1}, stream_disk_to_slot=True)
    tensors = env.add("acme-1", seed=1, rank=8)
    await env.cache.own("acme-1", "disk")
    (name,) = env.cache.disk.names()
    _ids, layout = env.cache.disk.verified(name)
    weights = tmp_path / "disk" / name / "adapter_model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[20] ^= 0x01  # inside the JSON header, same length: it still parses
    weights.write_bytes(bytes(raw))
    env.cache.disk.settle(name, env.cache.disk.current(name), layout)  # silent: the identities match again
    lease = await env.cache.acquire("acme-1")
    assert lease.found_in == "disk" and len(env.loads("remote")) == 2  # dropped, fetched again
    assert slot_holds(env.layers, lease.ref, tensors)
    assert env.cache.gpu.adapter_ids() == ["acme-1"] and len(env.cache.gpu.table) == 1
    env.cache.release(lease)


async def test_an_adapter_for_another_base_or_with_nan_never_takes_a_slot(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.add("other-base", seed=1, base_model_hash="sha256:" + "c" * 64)
    env.add("nan", seed=2, nan=True)
    with pytest.raises(AdapterBaseMismatchError):
        await env.cache.acquire("other-base")
    with pytest.raises(AdapterNonFiniteError):
        await env.cache.acquire("nan")
    assert env.cache.gpu.adapter_ids() == [] and env.cache.host.adapter_ids() == []


@pytest.mark.parametrize("inline_write_bytes", [None, 0], ids=["ram_to_slot_on_the_loop", "in_a_thread"])
async def test_more_active_adapters_than_slots_evicts_only_idle_ones_and_counts_evictions(
    tmp_path: Path, inline_write_bytes: int | None
) -> None:
    env = make_env(tmp_path, capacities={8: 2}, slot_wait_s=0.1, inline_write_bytes=inline_write_bytes)
    tensors = {f"a{i}": env.add(f"a{i}", seed=i) for i in range(5)}
    held = [await env.cache.acquire("a0"), await env.cache.acquire("a1")]
    with pytest.raises(NoFreeSlotError):  # both slots run requests: the third waits, then gives up
        await env.cache.acquire("a2")
    assert sorted(env.cache.gpu.adapter_ids()) == ["a0", "a1"]
    env.cache.release(held[1])
    lease = await env.cache.acquire("a2")  # evicts a1 (idle), never a0 (running)
    assert sorted(env.cache.gpu.adapter_ids()) == ["a0", "a2"]
    assert slot_holds(env.layers, held[0].ref, tensors["a0"]) and slot_holds(
        env.layers, lease.ref, tensors["a2"]
    )
    env.cache.release(lease)
    for name in ("a3", "a4", "a1"):
        env.cache.release(await env.cache.acquire(name))
        assert "a0" in env.cache.gpu.adapter_ids()
    assert slot_holds(env.layers, held[0].ref, tensors["a0"])
    assert [e.adapter_id for e in env.evictions("gpu")] == ["a1", "a2", "a3", "a4"]
    assert env.cache.state().evictions_per_min == 4.0
    assert [e.adapter_id for e in env.loads("ram") if e.to_tier == "gpu"].count("a1") == 2  # back from RAM
    env.cache.release(held[0])


async def test_unload_of_an_adapter_with_running_requests_waits_for_them_to_drain(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.add("acme-1", seed=1)
    lease = await env.cache.own("acme-1", "gpu") and await env.cache.acquire("acme-1")
    unload = asyncio.create_task(env.cache.unload("acme-1"))
    await asyncio.sleep(0.2)
    assert not unload.done() and env.cache.gpu.contains("acme-1")
    env.cache.release(lease)
    await asyncio.wait_for(unload, 5)
    assert env.cache.tier_of("acme-1") == "remote"
    assert env.cache.disk.names() == [] and env.cache.host.adapter_ids() == []
    assert await env.cache.unload("acme-1")  # a redelivered command changes nothing


async def test_ram_budget_keeps_the_most_recent_adapters(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    env.add("a0", seed=0)
    await env.cache.own("a0", "ram")
    one = env.cache.host.used_bytes
    env.cache.host.lru.budget = 2 * one
    for name, seed in (("a1", 1), ("a2", 2)):
        env.add(name, seed=seed)
        await env.cache.own(name, "ram")
    assert env.cache.host.adapter_ids() == ["a1", "a2"]
    assert [e.adapter_id for e in env.evictions("ram")] == ["a0"]
    assert env.cache.tier_of("a0") == "disk"


async def test_acquire_after_a_flight_ended_starts_a_new_one_instead_of_spinning(tmp_path: Path) -> None:
    """A finished slot flight still listed (its done callback not run yet) and the adapter's slot already
    taken again: acquire must start a new flight. Joining the finished one returns without yielding to the
    loop, so acquire would retry forever and the callback that lists it off would never run."""
    env = make_env(tmp_path, capacities={8: 1}, inline_write_bytes=0)  # RAM -> slot through a flight
    env.add("a0", seed=0)
    await env.cache.own("a0", "ram")
    ended = asyncio.get_running_loop().create_future()
    ended.set_result(None)
    env.cache.flights.running[("gpu", "a0")] = ended
    tries = 0
    try_pin = env.cache.gpu.try_pin

    def counted(adapter_id: str):
        nonlocal tries
        tries += 1
        assert tries < 100, "acquire retries without yielding to the event loop"
        return try_pin(adapter_id)

    env.cache.gpu.try_pin = counted  # type: ignore[method-assign]
    lease = await asyncio.wait_for(env.cache.acquire("a0"), 10)
    assert lease.adapter_id == "a0" and env.cache.gpu.ref_count("a0") == 1
    env.cache.release(lease)
    assert env.cache.flights.running == {}
