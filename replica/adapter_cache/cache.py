"""AdapterCache: four tiers (GPU slots, host RAM, local disk, object store) behind one async interface
(a miss, the checks at each step and the cold-load caps: docs/adapter-cache.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from replica.adapter_cache.cold_loads import ColdLoadGate
from replica.adapter_cache.disk import DiskTier, entry_digests
from replica.adapter_cache.disk_writes import DiskWrites, PendingWrite
from replica.adapter_cache.errors import (
    AdapterCacheError,
    AdapterNotRegisteredError,
    ChecksumMismatchError,
    TierFullError,
)
from replica.adapter_cache.failed_loads import FailedLoads
from replica.adapter_cache.flights import Flights
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.host import HostAdapter, HostTier
from replica.adapter_cache.loader import AdapterLoader, ReadBack, Slotted
from replica.adapter_cache.object_store import Fetched, ObjectStore
from replica.adapter_cache.promote import Layout
from replica.adapter_cache.record import AdapterRecord
from replica.adapter_cache.slot_claims import SlotClaims
from replica.adapter_cache.tier import CacheEvent, RateWindow, Tier, satisfies
from replica.adapter_cache.vacancies import Vacancies
from replica.errors import AdapterInUseError, NoFreeSlotError
from replica.lora.slots import SlotRef
from replica.lora.spec import AdapterSpec

log = logging.getLogger(__name__)

# A RAM -> slot write of at most this many bytes runs on the event loop: it is one memcpy (or one
# host-to-device transfer) of the packed buffer, short enough that a worker-thread hop and wake-up would
# add a noticeable share of it to a request's time to first token (bench load's RAM tier shows the
# difference). Larger writes go to a worker thread so the loop is never blocked for long.
INLINE_WRITE_BYTES = 32 << 20
COLD_LOADS_PER_TENANT = 4
COLD_LOADS_TOTAL = 16
FAILURE_TTL_S = 2.0
# A request waiting for a slot looks again when a hold ends on the event loop; this often besides, for a
# slot freed elsewhere (a running row's pin dropped on the engine thread after its request's hold).
SLOT_RECHECK_S = 0.25


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
        on_cuda = gpu.device.type == "cuda"
        self.loader = AdapterLoader(
            spec,
            gpu,
            pin_host=on_cuda,
            stream_disk_to_slot=on_cuda if stream_disk_to_slot is None else stream_disk_to_slot,
        )
        self.disk, self.host, self.gpu = disk, host, gpu
        self.on_event = on_event
        self.slot_wait_s = slot_wait_s
        self.records: dict[str, AdapterRecord] = {}
        self.owned: set[str] = set()
        self.gpu_evictions = RateWindow(clock=clock)
        self.gpu_loads = RateWindow(clock=clock)
        self.flights = Flights()
        self.claims = SlotClaims()
        self.vacancies = Vacancies()
        self.disk_writes = DiskWrites(self._write)
        self.cold_loads = ColdLoadGate(cold_loads_per_tenant, cold_loads_total)
        self.failure_ttl_s = failure_ttl_s
        self.clock = clock
        self.failed = FailedLoads()

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

        The load that brings the adapter into a slot pins it for this request (and for every other request
        waiting on the same load) before any other load can evict it. A tenant's cold load counts against
        its cap (TenantColdLoadsError) and the replica's (ColdLoadsFullError); a request without a tenant
        (an operator's probe, a benchmark) is not capped. A load that failed within failure_ttl_s raises its
        error again at once."""
        self.failed.refuse_if_failed(
            adapter_id,
            self.clock,
            self.failure_ttl_s,
            lambda: self.gpu.contains(adapter_id) or adapter_id in self.host,
        )
        found = self.tier_of(adapter_id)
        cold = found == "remote" and tenant_id is not None  # no tenant: an operator's or a bench's
        counted = cold and self.cold_loads.admit(adapter_id, tenant_id or "")
        deadline = time.monotonic() + self.slot_wait_s
        try:
            while True:
                ref = self.gpu.try_pin(adapter_id)
                if ref is not None:
                    return Lease(adapter_id, ref, found)
                vacancy = self.vacancies.event  # set by any hold that ends from here on
                try:
                    ref = await self._load_pinned(adapter_id)
                except NoFreeSlotError as exc:
                    await self._wait_for_room(adapter_id, exc, vacancy, deadline)
                    continue
                except TierFullError:
                    raise  # capacity held by running requests, not this adapter's fault: not remembered
                except AdapterCacheError as exc:
                    self.failed.remember(adapter_id, exc, self.clock(), self.failure_ttl_s)
                    raise
                if ref is not None:
                    return Lease(adapter_id, ref, found)
        finally:
            if counted:
                self.cold_loads.done(adapter_id)

    async def _wait_for_room(
        self, adapter_id: str, exc: NoFreeSlotError, vacancy: asyncio.Event, deadline: float
    ) -> None:
        """Every slot of the adapter's bucket was running: wait, reading and writing nothing, until a hold
        ends and the bucket has room, or another request's load put the adapter in a slot (a request
        retrying blindly would read its adapter from disk again each time its RAM entry was evicted), or
        raise exc at the deadline."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise exc
            await self.vacancies.wait(vacancy, min(left, SLOT_RECHECK_S))
            vacancy = self.vacancies.event
            if exc.rank is None or self.gpu.contains(adapter_id) or self.gpu.can_place(exc.rank):
                return

    async def _load_pinned(self, adapter_id: str) -> SlotRef | None:
        """ensure(adapter_id, "gpu") with a claim open: the slot pinned for this request by the load that
        made it ready, or None (no load landed for it: the caller pins or tries again). The pin is released
        if the request fails or is cancelled before it holds the lease."""
        claim = self.claims.claim(adapter_id)
        try:
            await self.ensure(adapter_id, "gpu")
        except BaseException:
            if claim.ref is not None:
                self._release(adapter_id)
            raise
        finally:
            self.claims.close(claim)
        return claim.ref

    def release(self, lease: Lease) -> None:
        self._release(lease.adapter_id)

    def _release(self, adapter_id: str) -> None:
        self.gpu.release(adapter_id)
        self.vacancies.notify()

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
        running = self.flights.running
        for key in [k for k in running if k[1] == adapter_id]:
            await asyncio.gather(asyncio.shield(running[key]), return_exceptions=True)
        await self.settle(adapter_id)
        deadline = time.monotonic() + drain_timeout_s
        while True:
            try:
                self.gpu.remove(adapter_id)
                self.vacancies.notify()
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
        self.disk_writes.start()
        if adapter_id is None:
            await self.disk_writes.wait()
        elif (record := self.records.get(adapter_id)) is not None:
            await self.disk_writes.wait(record.digest)

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
        once = self.flights.once
        try:
            if target == "gpu" and adapter_id in self.host:
                if ("gpu", adapter_id) not in self.flights and self._ram_to_gpu_now(adapter_id):
                    return
                await once("gpu", adapter_id, lambda: self._ram_to_gpu(adapter_id))
                return
            record = self.records.get(adapter_id)
            if record is None:
                record = await once("record", adapter_id, lambda: self._record(adapter_id))
            if target == "disk":
                await once("disk", record.digest, lambda: self._to_disk(record))
                return
            if adapter_id not in self.host:
                slot = target == "gpu"
                await once("ram", adapter_id, lambda: self._to_ram(record, slot))
            if target == "gpu" and not self.gpu.contains(adapter_id):
                await once("gpu", adapter_id, lambda: self._ram_to_gpu(adapter_id))
        finally:
            self.disk_writes.start()  # the disk copy is written once the slot (or RAM entry) is live

    async def _record(self, adapter_id: str) -> AdapterRecord:
        record = self.records.get(adapter_id)
        if record is None:
            record = await self.registry.get(adapter_id)
            if record.adapter_id != adapter_id:
                raise AdapterNotRegisteredError(f"registry answered for another adapter than {adapter_id!r}")
            self.records[adapter_id] = record
        return record

    async def _fetch(self, record: AdapterRecord) -> Fetched:
        pin = self.loader.pin_host
        return await self.flights.once("fetch", record.digest, lambda: self.store.fetch(record, pin))

    async def _to_disk(self, record: AdapterRecord) -> str:
        """Object store -> disk only (an owner warming its disk): verified and validated, not kept in RAM."""
        await self.settle(record.adapter_id)
        name = self.disk.find(record.digest)
        if name is not None:
            return name
        start = time.perf_counter()
        fetched = await self._fetch(record)
        validated = await asyncio.to_thread(self.loader.validate, fetched, record)
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
                read = await asyncio.to_thread(self.loader.read_disk, self.disk, name, record, slot)
            except ChecksumMismatchError as exc:
                log.warning(
                    "adapter %s: local copy is corrupt (%s), fetching it again", record.adapter_id, exc
                )
        if read is None:
            source, start = "remote", time.perf_counter()
            fetched = await self._fetch(record)
            validated = await asyncio.to_thread(self.loader.validate, fetched, record, slot)
            read = ReadBack(validated.host, fetched.nbytes, validated.slotted)
            if self.disk.find(record.digest) is None:
                self.disk_writes.queue(record.digest, PendingWrite(fetched, validated.layout))
        host, slotted = read.host, read.slotted
        ram_s = time.perf_counter() - start - (slotted.seconds if slotted is not None else 0.0)
        try:
            for victim in self.host.put(host):
                self._emit("evict", victim, "ram", None)
            self._emit("load", record.adapter_id, source, "ram", ram_s, read.nbytes)
        finally:
            if slotted is not None:  # the slot is ready and pinned for the write: hand it on even so
                self._slotted(host, slotted)

    def _slotted(self, host: HostAdapter, slotted: Slotted) -> None:
        """A slot write landed, the slot pinned once for it: pin it for each request waiting on the adapter,
        then drop the write's pin (no await in between, so no load evicts it first)."""
        adapter_id = host.adapter_id
        self.claims.grant(adapter_id, lambda: self.gpu.try_pin(adapter_id))
        self._release(adapter_id)
        if slotted.evicted is not None:
            self.gpu_evictions.mark()
            self._emit("evict", slotted.evicted, "gpu", "ram" if slotted.evicted in self.host else None)
        self.gpu_loads.mark()
        self._emit("load", host.adapter_id, "ram", "gpu", slotted.seconds, host.nbytes)

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
            evicted = self.loader.load_checked(item)
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
                evicted = self.loader.load_checked(item)
            else:
                evicted = await asyncio.to_thread(self.loader.load_checked, item)
        finally:
            self.host.unpin(adapter_id)
        self._slotted(item, Slotted(evicted, time.perf_counter() - start))

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
