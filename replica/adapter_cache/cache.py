"""AdapterCache: four tiers (GPU slots, host RAM, local disk, object store) behind one async interface.

A miss promotes the adapter to where it is wanted. Each step runs once however many callers want it
(singleflight keyed by the step), in worker threads, so the event loop and the engine's decode steps keep
running. Only idle adapters are evicted. Requests hold a pin from acquire() to release(); unload() waits for
those pins to drain. Every load and eviction is reported to `on_event`.

A request's cold load (its adapter on no tier of this replica: an object-store fetch) is admitted under
per-tenant and total caps (replica.adapter_cache.cold_loads); a request for an adapter being loaded joins
that load. A load that fails is remembered for failure_ttl_s: requests for that adapter meanwhile get the
same error (503 `adapter_loading_failed` with Retry-After for a transient one) without another fetch, and
the first request after the TTL tries again.

Where the checks happen:
- sha256 once, when bytes enter the machine: the object store streams them into one buffer and hashes each
  piece as it lands (replica.adapter_cache.object_store). Never a second pass.
- Promotion from disk does not hash: the open files must show the identities the disk tier recorded at
  verification (replica.adapter_cache.identity); a mismatch, a short read or a header or shape failure is
  corruption: the entry is dropped and fetched again. A background scrubber (scrub_once, scrubber.py)
  re-hashes one disk entry at a time to catch silent media corruption off the request path.
- NaN/Inf, header and shape checks run once, when bytes are validated; a RAM entry is immutable and
  carries that verdict, and so does a verified disk entry (its identities prove the validated bytes). RAM ->
  slot is a copy plus bookkeeping after cheap metadata checks (rank, base hash, modules: promote.check_fits).
- RAM entries are packed in their bucket's slot-row layout (replica.lora.row_layout), so RAM -> slot is a
  few contiguous copies: one memcpy or host-to-device transfer for an adapter of every module at the
  bucket's rank. A short one runs on the event loop (INLINE_WRITE_BYTES), cheaper than a thread hop.
Critical paths: object store -> one buffer (hashed as it streams) -> RAM entry (a view of that buffer when
the file is already in row layout) -> slot, and the disk entry is written from the same buffer after the
slot is live (a background write that own() and settle() wait for); disk -> one readinto of a fresh buffer
that becomes the RAM entry -> slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

import torch

from replica.adapter_cache.cold_loads import ColdLoadGate
from replica.adapter_cache.disk import DiskTier, entry_digests
from replica.adapter_cache.errors import (
    AdapterCacheError,
    AdapterNotRegisteredError,
    ChecksumMismatchError,
    TierFullError,
)
from replica.adapter_cache.gpu import GpuTier, SlotWrite
from replica.adapter_cache.host import HostAdapter, HostTier
from replica.adapter_cache.object_store import Fetched, ObjectStore
from replica.adapter_cache.promote import Layout, check_fits, read_entry, validate_and_pack
from replica.adapter_cache.record import AdapterRecord
from replica.adapter_cache.tier import CacheEvent, RateWindow, Tier, satisfies
from replica.errors import AdapterInUseError, NoFreeSlotError
from replica.lora.slots import SlotRef
from replica.lora.spec import AdapterSpec

log = logging.getLogger(__name__)
T = TypeVar("T")

# A RAM -> slot write of at most this many bytes runs on the event loop: it is one memcpy (or one
# host-to-device transfer) of the packed buffer, short enough that a worker-thread hop and wake-up would
# add a noticeable share of it to a request's time to first token (bench load's RAM tier shows the
# difference). Larger writes go to a worker thread so the loop is never blocked for long.
INLINE_WRITE_BYTES = 32 << 20
COLD_LOADS_PER_TENANT = 4
COLD_LOADS_TOTAL = 16
FAILURE_TTL_S = 2.0


class Registry(Protocol):
    async def get(self, adapter_id: str) -> AdapterRecord: ...


@dataclass(frozen=True)
class Lease:
    """A request's hold on an adapter in a GPU slot, and the tier it was found in when the request came."""

    adapter_id: str
    ref: SlotRef
    found_in: Tier


