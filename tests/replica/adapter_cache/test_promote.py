"""The one-read disk -> RAM path packs what read_adapter validates and refuses what it refuses, error for error."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from replica.adapter_cache.errors import ChecksumMismatchError
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.host import HostAdapter, PackedModule, pack
from replica.adapter_cache.promote import read_entry
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


def _read(folder: Path, dtype: torch.dtype = torch.float32, digest: str | None = None):
    return read_entry(
        folder,
        digest or _sha(folder / WEIGHTS),
        _sha(folder / "adapter_config.json"),
        "a",
        BASE_HASH,
        SPEC,
        dtype,
        pin=False,
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
    if case == "non_finite":
        assert Q_A in str(fast.value) and Q_A in str(slow.value)


def test_the_wrong_base_hash_is_refused(tmp_path: Path) -> None:
    write_peft(tmp_path, seed=1)
    with pytest.raises(AdapterBaseMismatchError):
        read_entry(tmp_path, _sha(tmp_path / WEIGHTS), _sha(tmp_path / "adapter_config.json"), "a",
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
