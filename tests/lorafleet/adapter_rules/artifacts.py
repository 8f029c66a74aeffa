"""PEFT LoRA artifacts for a tiny Llama, honest or corrupted, as hypothesis strategies.

An honest artifact is what peft's save_pretrained would write: the modules and per-module ranks come from
peft's own target and pattern matching (check_target_module_exists, get_pattern_key) on the drawn config,
so the generator does not share the code it tests.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

from lorafleet.adapter_rules.base_spec import BaseSpec
from lorafleet.adapter_rules.lora_tensors import module_path, tensor_name
from schemas.llama import LLAMA_MODULES

BASE_CONFIG = {
    "hidden_size": 8,
    "intermediate_size": 12,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 2,
}
SPEC = BaseSpec.from_config(BASE_CONFIG)
MAX_RANK = 4
SERVED = "sha256:" + "5" * 64
OTHER_BASE = "sha256:" + "6" * 64
MODULES = list(LLAMA_MODULES)
KEYS = [(layer, m) for layer in range(SPEC.num_layers) for m in MODULES]

PATTERN_KEYS = [
    "q_proj",
    "v_proj",
    "mlp.down_proj",
    "layers.1.self_attn.k_proj",
    r"layers\.[01]\.mlp\.up_proj",
    "o_proj|gate_proj",
]
REGEX_TARGETS = [r".*\.(q_proj|v_proj)", r"model\.layers\.[01]\.mlp\..*", "all-linear"]
BOILERPLATE = {
    "task_type": "CAUSAL_LM",
    "peft_type": "LORA",
    "peft_version": "0.21.2",
    "inference_mode": True,
    "lora_dropout": 0.0,
    "bias": "none",
    "fan_in_fan_out": False,
    "use_dora": False,
    "modules_to_save": None,
    "init_lora_weights": True,
    "megatron_core": "megatron.core",
    "loftq_config": {},
    "qalora_group_size": 16,
    "base_model_name_or_path": None,
}


@dataclass
class Artifact:
    """The two files, the ground truth a pipeline would register, and the steps that built them."""

    config: bytes
    weights: bytes
    rank: int
    alpha: float
    modules: list[str]
    steps: list[str] = field(default_factory=list)

    @property
    def checksum(self) -> str:
        return "sha256:" + hashlib.sha256(self.weights).hexdigest()


def peft_ranks(config: dict[str, Any]) -> dict[tuple[int, str], int]:
    """(layer, module) -> rank, as peft itself decides them for this config on the tiny base."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists
    from peft.utils.other import get_pattern_key

    fields = ("r", "lora_alpha", "use_rslora", "target_modules", "exclude_modules", "layers_to_transform")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = LoraConfig(
            **{k: config[k] for k in fields if k in config}, rank_pattern=config.get("rank_pattern") or {}
        )
        if isinstance(cfg.target_modules, str) and cfg.target_modules.lower() == "all-linear":
            cfg.target_modules = set(MODULES)
    ranks = {}
    for layer, m in KEYS:
        path = module_path(layer, m)
        if check_target_module_exists(cfg, path):
            ranks[(layer, m)] = cfg.rank_pattern.get(get_pattern_key(cfg.rank_pattern.keys(), path), cfg.r)
    return ranks


