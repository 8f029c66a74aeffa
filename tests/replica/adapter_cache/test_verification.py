"""Where bytes are verified: sha256 once as they enter the machine, identities at promotion, a scrubber for
silent corruption, and a full hash for disk entries this process did not verify itself."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from replica.adapter_cache import identity, object_store, promote
from replica.adapter_cache.cache import AdapterCache
from replica.adapter_cache.disk import DiskTier, Verified
from replica.adapter_cache.scrubber import scrub_forever
from tests.replica.adapter_cache.helpers import make_env, slot_holds


class CountingSha256:
    """hashlib.sha256 that counts the bytes it hashes (to show what is hashed, and how often)."""

    def __init__(self) -> None:
        self.bytes = 0
        self._real = hashlib.sha256

    def __call__(self, data: bytes | memoryview = b"") -> object:
        counter, inner = self, self._real()

        class Hash:
            def update(self, chunk: bytes | memoryview) -> None:
                counter.bytes += memoryview(chunk).nbytes
                inner.update(chunk)

            def hexdigest(self) -> str:
                return inner.hexdigest()

        h = Hash()
        if data:
            h.update(data)
        return h


@pytest.fixture
def sha256(monkeypatch: pytest.MonkeyPatch) -> CountingSha256:
    counting = CountingSha256()
    for module in (object_store, promote):
        monkeypatch.setattr(module, "hashlib", SimpleNamespace(sha256=counting))
    return counting


def _flip(weights: Path) -> None:
    raw = bytearray(weights.read_bytes())
    raw[-3] ^= 0xFF  # the same size, still parses, still finite
    weights.write_bytes(bytes(raw))


async def test_bytes_are_hashed_once_as_they_arrive_and_never_on_promotion(
    tmp_path: Path, sha256: CountingSha256
) -> None:
    env = make_env(tmp_path)
    tensors = env.add("acme-1", seed=1)
    await env.cache.own("acme-1", "ram")
    size = sum(p.stat().st_size for p in (env.store_root / "acme-1").iterdir())
    assert sha256.bytes == size  # weights as they streamed in, plus the config: one pass
    for _ in range(2):  # disk -> RAM -> slot twice: proven by identities, not hashed
        env.cache.gpu.remove("acme-1")
        env.cache.host.remove("acme-1")
        lease = await env.cache.acquire("acme-1")
        assert lease.found_in == "disk" and slot_holds(env.layers, lease.ref, tensors)
        env.cache.release(lease)
    assert sha256.bytes == size


async def test_the_scrubber_catches_corruption_that_left_the_identities_as_they_were(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    tensors = env.add("acme-1", seed=1)
    await env.cache.own("acme-1", "disk")
    (name,) = env.cache.disk.names()
    _flip(tmp_path / "disk" / name / "adapter_model.safetensors")
    # Silent media corruption: the bytes change, the metadata does not. The filesystem cannot do that, so
    # the index is told the new identities (what a promotion would then see as "unchanged").
    verified = env.cache.disk.verified(name)
    assert verified is not None
    env.cache.disk._verified[name] = Verified(env.cache.disk.current(name), verified.layout)
    assert await env.cache.scrub_once() == name
    assert env.cache.disk.names() == [] and env.evictions("disk")[-1].adapter_id == "acme-1"
    lease = await env.cache.acquire("acme-1")
    assert lease.found_in == "remote" and slot_holds(env.layers, lease.ref, tensors)
    env.cache.release(lease)
    await env.cache.settle()
    assert await env.cache.scrub_once() is None  # the fresh copy matches


async def test_the_scrubber_runs_in_the_background_one_entry_per_interval(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    for i in range(3):
        env.add(f"a{i}", seed=i)
        await env.cache.own(f"a{i}", "disk")
    bad = env.cache.disk.find(env.registry.records["a1"].digest)
    assert bad is not None
    path = tmp_path / "disk" / bad / "adapter_model.safetensors"
    _flip(path)
    stop = asyncio.Event()
    task = asyncio.create_task(scrub_forever(env.cache, 0.01, stop))
    for _ in range(500):
        if bad not in env.cache.disk.names():
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert bad not in env.cache.disk.names() and len(env.cache.disk.names()) == 2


async def test_disk_entries_found_at_start_up_are_hashed_once_on_first_promotion(
    tmp_path: Path, sha256: CountingSha256
) -> None:
    env = make_env(tmp_path)
    tensors = {name: env.add(name, seed=i) for i, name in enumerate(("good", "rotten"))}
    for name in tensors:
        await env.cache.own(name, "disk")
    rotten = env.cache.disk.find(env.registry.records["rotten"].digest)
    _flip(tmp_path / "disk" / str(rotten) / "adapter_model.safetensors")
    restarted = _restart(env.cache, tmp_path)
    assert all(restarted.disk.verified(n) is None for n in restarted.disk.names())
    before = sha256.bytes
    for name in tensors:
        lease = await restarted.acquire(name)
        assert slot_holds(restarted.gpu.layers, lease.ref, tensors[name])
        restarted.release(lease)
    good = restarted.disk.find(env.registry.records["good"].digest)
    assert good is not None and restarted.disk.verified(good) is not None  # hashed once, then proven
    assert sha256.bytes > before
    await restarted.settle()
    assert (
        restarted.disk.verified(str(restarted.disk.find(env.registry.records["rotten"].digest))) is not None
    )


async def test_an_entry_whose_timestamps_do_not_settle_stays_unverified_and_is_hashed_on_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A filesystem whose ctime clock has not moved past the file's last change: a write in the same tick
    # could leave the identity as it was, so the identity proves nothing yet.
    monkeypatch.setattr(identity, "stamp", lambda _probe: 0)
    monkeypatch.setattr(identity, "SETTLE_WAIT_S", 0.01)
    env = make_env(tmp_path)
    tensors = env.add("acme-1", seed=1)
    await env.cache.own("acme-1", "disk")
    (name,) = env.cache.disk.names()
    assert env.cache.disk.verified(name) is None
    _flip(tmp_path / "disk" / name / "adapter_model.safetensors")
    lease = await env.cache.acquire("acme-1")  # hashed on promotion: caught, dropped, fetched again
    assert lease.found_in == "disk" and len(env.loads("remote")) == 2
    assert slot_holds(env.layers, lease.ref, tensors)
    env.cache.release(lease)


def _restart(cache: AdapterCache, tmp_path: Path) -> AdapterCache:
    """The same disk folder and registry, in a new process: nothing in memory survives."""
    gpu = type(cache.gpu)(cache.gpu.layers, {8: 4})
    return AdapterCache(
        cache.spec,
        cache.registry,
        cache.store,
        DiskTier(tmp_path / "disk", 1 << 30),
        type(cache.host)(1 << 30),
        gpu,
    )
