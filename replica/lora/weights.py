"""Read a PEFT LoRA directory into host tensors; every check is a shared adapter rule, nothing half-checked.

The rules (lorafleet.adapter_rules, the registry's too) decide: no pickle file, a config we can serve, the
registration's (or else the config's) base hash equal to the served base, a well-formed bounded safetensors
header, known target modules, shapes that fit the base, each module's rank from its tensors within the cap
and equal to the config's, and no NaN or Inf. Each failure is the load error for its rule's code
(replica.errors.adapter_error). This module only reads the files, within their caps, and turns the checked
plan into tensors, each module with its own scale (rsLoRA and alpha_pattern included).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lorafleet.adapter_rules import caps
from lorafleet.adapter_rules.artifact import check_artifact, check_files
from lorafleet.adapter_rules.errors import AdapterRejected, RejectCode
from lorafleet.adapter_rules.safetensors_header import TensorEntry
from replica.errors import adapter_error
from replica.lora.row_layout import ModuleKey
from replica.lora.spec import AdapterSpec
from schemas.api import ADAPTER_CONFIG_NAME as CONFIG_NAME
from schemas.api import ADAPTER_WEIGHTS_NAME as WEIGHTS_NAME

# safetensors dtype -> torch dtype, for every dtype the rules serve
TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@dataclass(frozen=True)
class ModuleLora:
    """One adapted linear: a [rank, in_features], b [out_features, rank], and its scale."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass(frozen=True)
class AdapterWeights:
    """A validated adapter in host memory, keyed by its stable id (never by its path)."""

    adapter_id: str
    base_model_hash: str
    modules: dict[ModuleKey, ModuleLora]

    @property
    def rank(self) -> int:
        """The largest rank over the adapted modules; it picks the rank bucket."""
        return max(m.rank for m in self.modules.values())

    @property
    def nbytes(self) -> int:
        return sum(m.a.nbytes + m.b.nbytes for m in self.modules.values())


def weights_path(path: Path) -> Path:
    """The folder's weights file, once its listing passes the rules (no pickle, both files) and the cap."""
    try:
        check_files(p.name for p in path.iterdir())
        weights = path / WEIGHTS_NAME
        caps.check_size(WEIGHTS_NAME, weights.stat().st_size, caps.MAX_WEIGHTS_BYTES)
    except AdapterRejected as exc:
        raise adapter_error(exc) from exc
    return weights


def read_config(path: Path) -> bytes:
    """The folder's adapter_config.json, at most one byte past the cap (enough for the rules to refuse it)."""
    with open(path / CONFIG_NAME, "rb") as f:
        return f.read(caps.MAX_CONFIG_BYTES + 1)


def typed(buf: torch.Tensor, entry: TensorEntry) -> torch.Tensor:
    """buf [file bytes] uint8 -> the entry's tensor in its file dtype, flat; a misaligned span is copied."""
    dtype = TORCH_DTYPES[entry.dtype]
    span = buf[entry.begin : entry.end]
    return (span if entry.begin % dtype.itemsize == 0 else span.clone()).view(dtype)


def read_adapter(
    path: Path, adapter_id: str, spec: AdapterSpec, base_model_hash: str | None = None
) -> AdapterWeights:
    """Validate the PEFT directory at path and return its weights; raise an AdapterError subclass otherwise.

    base_model_hash is the hash the adapter was trained on, from its registration; when None, the
    `base_model_hash` field of adapter_config.json is used.
    """
    path = Path(path)
    if not path.is_dir():
        missing = AdapterRejected(
            RejectCode.ARTIFACT_MISSING, f"adapter directory for {adapter_id!r} does not exist"
        )
        raise adapter_error(missing)
    weights_file = weights_path(path)
    config = read_config(path)
    return adapter_from_bytes(
        config, file_bytes(weights_file.read_bytes()), adapter_id, spec, base_model_hash
    )


def file_bytes(data: bytes) -> torch.Tensor:
    """A file's bytes as a writable uint8 tensor [len(data)]; an empty file gives an empty tensor (which the
    rules then refuse as a truncated header), never torch.frombuffer's ValueError."""
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def adapter_from_bytes(
    config: bytes, buf: torch.Tensor, adapter_id: str, spec: AdapterSpec, base_model_hash: str | None
) -> AdapterWeights:
    """Validate a PEFT adapter's two files held in memory (buf [file bytes] uint8, its weights file) by the
    same rules as read_adapter and return its weights; raise an AdapterError subclass otherwise."""
    try:
        checked = check_artifact(
            config, buf.numpy().data, spec, spec.max_rank, spec.base_model_hash, base_model_hash
        )
    except AdapterRejected as exc:
        raise adapter_error(exc) from exc
    modules = {
        key: ModuleLora(
            typed(buf, m.a).view(m.a.shape).clone(), typed(buf, m.b).view(m.b.shape).clone(), m.scale
        )
        for key, m in checked.plan.modules.items()
    }
    return AdapterWeights(adapter_id, spec.base_model_hash, modules)