def encode(values: np.ndarray, dtype: str) -> bytes:
    """float32 values as the bytes of a safetensors dtype (BF16: the top half of each float32)."""
    if dtype == "BF16":
        return (values.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return values.astype(
        {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "U8": "u1"}[dtype]
    ).tobytes()


@dataclass
class Tensor:
    name: str
    dtype: str
    values: np.ndarray  # float32, in its shape


def tensors(ranks: dict[tuple[int, str], int], dtypes: list[str], seed: int) -> list[Tensor]:
    """lora_A [rank, in] and lora_B [out, rank] per module, small random values."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (layer, m) in enumerate(sorted(ranks)):
        fan_in, fan_out = SPEC.shapes[m]
        for which, shape in (("A", (ranks[(layer, m)], fan_in)), ("B", (fan_out, ranks[(layer, m)]))):
            values = rng.normal(0, 0.2, size=shape).astype(np.float32)
            out.append(Tensor(tensor_name(layer, m, which), dtypes[i % len(dtypes)], values))
    return out


def layout(ts: list[Tensor]) -> tuple[dict[str, Any], bytes]:
    """A safetensors header (with __metadata__) and its data section, tensors in list order."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    data = b""
    for t in ts:
        raw = encode(t.values, t.dtype)
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.values.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    return header, data


def serialize(header: dict[str, Any] | str, data: bytes) -> bytes:
    blob = (header if isinstance(header, str) else json.dumps(header)).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob + data


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """An adapter_config.json that peft accepts."""
    config: dict[str, Any] = dict(BOILERPLATE)
    config["r"] = draw(st.integers(1, MAX_RANK))
    config["lora_alpha"] = draw(st.sampled_from([1, 2.5, 8, 16.0]))
    config["use_rslora"] = draw(st.booleans())
    regex = draw(st.booleans())
    if regex:
        config["target_modules"] = draw(st.sampled_from(REGEX_TARGETS))
    else:
        config["target_modules"] = draw(
            st.lists(st.sampled_from(MODULES), min_size=1, max_size=7, unique=True)
        )
        config["layers_to_transform"] = draw(st.sampled_from([None, None, [0], [1], 1]))
    config["exclude_modules"] = draw(st.sampled_from([None, None, ["k_proj"]]))
    keys = st.lists(st.sampled_from(PATTERN_KEYS), max_size=2, unique=True)
    config["rank_pattern"] = {k: draw(st.integers(1, MAX_RANK)) for k in draw(keys)}
    config["alpha_pattern"] = {k: draw(st.sampled_from([3, 0.5, 12.0])) for k in draw(keys)}
    base = draw(
        st.sampled_from(["absent", "served", "served", "served", "served", "served", "served", "other"])
    )
    if base != "absent":
        config["base_model_hash"] = SERVED if base == "served" else OTHER_BASE
    return config


# Config edits that make a feature the fleet refuses (or a malformed field).
CONFIG_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "dora": lambda c: c.update(use_dora=True),
    "bias": lambda c: c.update(bias="lora_only"),
    "modules_to_save": lambda c: c.update(modules_to_save=["lm_head"]),
    "pissa": lambda c: c.update(init_lora_weights="pissa"),
    "unknown_feature": lambda c: c.update(some_future_feature={"on": True}),
    "unknown_off": lambda c: c.update(some_future_feature=None),
    "loha": lambda c: c.update(peft_type="LOHA"),
    "redos_pattern": lambda c: c.update(rank_pattern={"(q+)+_proj": 2}),
    "rank_zero": lambda c: c.update(r=0),
    "alpha_string": lambda c: c.update(lora_alpha="8"),
    "targets_lm_head": lambda c: c.update(target_modules=["q_proj", "lm_head"], layers_to_transform=None),
    "other_rank": lambda c: c.update(r=c["r"] % MAX_RANK + 1, rank_pattern={}),
}


def _resized(t: Tensor, rows: int | None = None, cols: int | None = None) -> Tensor:
    r, c = t.values.shape
    return Tensor(t.name, t.dtype, np.full((rows or r, cols or c), 0.1, np.float32))


def _tensor_edit(draw: st.DrawFn, ts: list[Tensor]) -> str:
    """Edit the tensors themselves (offsets stay consistent): names, pairs, shapes, ranks, dtypes."""
    i = draw(st.integers(0, len(ts) - 1))
    t, pair = ts[i], i ^ 1  # A and B of a module sit side by side
    kind = draw(
        st.sampled_from(
            ["drop_tensor", "drop_module", "rank", "one_side_rank", "fan", "dtype", "rename", "extra"]
        )
    )
    if kind == "drop_tensor":
        del ts[i]
    elif kind == "drop_module":
        del ts[max(i, pair)], ts[min(i, pair)]
    elif kind == "rank":  # both sides: a consistent module of another rank (maybe over the cap)
        r = draw(st.integers(1, MAX_RANK + 1))
        a, b = sorted((i, pair))
        ts[a], ts[b] = _resized(ts[a], rows=r), _resized(ts[b], cols=r)
    elif kind == "one_side_rank":
        ts[i] = _resized(t, rows=t.values.shape[0] + 1)
    elif kind == "fan":
        ts[i] = _resized(t, cols=t.values.shape[1] + 1)
    elif kind == "dtype":
        ts[i] = Tensor(t.name, draw(st.sampled_from(["I64", "F64", "U8"])), t.values)
    elif kind == "rename":
        old, new = draw(
            st.sampled_from(
                [
                    ("layers.0", "layers.7"),
                    ("self_attn", "mlp"),
                    ("mlp", "self_attn"),
                    ("lora_A", "lora_C"),
                    ("model.model", "model"),
                    (".weight", ".bias"),
                    ("layers.1", "layers.01"),
                ]
            )
        )
        ts[i] = Tensor(t.name.replace(old, new), t.dtype, t.values)
    elif kind == "extra":
        ts.append(Tensor("base_model.model.lm_head.lora_A.weight", t.dtype, np.zeros((1, 8), np.float32)))
    return f"tensors:{kind}"


def _header_edit(draw: st.DrawFn, header: dict[str, Any]) -> str:
    """Edit the header's JSON so it breaks the format."""
    names = sorted(k for k in header if k != "__metadata__")
    entry = header[draw(st.sampled_from(names))]
    kind = draw(st.sampled_from(["dtype_name", "shape", "offsets", "extra_key", "metadata", "not_a_list"]))
    if kind == "dtype_name":
        entry["dtype"] = draw(st.sampled_from(["XYZ", "f32", 4, None]))
    elif kind == "shape":
        entry["shape"] = draw(
            st.sampled_from(
                [[], [0, 8], [1, 1, 1], [True, 8], [-1, 8], [1.0, 8], list(reversed(entry["shape"]))]
            )
        )
    elif kind == "offsets":
        entry["data_offsets"] = [o + draw(st.integers(-4, 4)) for o in entry["data_offsets"]]
    elif kind == "extra_key":
        entry["align"] = 8
    elif kind == "metadata":
        header["__metadata__"] = {"format": 1}
    elif kind == "not_a_list":
        entry["data_offsets"] = {"begin": 0}
    return f"header:{kind}"


