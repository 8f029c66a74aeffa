"""Bytes -> a validated RAM-tier entry (validate_and_pack), and a disk entry read back (read_entry); what
is checked where, and why a verified disk entry is not hashed again: docs/adapter-cache.md."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from lorafleet.adapter_rules import caps
from lorafleet.adapter_rules.artifact import check_artifact, check_base
from lorafleet.adapter_rules.errors import AdapterRejected
from lorafleet.adapter_rules.finite import check_finite
from lorafleet.adapter_rules.safetensors_header import TensorEntry
from replica.adapter_cache.disk import Verified
from replica.adapter_cache.errors import ChecksumMismatchError
from replica.adapter_cache.host import HostAdapter, row_targets
from replica.adapter_cache.identity import FileIdentity, Identities
from replica.adapter_cache.object_store import _HASHER, new_buffer
from replica.errors import (
    AdapterError,
    AdapterRankTooLargeError,
    AdapterShapeError,
    AdapterTargetModuleError,
    NoFreeSlotError,
    adapter_error,
)
from replica.lora.row_layout import ModuleKey, RowLayout
from replica.lora.spec import AdapterSpec
from replica.lora.weights import CONFIG_NAME, TORCH_DTYPES, WEIGHTS_NAME, weights_path


class Place(NamedTuple):
    """Where one tensor of the file lands in the packed buffer:
    flat[offset : offset + rows * stride].view(rows, stride)[:, :cols]."""

    name: str
    file_dtype: str
    begin: int  # its bytes in the file
    end: int
    offset: int  # elements into the packed buffer
    rows: int
    cols: int
    stride: int


class Run(NamedTuple):
    """File bytes [begin, end) copied as one span to the packed buffer from element `offset`."""

    begin: int
    end: int
    offset: int


@dataclass(frozen=True)
class Layout:
    """How a validated file packs into its bucket's row layout, enough to pack the same bytes again."""

    header: bytes  # the file's first 8 + header-length bytes
    start: int  # where the data section begins
    numel: int  # elements of the packed buffer
    view: bool  # the data section is the packed buffer (slot dtype, aligned, bucket rank, row order)
    padded: bool  # some module's rank is below the bucket's: the buffer starts zeroed
    runs: tuple[Run, ...]  # same-dtype contiguous spans
    others: tuple[Place, ...]  # tensors copied one by one (padded B, or converting dtype)
    tensors: tuple[TensorEntry, ...]  # every tensor of the file, in the rules' check order
    targets: tuple[ModuleKey, ...]
    rank: int
    bucket: int
    scales: tuple[float, ...]
    declared_base: str | None  # adapter_config.json's base_model_hash


class Packed(NamedTuple):
    host: HostAdapter  # the validated RAM entry
    layout: Layout


class ReadEntry(NamedTuple):
    host: HostAdapter
    nbytes: int  # bytes read: the two files
    seen: Identities  # the files' identities as read
    layout: Layout


