"""Bytes -> a validated RAM-tier entry: check and pack an adapter held in one buffer of its file.

validate_and_pack() runs the same checks as replica.lora.weights.read_adapter, each with its own error: a
well-formed config we can serve, the base hash, a well-formed safetensors header (no pickle is ever opened),
known target modules, shapes and rank within the cap, an allowed dtype, then one NaN/Inf check over the
packed buffer. It also returns the file's Layout: what the header and config said, enough to pack the same
bytes again without parsing. When every tensor already has the slot dtype, the packed buffer is a view of
the file's data section (zero copies); otherwise each tensor is copied once, converting.

The NaN/Inf check runs each time bytes enter the RAM tier (from the object store or from disk); a RAM entry
is immutable and carries that verdict, so RAM -> slot only runs check_fits (metadata) before the copy.

read_entry() brings a disk-tier entry in with one readinto of one (pinned, with a GPU) buffer. A verified
entry is not hashed again: its open files must show the identities recorded at verification (before and
after the read) and its header bytes must equal the Layout's; then it is packed from the Layout, NaN check
included. A mismatch, a short read or a failed check raises ChecksumMismatchError (corruption: the caller
drops it and fetches again). An unverified entry (found at start-up) is hashed once, beside validation; a
digest mismatch wins over any validation error.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from replica.adapter_cache.errors import ChecksumMismatchError
from replica.adapter_cache.host import HostAdapter, PackedModule
from replica.adapter_cache.identity import FileIdentity, Identities
from replica.adapter_cache.object_store import _HASHER, MAX_CONFIG_BYTES, new_buffer
from replica.adapter_cache.safetensors_header import TORCH_DTYPES, parse_header
from replica.errors import (
    AdapterConfigError,
    AdapterError,
    AdapterNonFiniteError,
    AdapterRankTooLargeError,
    AdapterShapeError,
    AdapterTargetModuleError,
)
from replica.lora.spec import MODULE_PARENTS, AdapterSpec
from replica.lora.weights import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    ModuleKey,
    alpha_for,
    check_base_hash,
    check_shapes,
    module_key,
    parse_config,
    weights_path,
)


@dataclass(frozen=True)
class Layout:
    """How a validated file packs: its header bytes, and where each tensor goes in the packed buffer."""

    header: bytes  # the file's first 8 + header-length bytes
    start: int  # where the data section begins
    numel: int  # elements of the packed buffer
    view: bool  # the packed buffer is a view of the data section (file dtype == slot dtype, aligned)
    tensors: tuple[tuple[str, str, int, int, int], ...]  # (name, file dtype, byte begin, byte end, offset)
    modules: tuple[PackedModule, ...]
    scales: tuple[float, ...]
    declared_base: str | None  # adapter_config.json's base_model_hash


def validate_and_pack(
    buf: torch.Tensor,
    config: bytes,
    adapter_id: str,
    base_model_hash: str | None,
    spec: AdapterSpec,
    dtype: torch.dtype,
    pin: bool,
    digest: str,
) -> tuple[HostAdapter, Layout]:
    """buf [file bytes] uint8 -> (validated RAM entry, the file's layout); an AdapterError subclass if not."""
    raw = parse_config(config)
    declared = raw.get("base_model_hash")
    check_base_hash(spec.base_model_hash, base_model_hash or declared)
    entries, start = parse_header(buf)
    pairs: dict[ModuleKey, dict[str, str]] = {}
    for key in entries:
        mkey, which = module_key(key, spec)
        pairs.setdefault(mkey, {})[which] = key
    if not pairs:
        raise AdapterTargetModuleError("the adapter has no LoRA tensors")
    for (layer, name), pair in pairs.items():
        check_shapes(layer, name, {w: entries[k].shape for w, k in pair.items()}, spec)
    for key in sorted(entries):
        if entries[key].dtype not in TORCH_DTYPES:
            raise AdapterConfigError(f"tensor {key} has dtype {entries[key].dtype}", param=key)
    # Zero copies when the file already holds the slot dtype, aligned: flat is the file's data section.
    itemsize = dtype.itemsize
    view = start % itemsize == 0 and all(
        TORCH_DTYPES[e.dtype] == dtype and e.begin % itemsize == 0 for e in entries.values()
    )
    offset_of, cursor = {}, 0
    for k, e in sorted(entries.items(), key=lambda kv: kv[1].begin):
        offset_of[k] = (e.begin - start) // itemsize if view else cursor
        cursor += math.prod(e.shape)
    use_rslora = bool(raw.get("use_rslora", False))
    modules: list[PackedModule] = []
    scales: list[float] = []
    for (layer, name), pair in sorted(pairs.items()):
        a, b = entries[pair["A"]], entries[pair["B"]]
        rank = a.shape[0]
        modules.append(
            PackedModule((layer, name), rank, offset_of[pair["A"]], a.shape, offset_of[pair["B"]], b.shape)  # type: ignore[arg-type]
        )
        alpha = alpha_for(raw, f"model.layers.{layer}.{MODULE_PARENTS[name]}.{name}")
        scales.append(alpha / math.sqrt(rank) if use_rslora else alpha / rank)
    layout = Layout(
        header=bytes(buf[:start].numpy()),
        start=start,
        numel=cursor,
        view=view,
        tensors=tuple(sorted((k, e.dtype, e.begin, e.end, offset_of[k]) for k, e in entries.items())),
        modules=tuple(modules),
        scales=tuple(scales),
        declared_base=declared if isinstance(declared, str) else None,
    )
    return pack(buf, layout, adapter_id, base_model_hash, spec, dtype, pin, digest), layout


def pack(
    buf: torch.Tensor,
    layout: Layout,
    adapter_id: str,
    base_model_hash: str | None,
    spec: AdapterSpec,
    dtype: torch.dtype,
    pin: bool,
    digest: str,
) -> HostAdapter:
    """buf [file bytes] with a known layout -> RAM entry: base hash, the NaN/Inf check, the packed buffer."""
    check_base_hash(spec.base_model_hash, base_model_hash or layout.declared_base)
    if layout.view:
        flat = buf[layout.start :].view(dtype)  # [numel] in the slot dtype, a view of the file buffer
    else:
        flat = torch.empty(layout.numel, dtype=dtype, pin_memory=pin)  # [numel]
        for _name, file_dtype, begin, end, offset in layout.tensors:
            src = buf[begin:end].view(TORCH_DTYPES[file_dtype])  # [numel of the tensor] in the file dtype
            flat[offset : offset + src.numel()].copy_(src)
    # One pass: a sum is NaN or Inf when any element is (or when finite values overflow: then the exact
    # per-tensor check finds nothing and the adapter passes).
    if not bool(torch.isfinite(flat.sum(dtype=torch.float32))):
        _raise_non_finite(flat, layout)
    scales = torch.tensor(layout.scales, dtype=torch.float32)  # [num_modules]
    if pin:
        scales = scales.pin_memory()
    rank = max(m.rank for m in layout.modules)
    return HostAdapter(adapter_id, digest, rank, flat, scales, layout.modules, spec.base_model_hash)


def _raise_non_finite(flat: torch.Tensor, layout: Layout) -> None:
    """After a non-finite sum: name the first tensor holding NaN or Inf (none: the sum only overflowed)."""
    for name, file_dtype, begin, end, offset in layout.tensors:
        n = (end - begin) // TORCH_DTYPES[file_dtype].itemsize
        if not bool(torch.isfinite(flat[offset : offset + n]).all()):
            raise AdapterNonFiniteError(f"tensor {name} holds NaN or Inf", param=name)


def read_entry(
    path: Path,
    verified: tuple[Identities, Layout] | None,
    weights_digest: str,
    config_digest: str,
    adapter_id: str,
    base_model_hash: str | None,
    spec: AdapterSpec,
    dtype: torch.dtype,
    pin: bool,
) -> tuple[HostAdapter, int, Identities, Layout]:
    """Read one disk entry, prove it (verified) or hash it, and pack it.

    Returns (RAM entry, bytes read, the files' identities as read, the layout): the caller records the
    last two when the entry was unverified.
    """
    # a verified entry's file is proven by its identity; an unverified folder gets the full check (no pickles)
    wpath = path / WEIGHTS_NAME if verified is not None else weights_path(path)
    try:
        with open(wpath, "rb", buffering=0) as f:
            before = FileIdentity.of(os.fstat(f.fileno()))
            if verified is not None and before != verified[0][0]:
                raise ChecksumMismatchError(f"local copy of {adapter_id!r} changed after it was verified")
            buf, view = new_buffer(before.size, pin)  # [file bytes]
            got = f.readinto(view)
            after = FileIdentity.of(os.fstat(f.fileno()))
        with open(path / CONFIG_NAME, "rb", buffering=0) as f:
            config_id = FileIdentity.of(os.fstat(f.fileno()))
            config = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ChecksumMismatchError(f"local copy of {adapter_id!r} could not be read: {exc}") from exc
    seen = (after, config_id)
    nbytes = before.size + len(config)
    if got != before.size or after != before:
        raise ChecksumMismatchError(f"local copy of {adapter_id!r} changed while it was read")
    if verified is not None:
        ids, layout = verified
        if config_id != ids[1] or bytes(buf[: layout.start].numpy()) != layout.header:
            raise ChecksumMismatchError(f"local copy of {adapter_id!r} is not the one verified")
        try:
            host = pack(buf, layout, adapter_id, base_model_hash, spec, dtype, pin, weights_digest)
        except AdapterError as exc:  # the bytes proved to be the verified ones: a failure means corruption
            raise ChecksumMismatchError(f"local copy of {adapter_id!r} fails validation: {exc}") from exc
        return host, nbytes, seen, layout
    hashing = _HASHER.submit(lambda: hashlib.sha256(view).hexdigest())
    try:
        host, layout = validate_and_pack(
            buf, config, adapter_id, base_model_hash, spec, dtype, pin, weights_digest
        )
    except BaseException:
        _check_digests(hashing.result(), weights_digest, config, config_digest)
        raise
    _check_digests(hashing.result(), weights_digest, config, config_digest)
    return host, nbytes, seen, layout


def _check_digests(weights: str, want: str, config: bytes, want_config: str) -> None:
    if weights != want or hashlib.sha256(config).hexdigest() != want_config:
        raise ChecksumMismatchError("local copy does not match its digest")


def check_fits(
    host: HostAdapter, spec: AdapterSpec, known: dict[int, tuple[tuple[PackedModule, ...], int]]
) -> None:
    """Before a slot is written: the entry's base hash, rank and every module's shapes fit the served model.

    Metadata only (the bytes were checked when they entered RAM); the same errors as validation. `known`
    maps module tuples already checked against this spec to their largest rank (entries packed from one
    layout share one immutable tuple), so the per-module loop runs once per layout; the dict keeps each
    tuple alive, so its id is not reused.
    """
    check_base_hash(spec.base_model_hash, host.base_model_hash)
    if host.rank > spec.max_rank:
        raise AdapterRankTooLargeError(f"rank {host.rank} exceeds the cap {spec.max_rank}", param="r")
    modules, rank = known.get(id(host.modules), ((), 0))
    if modules is not host.modules:
        for m in host.modules:
            layer, name = m.key
            fit = spec.shapes.get(name)
            if fit is None or layer >= spec.num_layers:
                raise AdapterTargetModuleError(f"layer {layer} {name} is not adapted on this replica")
            if m.a_shape != (m.rank, fit[0]) or m.b_shape != (fit[1], m.rank):
                raise AdapterShapeError(f"layer {layer} {name}: {m.a_shape} / {m.b_shape} do not fit {fit}")
        rank = max(m.rank for m in host.modules)
        if len(known) >= 4096:
            known.clear()
        known[id(host.modules)] = (host.modules, rank)
    if host.rank != rank:
        raise AdapterRankTooLargeError(
            f"rank {host.rank} is not the adapter's largest rank {rank}", param="r"
        )