@dataclass(frozen=True)
class CacheState:
    gpu_adapters: list[str]
    ram_adapters: list[str]
    disk_adapters: list[str]
    evictions_per_min: float
    loads_per_min: float


class Slotted(NamedTuple):
    evicted: str | None  # the idle adapter evicted for the slot
    seconds: float  # the slot write's time


class Validated(NamedTuple):
    host: HostAdapter
    layout: Layout
    slotted: Slotted | None  # None: no slot asked, or none free now


class ReadBack(NamedTuple):
    host: HostAdapter
    nbytes: int  # bytes read from disk
    slotted: Slotted | None


class PendingWrite(NamedTuple):
    """Verified bytes whose disk copy is not started yet, and their layout."""

    fetched: Fetched
    layout: Layout


class Failure(NamedTuple):
    until: float  # clock time from which it no longer counts
    error: AdapterCacheError


class AdapterCache:
    """The replica's adapter cache; all methods are called from the server's event loop."""

    def __init__(
        self,
        spec: AdapterSpec,
        registry: Registry,
        store: ObjectStore,
        disk: DiskTier,
        host: HostTier,
        gpu: GpuTier,
        *,
        on_event: Callable[[CacheEvent], None] = lambda _e: None,
        slot_wait_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        inline_write_bytes: int = INLINE_WRITE_BYTES,
        stream_disk_to_slot: bool | None = None,
        cold_loads_per_tenant: int = COLD_LOADS_PER_TENANT,
        cold_loads_total: int = COLD_LOADS_TOTAL,
        failure_ttl_s: float = FAILURE_TTL_S,
    ) -> None:
        """stream_disk_to_slot: write a slot while its disk entry is read (default: on CUDA only, where the
        host-to-device copies overlap the read; on a CPU the chunk copies cost what one copy after the read
        does, plus a call per chunk)."""
        self.spec, self.registry, self.store = spec, registry, store
        self.inline_write_bytes = inline_write_bytes
        self.stream_disk_to_slot = (
            gpu.device.type == "cuda" if stream_disk_to_slot is None else stream_disk_to_slot
        )
        self.disk, self.host, self.gpu = disk, host, gpu
        self.on_event = on_event
        self.slot_wait_s = slot_wait_s
        self.records: dict[str, AdapterRecord] = {}
        self.owned: set[str] = set()
        self.gpu_evictions = RateWindow(clock=clock)
        self.gpu_loads = RateWindow(clock=clock)
        self._flights: dict[tuple[str, str], asyncio.Future[Any]] = {}
        self._unwritten: dict[str, PendingWrite] = {}  # by weights digest
        self._writes: dict[str, asyncio.Future[None]] = {}  # digest -> its background disk write
        self._pin_host = gpu.device.type == "cuda"
        self.cold_loads = ColdLoadGate(cold_loads_per_tenant, cold_loads_total)
        self.failure_ttl_s = failure_ttl_s
        self.clock = clock
        self._failed: dict[str, Failure] = {}  # adapter_id -> its last load failure, while it counts

    # where adapters are

    def tier_of(self, adapter_id: str) -> Tier:
        if self.gpu.contains(adapter_id):
            return "gpu"
        if adapter_id in self.host:
            return "ram"
        record = self.records.get(adapter_id)
        if record is not None and self.disk.find(record.digest) is not None:
            return "disk"
        return "remote"

    def state(self) -> CacheState:
        by_digest: dict[str, list[str]] = {}
        for r in self.records.values():
            by_digest.setdefault(r.digest, []).append(r.adapter_id)
        on_disk = {entry_digests(name).weights for name in self.disk.names()}
        disk_ids = sorted(i for d in on_disk for i in by_digest.get(d, []))
        return CacheState(
            self.gpu.adapter_ids(),
            self.host.adapter_ids(),
            disk_ids,
            float(self.gpu_evictions.count()),
            float(self.gpu_loads.count()),
        )

    # requests

    async def acquire(self, adapter_id: str, tenant_id: str | None = None) -> Lease:
        """Bring the adapter into a GPU slot and pin it for one request (release() when it ends).

        A tenant's cold load counts against its cap (TenantColdLoadsError) and the replica's
        (ColdLoadsFullError); a request without a tenant (an operator's probe, a benchmark) is not capped.
        A load that failed within failure_ttl_s raises its error again at once."""
        self._refuse_if_failed(adapter_id)
        found = self.tier_of(adapter_id)
        cold = found == "remote" and tenant_id is not None  # no tenant: an operator's or a bench's
        counted = cold and self.cold_loads.admit(adapter_id, tenant_id or "")
        deadline = time.monotonic() + self.slot_wait_s
        try:
            while True:
                ref = self.gpu.try_pin(adapter_id)
                if ref is not None:
                    return Lease(adapter_id, ref, found)
                try:
                    await self.ensure(adapter_id, "gpu")
                except NoFreeSlotError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.02)  # every slot of its bucket is running: wait for one to drain
                except TierFullError:
                    raise  # capacity held by running requests, not this adapter's fault: not remembered
                except AdapterCacheError as exc:
                    self._remember_failure(adapter_id, exc)
                    raise
        finally:
            if counted:
                self.cold_loads.done(adapter_id)

    def _remember_failure(self, adapter_id: str, exc: AdapterCacheError) -> None:
        now = self.clock()
        for expired in [a for a, f in self._failed.items() if f.until <= now]:
            del self._failed[expired]  # one entry per failing adapter at most, and only while it counts
        self._failed[adapter_id] = Failure(now + self.failure_ttl_s, exc)
        if exc.status == 503:
            exc.retry_after_s = self.failure_ttl_s

    def _refuse_if_failed(self, adapter_id: str) -> None:
        failed = self._failed.get(adapter_id)
        if failed is None:
            return
        exc = failed.error
        left = failed.until - self.clock()
        if left <= 0 or self.gpu.contains(adapter_id) or adapter_id in self.host:
            del self._failed[adapter_id]  # expired, or loaded since (an owner's load): this request goes on
            return
        again = type(exc)(f"{exc.message} (failed {self.failure_ttl_s - left:.1f}s ago)", exc.param)
        again.code, again.type, again.status = exc.code, exc.type, exc.status
        if exc.status == 503:
            again.retry_after_s = left
        raise again

    def release(self, lease: Lease) -> None:
        self.gpu.release(lease.adapter_id)

    # commands

    async def own(self, adapter_id: str, target: Tier = "ram") -> Tier:
        """Own the adapter: bring it to `target` and to disk (idempotent); return where it was."""
        self.owned.add(adapter_id)
        found = self.tier_of(adapter_id)
        await self.ensure(adapter_id, target)
        await self.settle(adapter_id)
        return found

    async def unload(self, adapter_id: str, drain_timeout_s: float = 600.0) -> bool:
        """No longer owned: once its requests drain, drop it from every tier (idempotent)."""
        self.owned.discard(adapter_id)
        for key in [k for k in self._flights if k[1] == adapter_id]:
            await asyncio.gather(asyncio.shield(self._flights[key]), return_exceptions=True)
        await self.settle(adapter_id)
        deadline = time.monotonic() + drain_timeout_s
        while True:
            try:
                self.gpu.remove(adapter_id)
                break
            except AdapterInUseError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        self.host.remove(adapter_id)
        record = self.records.pop(adapter_id, None)
        if record is not None and not any(r.digest == record.digest for r in self.records.values()):
            name = self.disk.find(record.digest)
            if name is not None:
                await asyncio.to_thread(self.disk.remove, name)
        return True

    async def settle(self, adapter_id: str | None = None) -> None:
        """Wait for the disk writes behind loads (of this adapter, or all) to finish."""
        self._start_writes()
        record = self.records.get(adapter_id) if adapter_id is not None else None
        if adapter_id is not None and record is None:
            return
        tasks = [t for d, t in self._writes.items() if record is None or d == record.digest]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def scrub_once(self) -> str | None:
        """Re-hash one disk entry (round robin) and drop it if it no longer matches; return its name."""
        dropped = await asyncio.to_thread(self.disk.scrub_next)
        if dropped is not None:
            self._disk_evicted(dropped)
        return dropped

    # promotion

    async def ensure(self, adapter_id: str, target: Tier) -> None:
        """Promote until the adapter is at least in `target` (each step singleflight)."""
        if satisfies(self.tier_of(adapter_id), target):
            return
        try:
            if target == "gpu" and adapter_id in self.host:
                if ("gpu", adapter_id) not in self._flights and self._ram_to_gpu_now(adapter_id):
                    return
                await self._once("gpu", adapter_id, lambda: self._ram_to_gpu(adapter_id))
                return
            record = self.records.get(adapter_id)
            if record is None:
                record = await self._once("record", adapter_id, lambda: self._record(adapter_id))
            if target == "disk":
                await self._once("disk", record.digest, lambda: self._to_disk(record))
                return
            if adapter_id not in self.host:
                slot = target == "gpu"
                await self._once("ram", adapter_id, lambda: self._to_ram(record, slot))
            if target == "gpu" and not self.gpu.contains(adapter_id):
                await self._once("gpu", adapter_id, lambda: self._ram_to_gpu(adapter_id))
        finally:
            self._start_writes()  # the disk copy is written once the slot (or RAM entry) is live

    async def _once(self, step: str, key: str, factory: Callable[[], Awaitable[T]]) -> T:
        """Join the step's flight, or start one. A finished flight is never joined: awaiting a done future
        does not yield, so a caller that retries (acquire, when the slot was taken again before it could
        pin) would spin on the loop before the flight's done callback could run."""
        flight_key = (step, key)
        fut = self._flights.get(flight_key)
        if fut is None or fut.done():
            fut = asyncio.ensure_future(factory())
            self._flights[flight_key] = fut
            fut.add_done_callback(partial(self._land, flight_key))
        return await asyncio.shield(fut)

    def _land(self, flight_key: tuple[str, str], fut: asyncio.Future[Any]) -> None:
        if self._flights.get(flight_key) is fut:  # a later flight of the same step may have replaced it
            del self._flights[flight_key]

    async def _record(self, adapter_id: str) -> AdapterRecord:
        record = self.records.get(adapter_id)
        if record is None:
            record = await self.registry.get(adapter_id)
            if record.adapter_id != adapter_id:
                raise AdapterNotRegisteredError(f"registry answered for another adapter than {adapter_id!r}")
            self.records[adapter_id] = record
        return record

    async def _fetch(self, record: AdapterRecord) -> Fetched:
        return await self._once("fetch", record.digest, lambda: self.store.fetch(record, self._pin_host))

    def _validate(self, fetched: Fetched, record: AdapterRecord, slot: bool = False) -> Validated:
        """Worker thread: the checks a RAM entry carries, on bytes just fetched (then the slot, if asked)."""
        packed = validate_and_pack(
            fetched.weights,
            fetched.config,
            adapter_id=record.adapter_id,
            base_model_hash=record.base_model_hash,
            digest=fetched.weights_digest,
            spec=self.spec,
            dtype=self.gpu.dtype,
            pin=self._pin_host,
            row_for=self.gpu.row_layout,
        )
        return Validated(packed.host, packed.layout, self._into_slot(packed.host, slot))

    async def _to_disk(self, record: AdapterRecord) -> str:
        """Object store -> disk only (an owner warming its disk): verified and validated, not kept in RAM."""
        await self.settle(record.adapter_id)
        name = self.disk.find(record.digest)
        if name is not None:
            return name
        start = time.perf_counter()
        fetched = await self._fetch(record)
        validated = await asyncio.to_thread(self._validate, fetched, record)
        return await self._write(fetched, validated.layout, "remote", start)

    async def _to_ram(self, record: AdapterRecord, slot: bool = False) -> None:
        """Disk (or, failing that, the object store) -> RAM; with `slot`, also into a GPU slot, in the same
        worker-thread call (one hop fewer on a request's critical path)."""
        read: ReadBack | None = None
        source: Tier = "disk"
        start = time.perf_counter()
        name = self.disk.find(record.digest)
        if name is not None:
            try:
                read = await asyncio.to_thread(self._read_disk, name, record, slot)
            except ChecksumMismatchError as exc:
                log.warning(
                    "adapter %s: local copy is corrupt (%s), fetching it again", record.adapter_id, exc
                )
        if read is None:
            source, start = "remote", time.perf_counter()
            fetched = await self._fetch(record)
            validated = await asyncio.to_thread(self._validate, fetched, record, slot)
            read = ReadBack(validated.host, fetched.nbytes, validated.slotted)
            if self.disk.find(record.digest) is None:
                self._unwritten[record.digest] = PendingWrite(fetched, validated.layout)
        host, slotted = read.host, read.slotted
        ram_s = time.perf_counter() - start - (slotted.seconds if slotted is not None else 0.0)
        for victim in self.host.put(host):
            self._emit("evict", victim, "ram", None)
        self._emit("load", record.adapter_id, source, "ram", ram_s, read.nbytes)
        if slotted is not None:
            self._slotted(host, slotted)

    def _into_slot(self, host: HostAdapter, slot: bool) -> Slotted | None:
        """Worker thread, after a RAM entry was made: metadata checks and the copy into a slot. None when
        not asked or no slot is free now (the caller's GPU step tries again and waits for one)."""
        if not slot:
            return None
        start = time.perf_counter()
        try:
            evicted = self._load_checked(host)
        except NoFreeSlotError:
            return None
        return Slotted(evicted, time.perf_counter() - start)

    def _slotted(self, host: HostAdapter, slotted: Slotted) -> None:
        if slotted.evicted is not None:
            self.gpu_evictions.mark()
            self._emit("evict", slotted.evicted, "gpu", "ram" if slotted.evicted in self.host else None)
        self.gpu_loads.mark()
        self._emit("load", host.adapter_id, "ram", "gpu", slotted.seconds, host.nbytes)

    def _read_disk(self, name: str, record: AdapterRecord, slot: bool) -> ReadBack:
        """Worker thread: one read of the disk entry, proven by its identities (or hashed if unverified).

        With `slot`, a verified entry whose file is its RAM entry's buffer (a view layout) is written into a
        reserved slot chunk by chunk as the read lands (on CUDA the copies overlap the read); the slot is
        made ready only once the whole file is proven, and given back if it is not."""
        if not self.disk.pin(name):
            raise ChecksumMismatchError("the local copy was evicted before it was read")
        verified = self.disk.verified(name)
        layout_known: Layout | None = verified.layout if verified is not None else None
        write = self._begin_streamed(record.adapter_id, layout_known) if slot else None
        start = time.perf_counter()
        try:
            digests = entry_digests(name)
            read = read_entry(
                self.disk.path(name),
                verified,
                weights_digest=digests.weights,
                config_digest=digests.config,
                adapter_id=record.adapter_id,
                base_model_hash=record.base_model_hash,
                spec=self.spec,
                dtype=self.gpu.dtype,
                pin=self._pin_host,
                row_for=self.gpu.row_layout,
                sink=self._sink(write, layout_known.start) if write is not None and layout_known else None,
            )
            if write is not None:
                check_fits(read.host, self.spec, self.gpu.row_layout(read.host.rank))
                self.gpu.finish(write, read.host)
        except ChecksumMismatchError:
            self.disk.drop_corrupt(name)
            raise
        finally:
            if write is not None:
                self.gpu.abort(write)  # a no-op once finished
            self.disk.unpin(name)
        if verified is None:
            self.disk.settle(
                name, read.seen, read.layout
            )  # hashed just now: its identities prove it from here on
        if write is not None:
            return ReadBack(read.host, read.nbytes, Slotted(write.evicted, time.perf_counter() - start))
        return ReadBack(read.host, read.nbytes, self._into_slot(read.host, slot))

    def _begin_streamed(self, adapter_id: str, layout: Layout | None) -> SlotWrite | None:
        """Reserve a slot for a streamed disk read, or None (not a view layout, resident, or no free slot)."""
        if not self.stream_disk_to_slot or layout is None or not layout.view or self.gpu.contains(adapter_id):
            return None
        try:
            return self.gpu.begin(adapter_id, layout.rank, layout.bucket, layout.targets)
        except (NoFreeSlotError, ValueError):
            return None  # the slot step after the read tries again (and waits for a slot)

    def _sink(self, write: SlotWrite, start: int) -> Callable[[torch.Tensor, int, int], None]:
        """Hand each landed chunk buf[lo:hi] of the data section (from byte `start`) to the slot write."""
        item = self.gpu.dtype.itemsize

        def copy(buf: torch.Tensor, lo: int, hi: int) -> None:
            flat = buf[start:].view(self.gpu.dtype)  # [numel]: the view layout's packed buffer
            self.gpu.copy_span(write, flat, (lo - start) // item, (hi - start) // item)

        return copy

    def _start_writes(self) -> None:
        for digest in list(self._unwritten):
            pending = self._unwritten.pop(digest)
            if digest in self._writes:
                continue
            task = asyncio.ensure_future(self._background_write(pending))
            self._writes[digest] = task
            task.add_done_callback(partial(self._forget_write, digest))

    def _forget_write(self, digest: str, task: asyncio.Future[None]) -> None:
        if self._writes.get(digest) is task:  # a later write of the same digest may have replaced it
            del self._writes[digest]

    async def _background_write(self, pending: PendingWrite) -> None:
        try:
            await self._write(pending.fetched, pending.layout, "ram", time.perf_counter())
        except Exception:  # noqa: BLE001 - the RAM entry serves; the disk copy is fetched again when needed
            log.exception("could not write adapter %s to the disk tier", pending.fetched.weights_digest[:16])

    async def _write(self, fetched: Fetched, layout: Layout, source: Tier, start: float) -> str:
        weights = fetched.weights.numpy().data.cast("B")  # ndarray.data: the array as a memoryview
        written = await asyncio.to_thread(
            self.disk.write, weights, fetched.config, fetched.weights_digest, fetched.config_digest, layout
        )
        for victim in written.evicted:
            self._disk_evicted(victim)
        for adapter_id in self._ids_with_digest(fetched.weights_digest):
            self._emit("load", adapter_id, source, "disk", time.perf_counter() - start, fetched.nbytes)
        return written.name

    def _ram_to_gpu_now(self, adapter_id: str) -> bool:
        """RAM -> slot on the loop, start to end without an await, when the write is short: no other
        coroutine can run in between, so it needs no singleflight task (a loop round trip saved). False
        when the entry is gone or too large for the loop (the caller takes the threaded path)."""
        item = self.host.get_pinned(adapter_id)
        if item is None:
            return False
        try:
            if item.nbytes > self.inline_write_bytes:
                return False
            start = time.perf_counter()
            evicted = self._load_checked(item)
        finally:
            self.host.unpin(adapter_id)
        self._slotted(item, Slotted(evicted, time.perf_counter() - start))
        return True

    async def _ram_to_gpu(self, adapter_id: str) -> None:
        """RAM -> slot. A RAM entry evicted before it is pinned (host RAM smaller than what the waiting
        requests want) is read back again; an adapter a concurrent step put in a slot meanwhile is done."""
        while True:
            if self.gpu.contains(adapter_id):
                return
            item = self.host.get_pinned(adapter_id)
            if item is not None:
                break
            await self.ensure(adapter_id, "ram")
        try:
            start = time.perf_counter()
            if item.nbytes <= self.inline_write_bytes:
                evicted = self._load_checked(item)
            else:
                evicted = await asyncio.to_thread(self._load_checked, item)
        finally:
            self.host.unpin(adapter_id)
        self._slotted(item, Slotted(evicted, time.perf_counter() - start))

    def _load_checked(self, host: HostAdapter) -> str | None:
        """Metadata checks (promote.check_fits), then the slot write; returns the idle adapter evicted."""
        check_fits(host, self.spec, self.gpu.row_layout(host.rank))
        return self.gpu.load(host).evicted

    def _disk_evicted(self, name: str) -> None:
        for adapter_id in self._ids_with_digest(entry_digests(name).weights):
            self._emit("evict", adapter_id, "disk", None)

    def _ids_with_digest(self, digest: str) -> list[str]:
        return [r.adapter_id for r in self.records.values() if r.digest == digest]

    def _emit(
        self,
        kind: Literal["load", "evict"],
        adapter_id: str,
        from_tier: Tier | None,
        to_tier: Tier | None,
        duration: float = 0.0,
        nbytes: int = 0,
    ) -> None:
        try:
            self.on_event(CacheEvent(kind, adapter_id, from_tier, to_tier, duration, nbytes))
        except Exception:  # noqa: BLE001 - reporting must never break a load
            log.exception("cache event sink failed")
