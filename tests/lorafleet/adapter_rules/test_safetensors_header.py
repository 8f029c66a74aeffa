"""The bounded safetensors header parse: what the safetensors library writes parses to the same tensors,
and every breach of the format or of the bounds is refused with its code, without a big allocation."""

from __future__ import annotations

import json
import pickle
import struct
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save

from lorafleet.adapter_rules.errors import AdapterRejected
from lorafleet.adapter_rules.safetensors_header import MAX_HEADER_BYTES, MAX_TENSORS, parse_header
from tests.lorafleet.adapter_rules.artifacts import serialize


def _code(blob: bytes) -> str:
    with pytest.raises(AdapterRejected) as info:
        parse_header(blob)
    return info.value.code.value


def _file(header: dict, data: bytes = b"") -> bytes:
    return serialize(header, data)


GOOD = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}


def test_files_the_safetensors_library_writes_parse_to_the_same_tensors() -> None:
    tensors = {
        "a": torch.randn(3, 5),
        "b": torch.randn(7, 2).to(torch.bfloat16),
        "c": torch.randn(4).to(torch.float16),
        "empty": torch.zeros(0, 3),
    }
    blob = save(tensors, metadata={"format": "pt"})
    header = parse_header(blob)
    assert set(header.tensors) == set(tensors)
    for name, t in tensors.items():
        entry = header.tensors[name]
        assert entry.shape == tuple(t.shape)
        got = torch.frombuffer(bytearray(blob[entry.begin : entry.end]), dtype=t.dtype) if t.numel() else t
        assert torch.equal(got.view(t.shape), t)


def test_a_header_length_whose_low_byte_looks_like_pickle_is_still_safetensors() -> None:
    header = dict(GOOD)
    header["__metadata__"] = {"pad": "x" * (0x280 - len(json.dumps(GOOD)) - 30)}
    blob = _file(header, bytes(16))
    n = struct.unpack("<Q", blob[:8])[0]
    header["__metadata__"]["pad"] += "x" * (0x280 - n)
    blob = _file(header, bytes(16))
    assert blob[:2] == b"\x80\x02"  # the pickle protocol-2 magic, by accident
    assert set(parse_header(blob).tensors) == {"w"}


@pytest.mark.parametrize(
    "blob, code",
    [
        (pickle.dumps({"w": [1.0]}, protocol=4), "unsupported_format"),
        (b"PK\x03\x04" + bytes(60), "unsupported_format"),
        (b"\x01\x02", "invalid_safetensors"),
        (struct.pack("<Q", 1 << 40) + b"{}", "invalid_safetensors"),
        (struct.pack("<Q", 2) + b"[]", "invalid_safetensors"),
        (_file({}), "invalid_safetensors"),
        (_file({"__metadata__": {"format": 1}, **GOOD}, bytes(16)), "invalid_safetensors"),
        (_file({"w": {**GOOD["w"], "dtype": "I64"}}, bytes(32)), "unsupported_dtype"),
        (_file({"w": {**GOOD["w"], "dtype": "Q4"}}, bytes(16)), "invalid_safetensors"),
        (_file({"w": {**GOOD["w"], "shape": [True, 4]}}, bytes(16)), "invalid_safetensors"),
        (_file({"w": {**GOOD["w"], "shape": [2.0, 2]}}, bytes(16)), "invalid_safetensors"),
        (_file({"w": {**GOOD["w"], "extra": 1}}, bytes(16)), "invalid_safetensors"),
        (_file(GOOD, bytes(15)), "invalid_safetensors"),
        (_file(GOOD, bytes(17)), "invalid_safetensors"),
        (_file({**GOOD, "v": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, bytes(16)), "invalid_safetensors"),
        (_file({**GOOD, "v": {"dtype": "F32", "shape": [1], "data_offsets": [20, 24]}}, bytes(24)), "invalid_safetensors"),
    ],
    ids=[
        "pickle", "zip", "short", "length_past_the_file", "not_an_object", "no_tensors", "bad_metadata", "int64",
        "unknown_dtype", "bool_dim", "float_dim", "extra_field", "short_data", "trailing_bytes", "overlap", "gap",
    ],
)  # fmt: skip
def test_breaches_are_refused_with_their_code(blob: bytes, code: str) -> None:
    assert _code(blob) == code


@pytest.mark.parametrize(
    "text",
    [
        '{"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}',
        '{"w": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 16]}}',
        '{"w": {"dtype": "F32", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 16]}}',
        '{"a":' * 100000 + "1" + "}" * 100000,
        '{"w": "\udcff"}',
    ],
    ids=["duplicate_key", "nan_literal", "huge_integer", "deep_nesting", "lone_surrogate"],
)
def test_the_header_must_be_strict_json(text: str) -> None:
    blob = struct.pack("<Q", len(text.encode("utf-8", "surrogatepass"))) + text.encode(
        "utf-8", "surrogatepass"
    )
    assert _code(blob + bytes(16)) == "invalid_safetensors"


def test_bounds_on_the_header_and_the_tensor_count() -> None:
    over = b"{" + b" " * MAX_HEADER_BYTES + b"}"
    assert _code(struct.pack("<Q", len(over)) + over) == "invalid_safetensors"
    many = {f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(MAX_TENSORS + 1)}
    assert _code(_file(many)) == "invalid_safetensors"
    ok = {f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(MAX_TENSORS)}
    assert len(parse_header(_file(ok)).tensors) == MAX_TENSORS


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 200), st.binary(max_size=8))
def test_random_bytes_never_crash_or_hang(junk: bytes, at: int, patch: bytes) -> None:
    base = bytearray(_file({**GOOD, "__metadata__": {"format": "pt"}}, np.ones(4, np.float32).tobytes()))
    at = min(at, len(base))
    for blob in (junk, bytes(base[:at] + patch + base[at + len(patch) :])):
        start = time.perf_counter()
        try:
            parse_header(blob)
        except AdapterRejected as exc:
            assert exc.code.value in {"invalid_safetensors", "unsupported_format", "unsupported_dtype"}
        assert time.perf_counter() - start < 1.0