def validate_and_pack(
    buf: torch.Tensor,
    config: bytes,
    *,
    adapter_id: str,
    base_model_hash: str | None,
    digest: str,
    spec: AdapterSpec,
    dtype: torch.dtype,
    pin: bool,
    row_for: Callable[[int], RowLayout],
) -> Packed:
    """buf [file bytes] uint8 -> the validated RAM entry and the file's layout; an AdapterError subclass if
    not.

    row_for(rank) gives the slot-row layout of the bucket that holds the rank (GpuTier.row_layout).
    """
    try:
        checked = check_artifact(
            config,
            buf.numpy().data,
            spec,
            max_rank=spec.max_rank,
            served_base_hash=spec.base_model_hash,
            registered_base_hash=base_model_hash,
            check_values=False,
        )
    except AdapterRejected as exc:
        raise adapter_error(exc) from exc
    plan = checked.plan
    try:
        row = row_for(plan.rank)
    except NoFreeSlotError as exc:
        raise AdapterRankTooLargeError(f"rank {plan.rank}: {exc}", param="r") from exc
    targets = row_targets(list(plan.modules), row)
    places: list[Place] = []
    scales: list[float] = []
    offset = 0
    for key in targets:
        m = plan.modules[key]
        a, b = m.a, m.b
        fan_out, fan_in = b.shape[0], a.shape[1]
        places.append(Place(a.name, a.dtype, a.begin, a.end, offset, m.rank, fan_in, fan_in))
        offset += row.rank * fan_in
        places.append(Place(b.name, b.dtype, b.begin, b.end, offset, fan_out, m.rank, row.rank))
        offset += fan_out * row.rank
        scales.append(m.scale)
    layout = _layout(
        buf,
        places,
        dtype,
        start=checked.header.data_start,
        numel=offset,
        targets=targets,
        rank=plan.rank,
        bucket=row.rank,
        padded=any(m.rank < row.rank for m in plan.modules.values()),
        scales=scales,
        tensors=tuple(checked.tensors()),
        declared=checked.config.base_model_hash,
    )
    host = pack(
        buf,
        layout,
        adapter_id=adapter_id,
        base_model_hash=base_model_hash,
        digest=digest,
        spec=spec,
        dtype=dtype,
        pin=pin,
    )
    return Packed(host, layout)


def _layout(
    buf: torch.Tensor,
    places: list[Place],
    dtype: torch.dtype,
    *,
    start: int,
    numel: int,
    targets: tuple[ModuleKey, ...],
    rank: int,
    bucket: int,
    padded: bool,
    scales: list[float],
    tensors: tuple[TensorEntry, ...],
    declared: str | None,
) -> Layout:
    """Merge the placements into copy runs where source bytes and destination are both contiguous."""
    item = dtype.itemsize
    runs: list[Run] = []
    others: list[Place] = []
    for place in sorted(places, key=lambda p: p.begin):  # file order
        if TORCH_DTYPES[place.file_dtype] != dtype or place.cols != place.stride or place.begin % item:
            others.append(place)
        elif runs and runs[-1].end == place.begin and _run_ends_at(runs[-1], item) == place.offset:
            runs[-1] = runs[-1]._replace(end=place.end)
        else:
            runs.append(Run(place.begin, place.end, place.offset))
    view = not others and len(runs) == 1 and runs[0].begin == start and runs[0].offset == 0
    return Layout(
        header=bytes(buf[:start].numpy()),
        start=start,
        numel=numel,
        view=view and (buf.numel() - start) == numel * item,
        padded=padded,
        runs=tuple(runs),
        others=tuple(others),
        tensors=tensors,
        targets=targets,
        rank=rank,
        bucket=bucket,
        scales=tuple(scales),
        declared_base=declared,
    )


def _run_ends_at(run: Run, item: int) -> int:
    """The packed-buffer element just past the run."""
    return run.offset + (run.end - run.begin) // item


