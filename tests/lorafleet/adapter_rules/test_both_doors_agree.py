"""The registration door and the replica accept and reject exactly the same artifacts, with the same codes.

Artifacts are PEFT LoRA folders for a tiny Llama, drawn by hypothesis: configs with rsLoRA, rank_pattern,
alpha_pattern, regex and list targets, layers_to_transform and exclude_modules, then at most one edit (a
refused feature, a malformed field, a corrupted header, flipped or truncated bytes, NaN values, a pickle).
The byte caps are lowered to an artifact's own sizes to check a file at and one byte over each cap.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import struct
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings

from lorafleet.adapter_rules import caps
from lorafleet.adapter_rules.lora_tensors import tensor_name
from tests.lorafleet.adapter_rules.artifacts import (
    MAX_RANK,
    OTHER_BASE,
    Artifact,
    Tensor,
    artifacts,
    build,
    tensors,
)
from tests.lorafleet.adapter_rules.doors import ACCEPTED, both_doors


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(artifacts())
def test_registry_and_replica_agree_on_every_artifact(art: Artifact) -> None:
    registry, replica = both_doors(art)
    event(f"verdict: {registry}")
    event(f"{art.steps[:1]} -> {registry}")
    assert set(replica.values()) == {registry}, (art.steps, registry, replica)


def _resize(name: str, rows: int | None = None, cols: int | None = None):
    def edit(ts: list[Tensor]) -> None:
        for i, t in enumerate(ts):
            if t.name == name:
                r, c = t.values.shape
                ts[i] = Tensor(t.name, t.dtype, np.full((rows or r, cols or c), 0.1, np.float32))

    return edit


def _both(*edits):
    def edit(ts: list[Tensor]) -> None:
        for e in edits:
            e(ts)

    return edit


def _nan(blob: bytes) -> bytes:
    (n,) = struct.unpack("<Q", blob[:8])
    begin = 8 + n + json.loads(blob[8 : 8 + n])[Q_A]["data_offsets"][0]
    return blob[:begin] + b"\x00\x00\xc0\x7f" + blob[begin + 4 :]


Q_A = tensor_name(0, "q_proj", "A")
Q_B = tensor_name(0, "q_proj", "B")
PATTERNS = {
    "use_rslora": True,
    "rank_pattern": {"layers.1.self_attn.q_proj": 1, "v_proj": 3},
    "alpha_pattern": {"q_proj": 2.5},
}

# case -> (the artifact, the code both doors must give)
CASES: dict[str, tuple[Callable[[], Artifact], str]] = {
    "rslora_and_patterns": (lambda: build(PATTERNS), ACCEPTED),
    "regex_target_and_layers": (lambda: build({"target_modules": r".*\.(up|down)_proj", "r": 3}), ACCEPTED),
    "layers_to_transform": (
        lambda: build({"layers_to_transform": [1], "exclude_modules": ["v_proj"]}),
        ACCEPTED,
    ),
    "pickle": (lambda: build({}, weights=lambda _b: pickle.dumps([1.0], protocol=4)), "unsupported_format"),
    "truncated": (lambda: build({}, weights=lambda b: b[:-3]), "invalid_safetensors"),
    "int_tensor": (lambda: build({}, dtypes=("I64",)), "unsupported_dtype"),
    "dora": (lambda: build({"use_dora": True}), "unsupported_adapter_feature"),
    "redos_pattern": (lambda: build({"rank_pattern": {"(q+)+_proj": 2}}), "unsupported_adapter_feature"),
    "alpha_not_a_number": (lambda: build({"lora_alpha": "8"}), "invalid_adapter_config"),
    "other_base": (lambda: build({"base_model_hash": OTHER_BASE}), "base_model_mismatch"),
    "layer_out_of_range": (
        lambda: build(
            {}, edit=lambda ts: ts.append(Tensor(Q_A.replace("layers.0", "layers.7"), "F32", ts[0].values))
        ),
        "unknown_target_module",
    ),
    "one_sided_rank": (lambda: build({}, edit=_resize(Q_A, rows=3)), "shape_mismatch"),
    "rank_over_cap": (
        lambda: build({}, edit=_both(_resize(Q_A, rows=MAX_RANK + 1), _resize(Q_B, cols=MAX_RANK + 1))),
        "adapter_rank_exceeds_limit",
    ),
    # The pipeline declares the real (over-cap) rank, and the config names another base: the registry's
    # field check refuses the rank before fetching, so the replica must name the rank first too.
    "rank_over_cap_and_other_base": (
        lambda: dataclasses.replace(
            build(
                {"base_model_hash": OTHER_BASE},
                edit=_both(_resize(Q_A, rows=MAX_RANK + 1), _resize(Q_B, cols=MAX_RANK + 1)),
            ),
            rank=MAX_RANK + 1,
        ),
        "adapter_rank_exceeds_limit",
    ),
    "rank_not_the_pattern": (
        lambda: build(
            {"rank_pattern": {"q_proj": 3}}, edit=_both(_resize(Q_A, rows=2), _resize(Q_B, cols=2))
        ),
        "config_rank_mismatch",
    ),
    "module_not_targeted": (
        lambda: build(
            {"target_modules": ["q_proj"]}, edit=lambda ts: ts.extend(tensors({(0, "k_proj"): 2}, ["F32"], 1))
        ),
        "config_target_mismatch",
    ),
    "nan": (lambda: build({}, dtypes=("F32",), weights=_nan), "non_finite_weights"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_code_is_the_same_on_both_doors(case: str) -> None:
    make, code = CASES[case]
    registry, replica = both_doors(make())
    assert registry == code and set(replica.values()) == {code}, replica


@pytest.mark.parametrize("cap", ["MAX_CONFIG_BYTES", "MAX_WEIGHTS_BYTES"])
@pytest.mark.parametrize(("over", "code"), [(0, ACCEPTED), (1, "adapter_too_large")])
def test_a_file_over_its_shared_cap_is_refused_on_both_doors(
    monkeypatch: pytest.MonkeyPatch, cap: str, over: int, code: str
) -> None:
    art = build({})
    size = len(art.config if cap == "MAX_CONFIG_BYTES" else art.weights)
    monkeypatch.setattr(caps, cap, size - over)
    registry, replica = both_doors(art)
    assert registry == code and set(replica.values()) == {code}, (registry, replica)
