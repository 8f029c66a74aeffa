"""Fuzzing the adapter parsers with structured input: random JSON headers (huge, negative and float
integers, deep nesting, claimed tensors far larger than the file) and random adapter_config.json objects.

Each parse either succeeds or raises the parser's own AdapterRejected; it never raises anything else, never
takes more than a second, and never allocates more than a small multiple of its input (tracemalloc's
peak), so a header that claims a 10 GB tensor or a 2^63-byte header is refused before any allocation.
"""

from __future__ import annotations

import json
import struct
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lorafleet.adapter_rules.artifact import check_artifact
from lorafleet.adapter_rules.errors import AdapterRejected
from lorafleet.adapter_rules.peft_config import parse_adapter_config
from lorafleet.adapter_rules.safetensors_header import parse_header
from replica.errors import ReplicaError
from replica.lora.spec import AdapterSpec
from replica.lora.weights import adapter_from_bytes, file_bytes
from tests.lorafleet.adapter_rules.artifacts import MAX_RANK, SERVED, SPEC, serialize

FUZZ = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
HEAP_SLACK = 2 << 20  # bytes a parse may allocate beyond a few copies of its input
REPLICA_SPEC = AdapterSpec(SPEC.num_layers, dict(SPEC.shapes), MAX_RANK, SERVED)

BIG_INTS = st.sampled_from([-1, -(2**63), 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**19, 10**30])
INTS = st.integers(-(2**70), 2**70) | BIG_INTS
SCALARS = (
    st.none()
    | st.booleans()
    | INTS
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["F32", "F16", "BF16", "I64", "F64", "none", "all-linear", ".*", "q_proj"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _bounded(parse: Callable[[bytes], Any], blob: bytes) -> None:
    """parse(blob) returns or raises AdapterRejected, in under a second, within a bounded heap."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        parse(blob)
    except AdapterRejected:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.perf_counter() - start < 1.0
    assert peak < 8 * len(blob) + HEAP_SLACK, f"{peak} bytes for a {len(blob)}-byte input"


@st.composite
def entries(draw: st.DrawFn) -> Any:
    """A tensor entry: mostly well-typed with hostile numbers, sometimes any JSON at all."""
    if draw(st.integers(0, 4)) == 0:
        return draw(JSON)
    entry: dict[str, Any] = {
        "dtype": draw(st.sampled_from(["F32", "F16", "BF16", "I8", "F64", "f32", ""])),
        "shape": draw(st.lists(INTS | st.integers(0, 8), max_size=9)),
        "data_offsets": draw(st.lists(INTS | st.integers(0, 64), min_size=1, max_size=3)),
    }
    if draw(st.booleans()):
        entry[draw(st.sampled_from(["extra", "dtype", "shape"]))] = draw(JSON)
    return entry


@st.composite
def headers(draw: st.DrawFn) -> bytes:
    """A whole file: a JSON header of drawn entries, a declared length (true or hostile) and some data."""
    header = draw(st.dictionaries(st.text(max_size=40), entries(), max_size=6))
    if draw(st.booleans()):
        header["__metadata__"] = draw(JSON)
    text = json.dumps(header)
    if draw(st.integers(0, 5)) == 0:
        depth = draw(st.integers(1, 50_000))
        text = '{"w": ' + "[" * depth + "]" * depth + "}"  # deep nesting
    raw = text.encode()
    length = draw(st.sampled_from([len(raw), 0, 2**63, 2**64 - 1, 10 << 30, len(raw) + 1, len(raw) - 1]))
    data = draw(st.binary(max_size=64))
    return struct.pack("<Q", max(0, length)) + raw + data


@FUZZ
@given(headers())
def test_random_headers_are_refused_without_crash_hang_or_allocation(blob: bytes) -> None:
    _bounded(parse_header, blob)


@pytest.mark.parametrize(
    "header",
    [
        {"w": {"dtype": "F32", "shape": [50_000, 50_000], "data_offsets": [0, 10_000_000_000]}},
        {"w": {"dtype": "F32", "shape": [2**31, 2**31, 2**31], "data_offsets": [0, 2**63]}},
        {"w": {"dtype": "BF16", "shape": [10**19] * 8, "data_offsets": [0, 10**19]}},
    ],
)
def test_a_header_claiming_a_huge_tensor_is_refused_before_allocating(header: dict[str, Any]) -> None:
    blob = serialize(header, b"\0" * 16)
    _bounded(parse_header, blob)
    with pytest.raises(AdapterRejected):
        parse_header(blob)


@pytest.mark.parametrize("length", [2**63, 2**64 - 1, 10 << 30])
def test_a_header_length_past_the_file_is_refused_before_allocating(length: int) -> None:
    blob = struct.pack("<Q", length) + b'{"w": {}}'
    _bounded(parse_header, blob)
    with pytest.raises(AdapterRejected):
        parse_header(blob)


CONFIG_FIELDS = [
    "r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern", "target_modules", "exclude_modules",
    "layers_to_transform", "layers_pattern", "base_model_hash", "peft_type", "bias", "init_lora_weights",
    "use_dora", "modules_to_save", "task_type", "lora_dropout", "fan_in_fan_out", "unknown_feature",
]  # fmt: skip


@st.composite
def configs(draw: st.DrawFn) -> bytes:
    """adapter_config.json bytes: served fields with hostile values, or not JSON at all."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=80))  # invalid UTF-8 and plain garbage
    raw = draw(st.dictionaries(st.sampled_from(CONFIG_FIELDS) | st.text(max_size=8), JSON, max_size=8))
    text = json.dumps(raw)
    if kind == 1:
        text = text.replace("1", "NaN", 1).replace("2", "Infinity", 1)
    if kind == 2:
        depth = draw(st.integers(1, 50_000))
        text = '{"r": ' + "[" * depth + "]" * depth + "}"
    if kind == 3:
        text = '{"r": 1, "r": 2, ' + text[1:]
    return text.encode()


@FUZZ
@given(configs())
def test_random_adapter_configs_are_refused_without_crash_hang_or_allocation(blob: bytes) -> None:
    _bounded(parse_adapter_config, blob)


@settings(FUZZ, max_examples=150)
@given(configs(), headers())
def test_both_doors_refuse_random_artifacts_with_their_own_error(config: bytes, weights: bytes) -> None:
    """The registry's check_artifact raises only AdapterRejected; the replica's loader only ReplicaError."""
    try:
        check_artifact(config, weights, SPEC, MAX_RANK, SERVED, None)
    except AdapterRejected:
        pass
    try:
        adapter_from_bytes(config, file_bytes(weights), "fuzz-adapter", REPLICA_SPEC, None)
    except ReplicaError:
        pass