def _bytes_edit(draw: st.DrawFn, blob: bytes) -> tuple[bytes, str]:
    kind = draw(st.sampled_from(["flip", "truncate", "append", "length", "pickle", "nan"]))
    (n,) = struct.unpack("<Q", blob[:8])
    if kind == "flip":
        at = draw(st.integers(0, len(blob) - 1))
        blob = blob[:at] + bytes([blob[at] ^ draw(st.integers(1, 255))]) + blob[at + 1 :]
    elif kind == "truncate":
        blob = blob[: draw(st.integers(0, len(blob) - 1))]
    elif kind == "append":
        blob += b"\0" * draw(st.integers(1, 16))
    elif kind == "length":
        blob = struct.pack("<Q", draw(st.sampled_from([0, 1, n - 1, n + 1, 1 << 40, 2**64 - 1]))) + blob[8:]
    elif kind == "pickle":
        blob = pickle.dumps({"lora_A": [1.0]}, protocol=draw(st.integers(2, 5)))
    elif kind == "nan":
        header = json.loads(blob[8 : 8 + n])
        entry = header[draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))]
        begin = 8 + n + entry["data_offsets"][0]
        width = 4 if entry["dtype"] == "F32" else 2
        bits = {"F32": b"\x00\x00\xc0\x7f", "F16": b"\x00\x7e", "BF16": b"\xc0\x7f"}[entry["dtype"]]
        if entry["data_offsets"][1] > entry["data_offsets"][0]:
            blob = blob[:begin] + bits + blob[begin + width :]
    return blob, f"bytes:{kind}"


@st.composite
def artifacts(draw: st.DrawFn) -> Artifact:
    """An honest artifact, then at most one edit of its config, its header or its bytes."""
    config = draw(configs())
    ranks = peft_ranks(config)
    if not ranks:  # a config that targets nothing on this base: peft would refuse it; target q_proj
        config.update(target_modules=["q_proj"], layers_to_transform=None)
        ranks = peft_ranks(config)
    dtypes = draw(st.lists(st.sampled_from(["F32", "F16", "BF16"]), min_size=1, max_size=3))
    ts = tensors(ranks, dtypes, draw(st.integers(0, 2**16)))
    truth = (max(ranks.values()), float(config["lora_alpha"]), sorted({m for _, m in ranks}))
    steps: list[str] = []
    where = draw(
        st.sampled_from(
            [
                "none",
                "none",
                "config",
                "tensors",
                "tensors",
                "header",
                "bytes",
                "bytes",
                "config_bytes",
                "duplicate_key",
            ]
        )
    )
    if where == "config":
        edit = draw(st.sampled_from(sorted(CONFIG_EDITS)))
        CONFIG_EDITS[edit](config)
        steps.append(f"config:{edit}")
    elif where == "tensors":
        steps.append(_tensor_edit(draw, ts))
    header, data = layout(ts)
    if where == "header":
        steps.append(_header_edit(draw, header))
    config_bytes = json.dumps(config, indent=2).encode()
    if where == "config_bytes":
        at = draw(st.integers(0, len(config_bytes) - 1))
        config_bytes = (
            config_bytes[:at] + draw(st.sampled_from([b"", b"}", b"NaN", b"\xff"])) + config_bytes[at + 1 :]
        )
        steps.append("config_bytes")
    text = json.dumps(header)
    if where == "duplicate_key" and len(header) > 1:
        first = next(k for k in header if k != "__metadata__")
        text = text[:-1] + f", {json.dumps(first)}: {json.dumps(header[first])}}}"
        steps.append("header:duplicate_key")
    blob = serialize(text, data)
    if where == "bytes":
        blob, step = _bytes_edit(draw, blob)
        steps.append(step)
    return Artifact(config_bytes, blob, *truth, steps=steps)


def build(
    overrides: dict[str, Any],
    edit: Callable[[list[Tensor]], None] | None = None,
    weights: Callable[[bytes], bytes] | None = None,
    dtypes: tuple[str, ...] = ("F32", "BF16"),
) -> Artifact:
    """One artifact: a config (boilerplate plus overrides), its honest tensors, then the given edits."""
    config = {**BOILERPLATE, "r": 2, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], **overrides}
    ranks = peft_ranks(config)
    ts = tensors(ranks, list(dtypes), 0)
    if edit is not None:
        edit(ts)
    blob = serialize(*layout(ts))
    if weights is not None:
        blob = weights(blob)
    return Artifact(
        json.dumps(config).encode(),
        blob,
        max(ranks.values()),
        float(config["lora_alpha"]),
        sorted({m for _, m in ranks}),
    )
