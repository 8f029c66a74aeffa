"""The cache's blocking promotion steps: fetched bytes or a disk entry into a RAM entry, and a RAM entry
into a GPU slot. AdapterCache runs them in worker threads (a short slot write on the event loop)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from replica.adapter_cache.disk import DiskTier, entry_digests
from replica.adapter_cache.errors import ChecksumMismatchError
from replica.adapter_cache.gpu import GpuTier, SlotWrite
from replica.adapter_cache.host import HostAdapter
from replica.adapter_cache.object_store import Fetched
from replica.adapter_cache.promote import Layout, check_fits, read_entry, validate_and_pack
from replica.adapter_cache.record import AdapterRecord
from replica.errors import NoFreeSlotError
from replica.lora.spec import AdapterSpec


class Slotted(NamedTuple):
    """A slot write that landed; the slot stays pinned once for it until AdapterCache hands the pin on."""

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


class AdapterLoader:
    """Makes RAM entries and fills slots for one cache; every method blocks."""

    def __init__(self, spec: AdapterSpec, gpu: GpuTier, *, pin_host: bool, stream_disk_to_slot: bool) -> None:
        self.spec, self.gpu = spec, gpu
        self.pin_host = pin_host
        self.stream_disk_to_slot = stream_disk_to_slot

    def validate(self, fetched: Fetched, record: AdapterRecord, slot: bool = False) -> Validated:
        """The checks a RAM entry carries, on bytes just fetched (then the slot, if asked)."""
        packed = validate_and_pack(
            fetched.weights,
            fetched.config,
            adapter_id=record.adapter_id,
            base_model_hash=record.base_model_hash,
            digest=fetched.weights_digest,
            spec=self.spec,
            dtype=self.gpu.dtype,
            pin=self.pin_host,
            row_for=self.gpu.row_layout,
        )
        return Validated(packed.host, packed.layout, self.into_slot(packed.host, slot))

    def into_slot(self, host: HostAdapter, slot: bool) -> Slotted | None:
        """After a RAM entry was made: metadata checks and the copy into a slot. None when not asked or no
        slot is free now (the caller's GPU step tries again and waits for one)."""
        if not slot:
            return None
        start = time.perf_counter()
        try:
            evicted = self.load_checked(host)
        except NoFreeSlotError:
            return None
        return Slotted(evicted, time.perf_counter() - start)

    def load_checked(self, host: HostAdapter) -> str | None:
        """Metadata checks (promote.check_fits), then the slot write, the slot left pinned once (see
        Slotted); returns the idle adapter evicted."""
        check_fits(host, self.spec, self.gpu.row_layout(host.rank))
        return self.gpu.load(host, hold=True).evicted

    def read_disk(self, disk: DiskTier, name: str, record: AdapterRecord, slot: bool) -> ReadBack:
        """One read of the disk tier's entry, proven by its identities (or hashed if unverified).

        With `slot`, a verified entry whose file is its RAM entry's buffer (a view layout) is written into a
        reserved slot chunk by chunk as the read lands (on CUDA the copies overlap the read); the slot is
        made ready only once the whole file is proven, and given back if it is not."""
        if not disk.pin(name):
            raise ChecksumMismatchError("the local copy was evicted before it was read")
        verified = disk.verified(name)
        layout_known: Layout | None = verified.layout if verified is not None else None
        write = self._begin_streamed(record.adapter_id, layout_known) if slot else None
        start = time.perf_counter()
        try:
            digests = entry_digests(name)
            read = read_entry(
                disk.path(name),
                verified,
                weights_digest=digests.weights,
                config_digest=digests.config,
                adapter_id=record.adapter_id,
                base_model_hash=record.base_model_hash,
                spec=self.spec,
                dtype=self.gpu.dtype,
                pin=self.pin_host,
                row_for=self.gpu.row_layout,
                sink=self._sink(write, layout_known.start) if write is not None and layout_known else None,
            )
            if write is not None:
                check_fits(read.host, self.spec, self.gpu.row_layout(read.host.rank))
                self.gpu.finish(write, read.host, hold=True)
        except ChecksumMismatchError:
            disk.drop_corrupt(name)
            raise
        finally:
            if write is not None:
                self.gpu.abort(write)  # a no-op once finished
            disk.unpin(name)
        if verified is None:
            disk.settle(name, read.seen, read.layout)  # hashed just now: from here on its identities prove it
        if write is not None:
            return ReadBack(read.host, read.nbytes, Slotted(write.evicted, time.perf_counter() - start))
        return ReadBack(read.host, read.nbytes, self.into_slot(read.host, slot))

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
