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

from replica.adapter_cache.errors import ChecksumMismatchError
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.host import HostAdapter, PackedModule, pack
from replica.adapter_cache.identity import FileIdentity
from replica.adapter_cache.promote import Layout, check_fits, read_entry, validate_and_pack
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
from replica.lora.weights import read_adapter
from tests.replica.adapter_cache.helpers import BASE_HASH, SPEC, make_layers, slot_holds, write_peft

WEIGHTS = "adapter_model.safetensors"
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read(folder: Path, dtype: torch.dtype = torch.float32, digest: str | None = None, identities=None):
    """An unverified disk entry (hashed on this read), or a verified one when identities are given."""
    verified = None if identities is None else (identities, _layout(folder))
    host, nbytes, _seen, _layout_read = read_entry(
        folder,
        verified,
        digest or _sha(folder / WEIGHTS),
        _sha(folder / "adapter_config.json"),
        "a",
        BASE_HASH,
        SPEC,
        dtype,
        pin=False,
    )
    return host, nbytes


def _downloaded(folder: Path, dtype: torch.dtype = torch.float32) -> HostAdapter:
    """The same bytes as they arrive from the object store: one buffer, then validate_and_pack."""
    buf = torch.frombuffer(bytearray((folder / WEIGHTS).read_bytes()), dtype=torch.uint8)
    config = (folder / "adapter_config.json").read_bytes()
    return validate_and_pack(buf, config, "a", BASE_HASH, SPEC, dtype, False, _sha(folder / WEIGHTS))[0]


_LAYOUTS: dict[Path, Layout] = {}


def _layout(folder: Path) -> Layout:
    """The layout validation learned the first time these bytes were checked."""
    if folder not in _LAYOUTS:
        buf = torch.frombuffer(bytearray((folder / WEIGHTS).read_bytes()), dtype=torch.uint8)
        config = (folder / "adapter_config.json").read_bytes()
        _LAYOUTS[folder] = validate_and_pack(buf, config, "a", BASE_HASH, SPEC, torch.float32, False, "d")[1]
    return _LAYOUTS[folder]


def _identities(folder: Path) -> tuple[FileIdentity, FileIdentity]:
    return FileIdentity.of((folder / WEIGHTS).stat()), FileIdentity.of(
        (folder / "adapter_config.json").stat()
    )