def pack(
    buf: torch.Tensor,
    layout: Layout,
    *,
    adapter_id: str,
    base_model_hash: str | None,
    digest: str,
    spec: AdapterSpec,
    dtype: torch.dtype,
    pin: bool,
    finite: bool | None = None,
) -> HostAdapter:
    """buf [file bytes] with a known layout -> RAM entry: base hash, the NaN/Inf check, the packed buffer.

    finite: True when the bytes are proven to be ones that already passed the NaN/Inf check (a verified
    disk entry); None runs the check here.
    """
    _check_base(spec.base_model_hash, base_model_hash, layout.declared_base)
    if layout.view:
        flat = buf[layout.start :].view(dtype)  # [numel] in the slot dtype, a view of the file buffer
    else:
        make = torch.zeros if layout.padded else torch.empty
        flat = make(layout.numel, dtype=dtype, pin_memory=pin)  # [numel]
        item = dtype.itemsize
        for run in layout.runs:
            flat[run.offset : _run_ends_at(run, item)].copy_(buf[run.begin : run.end].view(dtype))
        for p in layout.others:
            src = _typed(buf, p.begin, p.end, TORCH_DTYPES[p.file_dtype]).view(p.rows, p.cols)
            flat[p.offset : p.offset + p.rows * p.stride].view(p.rows, p.stride)[:, : p.cols].copy_(src)
    # One pass: a sum is NaN or Inf when any element is (or when finite values overflow: then the exact
    # per-tensor check finds nothing and the adapter passes).
    if finite is None:
        finite = bool(torch.isfinite(flat.sum(dtype=torch.float32)))
    if not finite:
        _raise_non_finite(buf, layout)
    scales = torch.tensor(layout.scales, dtype=torch.float32)  # [num_targets]
    if pin:
        scales = scales.pin_memory()
    return HostAdapter(
        adapter_id=adapter_id,
        digest=digest,
        rank=layout.rank,
        bucket=layout.bucket,
        targets=layout.targets,
        flat=flat,
        scales=scales,
        base_model_hash=spec.base_model_hash,
    )


def _check_base(served: str, registered: str | None, declared: str | None) -> None:
    try:
        check_base(served, registered, declared)
    except AdapterRejected as exc:
        raise adapter_error(exc) from exc


def _typed(buf: torch.Tensor, begin: int, end: int, dtype: torch.dtype) -> torch.Tensor:
    """buf[begin:end] as dtype; a misaligned span (a header that breaks the alignment) is copied first."""
    span = buf[begin:end]
    return (span if begin % dtype.itemsize == 0 else span.clone()).view(dtype)


def _raise_non_finite(buf: torch.Tensor, layout: Layout) -> None:
    """After a non-finite sum: the rules' own check names the tensor (none: the sum only overflowed)."""
    try:
        check_finite(buf.numpy().data, layout.tensors)
    except AdapterRejected as exc:
        raise adapter_error(exc) from exc


