"""The registry's own safetensors reader: malformed, oversized, pickled or non-finite files are rejected
with their code before any tensor is built; a well-formed adapter passes with its rank."""

from __future__ import annotations

import json
import pickle
import struct

import numpy as np
import pytest

from gateway.artifact_checks import ArtifactRejected, Expected, check_config, check_weights
from gateway.base_spec import BaseSpec

SPEC = BaseSpec.from_config(
    {
        "hidden_size": 8,
        "intermediate_size": 12,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 2,
    }
)
EXPECTED = Expected(
    rank=2,
    alpha=4.0,
    target_modules=frozenset({"q_proj"}),
    max_rank=4,
    max_header_bytes=1 << 16,
    max_tensors=64,
)
PREFIX = "base_model.model.model.layers.{}.self_attn.q_proj.lora_{}.weight"


def build(tensors: dict[str, tuple[str, np.ndarray]], header_extra: dict | None = None) -> bytes:
    header, data, offset = {}, b"", 0
    for name, (dtype, arr) in tensors.items():
        raw = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    header.update(header_extra or {})
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + data


def good_tensors(a_rows: int = 2) -> dict[str, tuple[str, np.ndarray]]:
    # q_proj on this base: in 8, out 8 (2 heads x head_dim 4)
    return {
        PREFIX.format(0, "A"): ("F32", np.ones((a_rows, 8), np.float32)),
        PREFIX.format(0, "B"): ("F32", np.ones((8, a_rows), np.float32)),
    }


def code_of(blob: bytes, expected: Expected = EXPECTED) -> str:
    with pytest.raises(ArtifactRejected) as info:
        check_weights(blob, SPEC, expected)
    return info.value.code


def test_a_well_formed_adapter_passes_with_its_rank() -> None:
    assert check_weights(build(good_tensors()), SPEC, EXPECTED) == 2


def test_bf16_and_f16_nan_or_inf_are_found_by_bit_pattern() -> None:
    for dtype, bits in (("BF16", 0x7FC0), ("F16", 0x7C00)):
        a = np.zeros((2, 8), np.uint16)
        a[1, 3] = bits
        tensors = good_tensors()
        tensors[PREFIX.format(0, "A")] = (dtype, a)
        tensors[PREFIX.format(0, "B")] = (dtype, np.zeros((8, 2), np.uint16))
        assert code_of(build(tensors)) == "non_finite_weights"


@pytest.mark.parametrize(
    "blob, code",
    [
        (pickle.dumps({"w": 1}, protocol=4), "unsupported_format"),
        (b"PK\x03\x04" + b"\0" * 100, "unsupported_format"),
        (b"\x01\x02", "invalid_safetensors"),
        (struct.pack("<Q", 1 << 40) + b"{}", "invalid_safetensors"),
        (struct.pack("<Q", 2) + b"[]", "invalid_safetensors"),
    ],
)
def test_foreign_and_malformed_files_are_refused(blob: bytes, code: str) -> None:
    assert code_of(blob) == code


def test_overlapping_offsets_and_wrong_dtypes_are_refused() -> None:
    blob = bytearray(build(good_tensors()))
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8 : 8 + n])
    header[PREFIX.format(0, "B")]["data_offsets"] = [0, 64]
    assert code_of(build({}, header) + bytes(blob[8 + n :])) == "invalid_safetensors"
    tensors = good_tensors()
    tensors[PREFIX.format(0, "A")] = ("I64", np.ones((2, 8), np.int64))
    assert code_of(build(tensors)) == "invalid_safetensors"


def test_shapes_rank_and_modules_come_from_the_tensors() -> None:
    wrong_in = {
        PREFIX.format(0, "A"): ("F32", np.ones((2, 7), np.float32)),
        PREFIX.format(0, "B"): good_tensors()[PREFIX.format(0, "B")],
    }
    assert code_of(build(wrong_in)) == "shape_mismatch"
    assert code_of(build(good_tensors(a_rows=3))) == "rank_mismatch"
    assert code_of(build(good_tensors(a_rows=8)), EXPECTED) == "adapter_rank_exceeds_limit"
    layer_out_of_range = {k.replace("layers.0", "layers.9"): v for k, v in good_tensors().items()}
    assert code_of(build(layer_out_of_range)) == "unknown_target_module"
    only_a = {PREFIX.format(0, "A"): good_tensors()[PREFIX.format(0, "A")]}
    assert code_of(build(only_a)) == "shape_mismatch"


@pytest.mark.parametrize(
    "config, code",
    [
        (b"not json", "invalid_adapter_config"),
        (json.dumps({"lora_alpha": 4, "use_dora": True}).encode(), "invalid_adapter_config"),
        (json.dumps({"lora_alpha": 4, "modules_to_save": ["lm_head"]}).encode(), "invalid_adapter_config"),
        (json.dumps({"lora_alpha": 16}).encode(), "adapter_config_mismatch"),
    ],
)
def test_configs_we_do_not_serve_are_refused(config: bytes, code: str) -> None:
    with pytest.raises(ArtifactRejected) as info:
        check_config(config, EXPECTED)
    assert info.value.code == code