def _tensors(fn: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        t = load_file(d / WEIGHTS)
        fn(t)
        save_file(t, d / WEIGHTS)

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
    "dora": (
        lambda d: (d / "adapter_config.json").write_text(json.dumps({"lora_alpha": 8, "use_dora": True})),
        AdapterConfigError,
    ),
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
        AdapterConfigError,
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
    assert type(fast.value) is type(slow.value) is error
    with pytest.raises(error) as downloaded:
        _downloaded(tmp_path)
    assert type(downloaded.value) is error
    if case == "non_finite":
        assert Q_A in str(fast.value) and Q_A in str(slow.value)


def test_the_wrong_base_hash_is_refused(tmp_path: Path) -> None:
    write_peft(tmp_path, seed=1)
    with pytest.raises(AdapterBaseMismatchError):
        read_entry(tmp_path, None, _sha(tmp_path / WEIGHTS), _sha(tmp_path / "adapter_config.json"), "a",
                   "sha256:" + "c" * 64, SPEC, torch.float32, pin=False)  # fmt: skip


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
        _read(tmp_path, identities=(_identities(tmp_path)[0], ids[1]))


def test_a_verified_entry_whose_header_or_values_went_bad_is_corruption_not_a_bad_adapter(
    tmp_path: Path,
) -> None:
    write_peft(tmp_path, seed=1)
    _layout(tmp_path)
    _header_too_long(tmp_path)  # a header that is not the one validated
    with pytest.raises(ChecksumMismatchError):  # dropped and fetched again by the cache
        _read(tmp_path, identities=_identities(tmp_path))
    write_peft(tmp_path, seed=1)
    _tensors(_nan)(tmp_path)  # same header, an Inf in the data: the NaN/Inf check on entering RAM
    assert (tmp_path / WEIGHTS).read_bytes()[: _layout(tmp_path).start] == _layout(tmp_path).header
    with pytest.raises(ChecksumMismatchError):
        _read(tmp_path, identities=_identities(tmp_path))


def test_metadata_checks_before_a_slot_refuse_an_entry_that_does_not_fit(tmp_path: Path) -> None:
    write_peft(tmp_path, seed=1)
    host, _ = _read(tmp_path)
    check_fits(host, SPEC, {})
    with pytest.raises(AdapterBaseMismatchError):
        check_fits(replace(host, base_model_hash="sha256:" + "c" * 64), SPEC, {})
    with pytest.raises(AdapterRankTooLargeError):
        check_fits(host, replace(SPEC, max_rank=2), {})
    with pytest.raises(AdapterShapeError):
        check_fits(host, replace(SPEC, shapes={**SPEC.shapes, "q_proj": (16, 32)}), {})
    with pytest.raises(AdapterTargetModuleError):
        check_fits(host, replace(SPEC, num_layers=1), {})
    known: dict = {}
    check_fits(host, SPEC, known)  # the shapes of this layout are checked once...
    with pytest.raises(AdapterBaseMismatchError):  # ...the base hash and rank every time
        check_fits(replace(host, base_model_hash="sha256:" + "c" * 64), SPEC, known)
    with pytest.raises(AdapterRankTooLargeError):
        check_fits(replace(host, rank=9), SPEC, known)
    with pytest.raises(AdapterRankTooLargeError):  # a rank that is not its modules' (the wrong bucket)
        check_fits(replace(host, rank=2), SPEC, known)
    bad = replace(host, modules=(replace(host.modules[0], a_shape=(4, 3)), *host.modules[1:]))
    with pytest.raises(AdapterShapeError):  # another layout is checked in full
        check_fits(bad, SPEC, known)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packs_the_same_weights_and_scales_as_read_adapter(dtype: torch.dtype, tmp_path: Path) -> None:
    write_peft(tmp_path, seed=3, rank=4, alpha=6.0)
    host, nbytes = _read(tmp_path, dtype)
    ref = pack(read_adapter(tmp_path, "a", SPEC, BASE_HASH), host.digest, dtype, pin=False)
    assert nbytes == sum(p.stat().st_size for p in tmp_path.iterdir())
    assert host.rank == ref.rank == 4 and host.flat.dtype == dtype and host.layout == ref.layout
    assert torch.equal(host.scales, ref.scales) and host.scales[0].item() == 6.0 / 4
    for (a, b), (ra, rb) in zip(host.views(host.flat), ref.views(ref.flat), strict=True):
        assert torch.equal(a, ra) and torch.equal(b, rb)


def test_a_slot_takes_the_right_weights_whatever_the_buffer_order(tmp_path: Path) -> None:
    layers = make_layers({8: 1})
    gpu = GpuTier(layers, {8: 1})
    one, two = write_peft(tmp_path / "one", seed=1), write_peft(tmp_path / "two", seed=2)
    from_file, _ = _read(tmp_path / "one")  # file order (the zero-copy view)
    packed = _reversed(pack(read_adapter(tmp_path / "two", "b", SPEC, BASE_HASH), "d", torch.float32, False))
    assert from_file.layout == packed.layout and from_file.signature != packed.signature
    for host, tensors in ((from_file, one), (packed, two), (from_file, one)):
        ref, _ = gpu.load(host)
        assert slot_holds(layers, ref, tensors)
        assert gpu.remove(host.adapter_id)


def _reversed(host: HostAdapter) -> HostAdapter:
    """The same adapter with its tensors laid out in the opposite order in the buffer."""
    pieces, modules, offset = [], [], 0
    for m, (a, b) in reversed(list(zip(host.modules, host.views(host.flat), strict=True))):
        b_off, a_off, offset = offset, offset + b.numel(), offset + b.numel() + a.numel()
        pieces += [b.reshape(-1), a.reshape(-1)]
        modules.append(PackedModule(m.key, m.rank, a_off, m.a_shape, b_off, m.b_shape))
    order = sorted(range(len(modules)), key=lambda j: modules[j].key)
    scales = host.scales.flip(0)[order]
    return HostAdapter(host.adapter_id, host.digest, host.rank, torch.cat(pieces), scales,
                       tuple(modules[j] for j in order))  # fmt: skip