def read_entry(
    path: Path,
    verified: Verified | None,
    *,
    weights_digest: str,
    config_digest: str,
    adapter_id: str,
    base_model_hash: str | None,
    spec: AdapterSpec,
    dtype: torch.dtype,
    pin: bool,
    row_for: Callable[[int], RowLayout],
    sink: Callable[[torch.Tensor, int, int], None] | None = None,
) -> ReadEntry:
    """Read one disk entry, prove it (verified: its Layout) or hash it, and pack it.

    The caller records the identities seen and the layout when the entry was unverified. sink(buf, lo, hi),
    for a verified entry only, is called as
    each chunk buf[lo:hi] of the data section lands (a slot write that follows the read, chunk by chunk,
    while the chunk is in cache); the bytes are proven only when read_entry returns.
    """
    # a verified entry's file is proven by its identity; an unverified folder gets the full check (no pickles)
    try:  # a file or the whole folder may be gone (an operator's cleanup): corruption, fetched again
        wpath = path / WEIGHTS_NAME if verified is not None else weights_path(path)
        with open(wpath, "rb", buffering=0) as f:
            before = FileIdentity.of(os.fstat(f.fileno()))
            if verified is not None and before != verified.identities.weights:
                raise ChecksumMismatchError(f"local copy of {adapter_id!r} changed after it was verified")
            buf, view = new_buffer(before.size, pin)  # [file bytes]
            if sink is not None and verified is not None:
                got = _read_in_chunks(f, view, buf, verified.layout.start, sink)
            else:
                got = f.readinto(view)
            after = FileIdentity.of(os.fstat(f.fileno()))
        with open(path / CONFIG_NAME, "rb", buffering=0) as f:
            config_id = FileIdentity.of(os.fstat(f.fileno()))
            config = f.read(caps.MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ChecksumMismatchError(f"local copy of {adapter_id!r} could not be read: {exc}") from exc
    seen = Identities(after, config_id)
    nbytes = before.size + len(config)
    if got != before.size or after != before:
        raise ChecksumMismatchError(f"local copy of {adapter_id!r} changed while it was read")
    if verified is not None:
        layout: Layout = verified.layout
        if config_id != verified.identities.config or bytes(buf[: layout.start].numpy()) != layout.header:
            raise ChecksumMismatchError(f"local copy of {adapter_id!r} is not the one verified")
        try:
            # proven to be the bytes that passed validation, NaN/Inf check included: not checked again
            host = pack(
                buf,
                layout,
                adapter_id=adapter_id,
                base_model_hash=base_model_hash,
                digest=weights_digest,
                spec=spec,
                dtype=dtype,
                pin=pin,
                finite=True,
            )
        except AdapterError as exc:  # the bytes proved to be the verified ones: a failure means corruption
            raise ChecksumMismatchError(f"local copy of {adapter_id!r} fails validation: {exc}") from exc
        return ReadEntry(host, nbytes, seen, layout)
    hashing = _HASHER.submit(lambda: hashlib.sha256(view).hexdigest())
    try:
        packed = validate_and_pack(
            buf,
            config,
            adapter_id=adapter_id,
            base_model_hash=base_model_hash,
            digest=weights_digest,
            spec=spec,
            dtype=dtype,
            pin=pin,
            row_for=row_for,
        )
    except BaseException:
        _check_digests(hashing.result(), weights_digest, config, config_digest)
        raise
    _check_digests(hashing.result(), weights_digest, config, config_digest)
    return ReadEntry(packed.host, nbytes, seen, packed.layout)


READ_CHUNK_BYTES = 1 << 20  # a host-to-device copy per MiB: large enough to run at full speed


def _read_in_chunks(
    f: io.FileIO,
    view: memoryview,
    buf: torch.Tensor,
    start: int,
    sink: Callable[[torch.Tensor, int, int], None],
) -> int:
    """readinto view, the header then chunks of the data section, each handed to sink once it landed."""
    size, got = len(view), 0
    bounds = [0, min(start, size), *range(start + READ_CHUNK_BYTES, size, READ_CHUNK_BYTES), size]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        while got < hi:
            n = f.readinto(view[got:hi])
            if not n:
                return got  # a short file: the caller sees got < size
            got += n
        if lo >= start and hi > lo:
            sink(buf, lo, hi)
    return got


def _check_digests(weights: str, want: str, config: bytes, want_config: str) -> None:
    if weights != want or hashlib.sha256(config).hexdigest() != want_config:
        raise ChecksumMismatchError("local copy does not match its digest")


def check_fits(host: HostAdapter, spec: AdapterSpec, row: RowLayout) -> None:
    """Before a slot is written: the entry's base hash, rank, modules and buffer size fit the served model.

    Metadata only (the bytes were checked when they entered RAM); the same errors as validation. row is
    the layout of the bucket that holds host.rank (GpuTier.row_layout); its plans are cached per module set.
    """
    _check_base(spec.base_model_hash, host.base_model_hash, None)
    if host.rank > spec.max_rank:
        raise AdapterRankTooLargeError(f"rank {host.rank} exceeds the cap {spec.max_rank}", param="r")
    if host.bucket != row.rank:
        raise AdapterRankTooLargeError(
            f"packed for rank {host.bucket}, its slots are rank {row.rank}", param="r"
        )
    try:
        plan = row.plan(host.targets)
    except (KeyError, ValueError) as exc:
        raise AdapterTargetModuleError(
            f"modules {list(host.targets)} are not adapted on this replica"
        ) from exc
    if plan.numel != host.flat.numel() or plan.num_scales != host.scales.numel():
        raise AdapterShapeError(
            f"buffer of {host.flat.numel()} elements / {host.scales.numel()} scales; "
            f"the slot row needs {plan.numel} / {plan.num_scales}"
        )
