"""Small real adapters, layers and a file:// object store for cache tests (no model, no network)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from replica.adapter_cache.cache import AdapterCache
from replica.adapter_cache.disk import DiskTier
from replica.adapter_cache.errors import AdapterNotRegisteredError, RegistryUnavailableError
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.host import HostTier
from replica.adapter_cache.object_store import ObjectStore
from replica.adapter_cache.record import AdapterRecord
from replica.adapter_cache.tier import CacheEvent
from replica.lora.layers import LoraLinear
from replica.lora.replace import lora_layers
from replica.lora.row_layout import RowLayout
from replica.lora.spec import MODULE_PARENTS, AdapterSpec

BASE_HASH = "sha256:" + "b" * 64
SPEC = AdapterSpec(
    num_layers=2, shapes={"q_proj": (16, 16), "v_proj": (16, 8)}, max_rank=8, base_model_hash=BASE_HASH
)


def make_layers(capacities: dict[int, int]) -> dict[tuple[int, str], LoraLinear]:
    """SPEC's adapted linears, their slot pools views into one arena per bucket (as a replica builds them)."""
    torch.manual_seed(0)
    bases = {
        (layer, name): nn.Linear(i, o, bias=False)
        for layer in range(SPEC.num_layers)
        for name, (i, o) in SPEC.shapes.items()
    }
    return lora_layers(bases, capacities)


_ROWS = GpuTier(make_layers({8: 1}), {8: 1})


def row_for(rank: int) -> RowLayout:
    """The slot-row layout a RAM entry of this rank is packed in, on a replica with rank-8 slots."""
    return _ROWS.row_layout(rank)


def write_peft(
    out: Path,
    seed: int,
    rank: int = 4,
    alpha: float = 8.0,
    nan: bool = False,
    modules: tuple[str, ...] | None = None,
) -> dict[str, torch.Tensor]:
    """A PEFT folder (adapter_config.json + adapter_model.safetensors) with random weights; `modules`
    limits the target modules (default: all of SPEC's)."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(SPEC.num_layers):
        for name, (i, o) in SPEC.shapes.items():
            if modules is not None and name not in modules:
                continue
            prefix = f"base_model.model.model.layers.{layer}.{MODULE_PARENTS[name]}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, i, generator=g)
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(o, rank, generator=g)
    if nan:
        next(iter(tensors.values()))[0, 0] = float("nan")
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    targets = list(SPEC.shapes) if modules is None else list(modules)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": targets}
    (out / "adapter_config.json").write_text(json.dumps(config))
    return tensors


def digest(path: Path) -> str:
    return hashlib.sha256((path / "adapter_model.safetensors").read_bytes()).hexdigest()


@dataclass
class DictRegistry:
    """The registry's answers held in a dict (the HTTP client is tested against the real gateway)."""

    records: dict[str, AdapterRecord] = field(default_factory=dict)
    calls: int = 0

    async def get(self, adapter_id: str) -> AdapterRecord:
        self.calls += 1
        if adapter_id not in self.records:
            raise AdapterNotRegisteredError(f"adapter {adapter_id!r} is not registered")
        return self.records[adapter_id]


class Unreachable(DictRegistry):
    """The registry's answers, after `down` calls that found it unreachable."""

    def __init__(self, down: int) -> None:
        super().__init__()
        self.down = down

    async def get(self, adapter_id: str) -> AdapterRecord:
        if self.down > 0:
            self.down -= 1
            self.calls += 1
            raise RegistryUnavailableError("registry unreachable: ConnectError")
        return await super().get(adapter_id)


@dataclass
class Env:
    cache: AdapterCache
    registry: DictRegistry
    store_root: Path
    layers: dict[tuple[int, str], LoraLinear]
    events: list[CacheEvent]

    def add(self, adapter_id: str, seed: int, rank: int = 4, **kw: object) -> dict[str, torch.Tensor]:
        folder = self.store_root / adapter_id
        tensors = write_peft(folder, seed, rank, nan=bool(kw.pop("nan", False)))
        record = AdapterRecord(
            adapter_id,
            f"file://{folder}",
            str(kw.pop("digest", digest(folder))),
            str(kw.pop("base_model_hash", BASE_HASH)),
            tuple(SPEC.shapes),
        )
        self.registry.records[adapter_id] = record
        return tensors

    def loads(self, from_tier: str, adapter_id: str | None = None) -> list[CacheEvent]:
        return [
            e
            for e in self.events
            if e.kind == "load" and e.from_tier == from_tier and adapter_id in (None, e.adapter_id)
        ]

    def evictions(self, tier: str) -> list[CacheEvent]:
        return [e for e in self.events if e.kind == "evict" and e.from_tier == tier]


def make_env(
    tmp: Path,
    capacities: dict[int, int] | None = None,
    disk_bytes: int = 1 << 30,
    ram_bytes: int = 1 << 30,
    slot_wait_s: float = 0.2,
    inline_write_bytes: int | None = None,
    stream_disk_to_slot: bool | None = None,
    spec: AdapterSpec = SPEC,
) -> Env:
    """A cache on tmp; spec may differ from SPEC in max_rank only (its layers are SPEC's modules)."""
    store_root = tmp / "store"
    store_root.mkdir()
    layers = make_layers(capacities or {8: 4})
    events: list[CacheEvent] = []
    registry = DictRegistry()
    cache = AdapterCache(
        spec,
        registry,
        ObjectStore(None, file_roots=[store_root]),
        DiskTier(tmp / "disk", disk_bytes),
        HostTier(ram_bytes),
        GpuTier(layers, capacities or {8: 4}),
        on_event=events.append,
        slot_wait_s=slot_wait_s,
        stream_disk_to_slot=stream_disk_to_slot,
        **({} if inline_write_bytes is None else {"inline_write_bytes": inline_write_bytes}),
    )
    return Env(cache, registry, store_root, layers, events)


def slot_holds(layers: dict[tuple[int, str], LoraLinear], ref, tensors: dict[str, torch.Tensor]) -> bool:
    """True when every adapted layer's slot holds exactly this adapter's A and B (zero-padded past its
    rank), and every layer it does not adapt is all zeros with scale 0."""
    for (layer, name), lin in layers.items():
        prefix = f"base_model.model.model.layers.{layer}.{MODULE_PARENTS[name]}.{name}"
        pool = lin.pools[ref.bucket]
        if f"{prefix}.lora_A.weight" not in tensors:
            if pool.a[ref.index].abs().sum() != 0 or pool.b[ref.index].abs().sum() != 0:
                return False
            if pool.scale[ref.index] != 0:
                return False
            continue
        a, b = tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"]
        if pool.scale[ref.index] == 0:
            return False
        r = a.shape[0]
        if not (torch.equal(pool.a[ref.index, :r], a) and torch.equal(pool.b[ref.index, :, :r], b)):
            return False
        if pool.a[ref.index, r:].abs().sum() != 0 or pool.b[ref.index, :, r:].abs().sum() != 0:
            return False
    return True
