"""Bytes -> RAM entry packs what read_adapter validates and refuses what it refuses, error for error, from a
download (validate_and_pack) and from disk (read_entry); a disk entry is proven by its identities, not hashed."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from replica.adapter_cache.disk import Verified
from replica.adapter_cache.errors import ChecksumMismatchError
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.host import HostAdapter, pack
from replica.adapter_cache.identity import FileIdentity, Identities
from replica.adapter_cache.promote import Layout, Packed, check_fits, read_entry, validate_and_pack
from replica.errors import (
    AdapterBaseMismatchError,
    AdapterConfigError,
    AdapterError,
    AdapterNonFiniteError,
    AdapterNotSafetensorsError,
    AdapterRankTooLargeError,
    AdapterShapeError,
    AdapterTargetModuleError,
)
from replica.lora.row_layout import RowLayout
from replica.lora.weights import read_adapter
from tests.replica.adapter_cache.helpers import BASE_HASH, SPEC, make_layers, row_for, slot_holds, write_peft

WEIGHTS = "adapter_model.safetensors"
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read(folder: Path, dtype: torch.dtype = torch.float32, digest: str | None = None, identities=None):
    """An unverified disk entry (hashed on this read), or a verified one when identities are given."""
    verified = None if identities is None else Verified(identities, _layout(folder))
    read = read_entry(
        folder,
        verified,
        weights_digest=digest or _sha(folder / WEIGHTS),
        config_digest=_sha(folder / "adapter_config.json"),
        adapter_id="a",
        base_model_hash=BASE_HASH,
        spec=SPEC,
        dtype=dtype,
        pin=False,
        row_for=row_for,
    )
    return read.host, read.nbytes


def _downloaded(folder: Path, dtype: torch.dtype = torch.float32) -> HostAdapter:
    """The same bytes as they arrive from the object store: one buffer, then validate_and_pack."""
    buf = torch.frombuffer(bytearray((folder / WEIGHTS).read_bytes()), dtype=torch.uint8)
    config = (folder / "adapter_config.json").read_bytes()
    return _validate(buf, config, dtype, _sha(folder / WEIGHTS)).host


def _validate(buf: torch.Tensor, config: bytes, dtype: torch.dtype, digest: str) -> Packed:
    return validate_and_pack(
        buf,
        config,
        adapter_id="a",
        base_model_hash=BASE_HASH,
        digest=digest,
        spec=SPEC,
        dtype=dtype,
        pin=False,
        row_for=row_for,
    )


_LAYOUTS: dict[Path, Layout] = {}


def _layout(folder: Path) -> Layout:
    """The layout validation learned the first time these bytes were checked."""
    if folder not in _LAYOUTS:
        buf = torch.frombuffer(bytearray((folder / WEIGHTS).read_bytes()), dtype=torch.uint8)
        config = (folder / "adapter_config.json").read_bytes()
        _LAYOUTS[folder] = _validate(buf, config, torch.float32, "d").layout
    return _LAYOUTS[folder]


def _identities(folder: Path) -> Identities:
    return Identities(
        FileIdentity.of((folder / WEIGHTS).stat()), FileIdentity.of((folder / "adapter_config.json").stat())
    )


def _tensors(fn: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        t = load_file(d / WEIGHTS)
        fn(t)
        save_file(t, d / WEIGHTS)

    return edit


def _config(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        raw = json.loads((d / "adapter_config.json").read_text())
        fn(raw)
        (d / "adapter_config.json").write_text(json.dumps(raw))

    return edit


def _truncate(d: Path) -> None:
    data = (d / WEIGHTS).read_bytes()
    (d / WEIGHTS).write_bytes(data[: len(data) - 100])


def _header_too_long(d: Path) -> None:
    data = (d / WEIGHTS).read_bytes()
    (d / WEIGHTS).write_bytes(struct.pack("<Q", 1 << 40) + data[8:])


def _nan(t: dict[str, torch.Tensor]) -> None:
    t[Q_A][1, 2] = float("inf")


CASES: dict[str, tuple[Callable[[Path], None], type[AdapterError]]] = {
    "garbage": (lambda d: (d / WEIGHTS).write_bytes(b"\xff" * 64), AdapterNotSafetensorsError),
    "truncated": (_truncate, AdapterNotSafetensorsError),
    "header_length": (_header_too_long, AdapterNotSafetensorsError),
    "bad_json": (lambda d: (d / "adapter_config.json").write_text("{nope"), AdapterConfigError),
    "dora": (_config(lambda c: c.update(use_dora=True)), AdapterConfigError),
    "config_rank": (_config(lambda c: c.update(r=2)), AdapterConfigError),
    "unknown_module": (
        _tensors(lambda t: t.update({"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 16)})),
        AdapterTargetModuleError,
    ),
    "rank_over_cap": (
        _tensors(
            lambda t: t.update({Q_A: torch.zeros(16, 16), Q_A.replace("_A", "_B"): torch.zeros(16, 16)})
        ),
        AdapterRankTooLargeError,
    ),
    "wrong_shape": (_tensors(lambda t: t.update({Q_A: torch.zeros(4, 3)})), AdapterShapeError),
    "int_dtype": (
        _tensors(lambda t: t.update({Q_A: torch.zeros(4, 16, dtype=torch.int32)})),
        AdapterNotSafetensorsError,
    ),
    "non_finite": (_tensors(_nan), AdapterNonFiniteError),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_bad_file_gets_the_same_error_as_read_adapter(case: str, tmp_path: Path) -> None:
    edit, error = CASES[case]
    write_peft(tmp_path, seed=1)
    edit(tmp_path)
    with pytest.raises(error) as fast:
        _read(tmp_path)
    with pytest.raises(error) as slow:
        read_adapter(tmp_path, "a", SPEC, BASE_HASH)
    assert type(fast.value) is type(slow.value) is error and fast.value.code == slow.value.code
    with pytest.raises(error) as downloaded:
        _downloaded(tmp_path)
    assert type(downloaded.value) is error and downloaded.value.code == fast.value.code
    if case == "non_finite":
        assert Q_A in str(fast.value) and Q_A in str(slow.value)


def test_the_wrong_base_hash_is_refused(tmp_path: Path) -> None:
    write_peft(tmp_path, seed=1)
    with pytest.raises(AdapterBaseMismatchError):
        read_entry(
            tmp_path,
            None,
            weights_digest=_sha(tmp_path / WEIGHTS),
            config_digest=_sha(tmp_path / "adapter_config.json"),
            adapter_id="a",
            base_model_hash="sha256:" + "c" * 64,
            spec=SPEC,
            dtype=torch.float32,
            pin=False,
            row_for=row_for,
        )


def test_a_digest_mismatch_wins_over_a_validation_error(tmp_path: Path) -> None:
    write_peft(tmp_path, seed=1)
    good = _sha(tmp_path / WEIGHTS)
    (tmp_path / WEIGHTS).write_bytes(b"\xff" * 64)  # corrupted after it was verified
    with pytest.raises(ChecksumMismatchError):
        _read(tmp_path, digest=good)
    write_peft(tmp_path, seed=1)
    with pytest.raises(ChecksumMismatchError):
        _read(tmp_path, digest="0" * 64)


def test_a_verified_entry_is_proven_by_its_identities_and_any_change_is_corruption(tmp_path: Path) -> None:
    write_peft(tmp_path, seed=1)
    _layout(tmp_path)
    ids = _identities(tmp_path)
    host, _ = _read(tmp_path, digest="0" * 64, identities=ids)  # not hashed: a wrong digest goes unseen
    assert host.rank == 4
    raw = bytearray((tmp_path / WEIGHTS).read_bytes())
    raw[-3] ^= 0xFF  # the same size, still parses, still finite: only the identity tells
    (tmp_path / WEIGHTS).write_bytes(bytes(raw))
    with pytest.raises(ChecksumMismatchError):
        _read(tmp_path, identities=ids)
    _read(tmp_path, identities=_identities(tmp_path))  # what a scrubber would have to catch
    (tmp_path / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
    with pytest.raises(ChecksumMismatchError):
        _read(tmp_path, identities=Identities(_identities(tmp_path).weights, ids.config))


def test_a_verified_entry_whose_header_went_bad_is_corruption_not_a_bad_adapter(tmp_path: Path) -> None:
    write_peft(tmp_path, seed=1)
    _layout(tmp_path)
    _header_too_long(tmp_path)  # a header that is not the one validated
    with pytest.raises(ChecksumMismatchError):  # dropped and fetched again by the cache
        _read(tmp_path, identities=_identities(tmp_path))
    # Values changed under unchanged identities (silent corruption) are not re-checked on promotion: the
    # identities prove the bytes that passed validation. test_verification's scrubber test covers them.


def test_metadata_checks_before_a_slot_refuse_an_entry_that_does_not_fit(tmp_path: Path) -> None:
    write_peft(tmp_path, seed=1)
    host, _ = _read(tmp_path)
    row = row_for(host.rank)
    check_fits(host, SPEC, row)
    with pytest.raises(AdapterBaseMismatchError):
        check_fits(replace(host, base_model_hash="sha256:" + "c" * 64), SPEC, row)
    with pytest.raises(AdapterRankTooLargeError):
        check_fits(host, replace(SPEC, max_rank=2), row)
    with pytest.raises(AdapterRankTooLargeError):  # packed for another bucket than its slots'
        check_fits(host, SPEC, RowLayout(16, row.modules))
    with pytest.raises(AdapterTargetModuleError):  # a module this replica does not adapt
        check_fits(host, SPEC, RowLayout(8, tuple(m for m in row.modules if m[0][0] == 0)))
    with pytest.raises(AdapterShapeError):  # a buffer that is not the row plan's size
        check_fits(replace(host, flat=host.flat[:-1]), SPEC, row)
    with pytest.raises(AdapterShapeError):
        check_fits(replace(host, scales=host.scales[:-1]), SPEC, row)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packs_the_same_weights_and_scales_as_read_adapter(dtype: torch.dtype, tmp_path: Path) -> None:
    write_peft(tmp_path, seed=3, rank=4, alpha=6.0)
    host, nbytes = _read(tmp_path, dtype)
    row = row_for(4)
    ref = pack(read_adapter(tmp_path, "a", SPEC, BASE_HASH), host.digest, dtype, False, row)
    assert nbytes == sum(p.stat().st_size for p in tmp_path.iterdir())
    assert host.rank == ref.rank == 4 and host.bucket == ref.bucket == 8 and host.targets == ref.targets
    assert host.flat.dtype == dtype and torch.equal(host.flat, ref.flat)
    assert torch.equal(host.scales, ref.scales) and host.scales[0].item() == 6.0 / 4
    for a, b in host.views(row):  # padded past rank 4 with zeros
        assert a[4:].abs().sum() == 0 and b[:, 4:].abs().sum() == 0 and a[:4].abs().sum() > 0


@pytest.mark.parametrize(
    "rank, modules, view",
    [(8, None, True), (4, None, False), (8, ("v_proj",), True), (4, ("q_proj",), False)],
    ids=["bucket_rank_all_modules_zero_copy", "padded", "v_only", "q_only_padded"],
)
def test_a_slot_takes_exactly_the_adapter_whatever_its_rank_and_modules(
    tmp_path: Path, rank: int, modules: tuple[str, ...] | None, view: bool
) -> None:
    """One slot, written in turn by a full entry, then this one, then the full one again: every module
    holds exactly the current adapter's weights, and the modules it does not adapt are zero."""
    layers = make_layers({8: 1})
    gpu = GpuTier(layers, {8: 1})
    full = write_peft(tmp_path / "full", seed=1, rank=8)
    other = write_peft(tmp_path / "other", seed=2, rank=rank, modules=modules)
    full_host, _ = _read(tmp_path / "full")
    other_host, _ = _read(tmp_path / "other")
    assert _layout(tmp_path / "other").view is view
    if view:  # the file's data section is the RAM entry: no copy was made (its storage holds the header)
        assert other_host.flat.untyped_storage().nbytes() > other_host.flat.nbytes
    for host, tensors in ((full_host, full), (other_host, other), (full_host, full)):
        ref, _ = gpu.load(host)
        assert slot_holds(layers, ref, tensors)
        assert gpu.remove(host.adapter_id)
