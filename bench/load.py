"""`lorafleet bench load`: time bringing one adapter into a GPU slot from each tier, beside its floor.

Each tier is timed through the production code (AdapterCache.ensure(adapter, "gpu") after dropping the
adapter from the faster tiers), and beside it, in the same run and interleaved over repeats, its floor:
  ram    -> slot: metadata checks, copy into the slot    vs  one plain copy of the same bytes
  disk   -> slot: identity check, one read, validate, copy vs  one plain read of the same safetensors file
  remote -> slot: GET hashed as it streams, validate, copy vs  one plain GET of the same object (same client)
Medians are reported with ratio = tier / floor and pass/fail against TARGET (1.2). The disk floor reads the
disk tier's own copy of the file, the one the tier path reads, and both are preceded by an untimed read, so
both read it from the page cache. The disk copy written behind a remote load is off the timed path (it runs
after the slot is live); the bench waits for it (settle) before the next sample.
Disk and remote also report a "verified floor" (plain read or GET plus one sha256 of the bytes) for context.
--calibration-out writes per-tier load times for the simulator.
Entry point: load(...).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from bench._util import DTYPES, default_dtype, emit, environment, median, pick_device
from replica.adapter_cache.cache import AdapterCache
from replica.adapter_cache.disk import DiskTier
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.host import HostTier
from replica.adapter_cache.object_store import ObjectStore
from replica.adapter_cache.record import AdapterRecord
from replica.lora.replace import lora_layers
from replica.lora.spec import MODULE_PARENTS, AdapterSpec
from schemas.llama import linear_shapes

# name -> (hidden, intermediate, q_out, kv_out, layers)
MODELS: dict[str, tuple[int, int, int, int, int]] = {
    "smollm2-135m": (576, 1536, 576, 192, 30),
    "llama-7b": (4096, 11008, 4096, 4096, 32),
}
BASE_HASH = "sha256:" + "0" * 64
TARGET = 1.2


def _spec(model: str, rank: int) -> AdapterSpec:
    hidden, inter, q_out, kv_out, layers = MODELS[model]
    return AdapterSpec(layers, linear_shapes(hidden, inter, q_out, kv_out), max(rank, 16), BASE_HASH)


def _layers(spec: AdapterSpec, rank: int, device: torch.device, dtype: torch.dtype) -> dict:
    """LoRA layers whose base weight is a zero-stride stand-in: the slot pools are real, W takes no memory."""
    bases = {}
    for layer in range(spec.num_layers):
        for name, (i, o) in spec.shapes.items():
            base = nn.Linear(1, 1, bias=False)
            base.weight = nn.Parameter(
                torch.zeros(1, device=device, dtype=dtype).expand(o, i), requires_grad=False
            )
            bases[(layer, name)] = base
    return lora_layers(bases, {rank: 2})


def _write_adapter(folder: Path, spec: AdapterSpec, rank: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(spec.num_layers):
        for name, (i, o) in spec.shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{MODULE_PARENTS[name]}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = (torch.randn(rank, i, generator=g) * 0.02).to(dtype)
            tensors[f"{prefix}.lora_B.weight"] = (torch.randn(o, rank, generator=g) * 0.02).to(dtype)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(spec.shapes)}
    (folder / "adapter_config.json").write_text(json.dumps(config))


class _OneRecord:
    def __init__(self, record: AdapterRecord) -> None:
        self.record = record

    async def get(self, adapter_id: str) -> AdapterRecord:
        return self.record


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


async def _run(
    model: str, rank: int, device: torch.device, dtype_name: str, repeats: int, use_s3: bool, work: Path
) -> dict[str, Any]:
    import hashlib

    from lorafleet.config import PlatformSettings
    from lorafleet.s3 import async_client

    dtype = DTYPES[dtype_name]
    spec = _spec(model, rank)
    store = work / "store" / "adapter"
    _write_adapter(store, spec, rank, dtype)
    weights_file = store / "adapter_model.safetensors"
    digest = hashlib.sha256(weights_file.read_bytes()).hexdigest()
    platform = PlatformSettings()
    s3_ctx = async_client(platform) if use_s3 else None
    s3 = await s3_ctx.__aenter__() if s3_ctx is not None else None
    try:
        if s3 is not None:
            prefix = f"bench/load/{uuid.uuid4().hex[:8]}"
            for name in ("adapter_config.json", "adapter_model.safetensors"):
                await s3.put_object(
                    Bucket=platform.s3_bucket, Key=f"{prefix}/{name}", Body=(store / name).read_bytes()
                )
            uri = f"s3://{platform.s3_bucket}/{prefix}"
        else:
            uri = f"file://{store}"
        record = AdapterRecord("bench-adapter", uri, digest, BASE_HASH, tuple(spec.shapes))
        layers = _layers(spec, rank, device, dtype)
        gpu = GpuTier(layers, {rank: 2})
        cache = AdapterCache(
            spec,
            _OneRecord(record),
            ObjectStore(s3, [work / "store"]),
            DiskTier(work / "disk", 1 << 34),
            HostTier(1 << 34),
            gpu,
        )
        aid = record.adapter_id
        await cache.ensure(aid, "gpu")  # warm-up: allocations, staging buffer, page cache
        await cache.settle()
        host = cache.host.get(aid)
        assert host is not None
        floor_dst = torch.empty_like(host.flat, device=device)

        def disk_entry() -> str:
            name = cache.disk.find(digest)
            if name is None:
                raise RuntimeError(f"adapter {aid} has no disk-tier entry")
            return name

        def drop(to: str) -> None:
            gpu.remove(aid)
            if to in ("disk", "remote"):
                cache.host.remove(aid)
            if to == "remote":
                cache.disk.remove(disk_entry())

        def disk_copy() -> Path:
            return cache.disk.path(disk_entry()) / "adapter_model.safetensors"

        def warm(path: Path) -> None:
            """Read the file untimed first: both the disk tier and its floor then read it from the page cache
            (this machine's proactive reclaim drops clean pages within seconds)."""
            with open(path, "rb") as f:
                f.read()

        async def timed_tier(tier: str) -> float:
            drop(tier)
            if tier == "disk":
                warm(disk_copy())
            start = time.perf_counter()
            await cache.ensure(aid, "gpu")
            _sync(device)
            elapsed = time.perf_counter() - start
            await cache.settle()  # the disk copy behind a remote load: off the timed path
            return elapsed

        async def floor(tier: str) -> float:
            in_ram = cache.host.get(aid)
            if in_ram is None:
                raise RuntimeError(f"adapter {aid} is not in the RAM tier")
            flat = in_ram.flat  # the bytes the tier path copies
            entry = disk_copy()
            if tier == "disk":
                warm(entry)
            start = time.perf_counter()
            if tier == "ram":
                floor_dst.copy_(flat, non_blocking=True)
                _sync(device)
            elif tier == "disk":
                with open(entry, "rb") as f:  # the file the tier path reads
                    f.read()
            elif s3 is not None:
                resp = await s3.get_object(
                    Bucket=platform.s3_bucket, Key=f"{prefix}/adapter_model.safetensors"
                )
                async with resp["Body"] as body:
                    await body.read()
            else:
                with open(weights_file, "rb") as f:
                    f.read()
            return time.perf_counter() - start

        async def verified_floor(tier: str) -> float:
            start = time.perf_counter()
            if tier == "remote" and s3 is not None:
                resp = await s3.get_object(
                    Bucket=platform.s3_bucket, Key=f"{prefix}/adapter_model.safetensors"
                )
                async with resp["Body"] as body:
                    data = await body.read()
            else:
                with open(weights_file, "rb") as f:
                    data = f.read()
            hashlib.sha256(data).hexdigest()
            return time.perf_counter() - start

        samples: dict[str, dict[str, list[float]]] = {
            t: {"tier": [], "floor": [], "verified": []} for t in ("ram", "disk", "remote")
        }
        for _ in range(repeats):
            for tier in samples:
                samples[tier]["floor"].append(await floor(tier))
                if tier != "ram":
                    samples[tier]["verified"].append(await verified_floor(tier))
                samples[tier]["tier"].append(await timed_tier(tier))
        tiers: dict[str, dict[str, Any]] = {}
        for tier, s in samples.items():
            t, f = median(s["tier"]), median(s["floor"])
            # Unrounded, so that ratio and within_1_2x follow from the medians as printed in the JSON.
            tiers[tier] = {
                "median_s": t,
                "floor_median_s": f,
                "ratio": t / f,
                "within_1_2x": t / f <= TARGET,
                "samples_ms": [round(x * 1e3, 3) for x in s["tier"]],
                "floor_samples_ms": [round(x * 1e3, 3) for x in s["floor"]],
            }
            if s["verified"]:
                v = median(s["verified"])
                tiers[tier] |= {
                    "verified_floor_median_s": v,
                    "ratio_to_verified_floor": t / v,
                }
        return {
            "benchmark": "load",
            "model_shapes": model,
            "rank": rank,
            "adapter_file_bytes": weights_file.stat().st_size,
            "slot_bytes": host.nbytes,
            "repeats": repeats,
            "object_store": "s3" if s3 is not None else "file (no S3 reachable: floor is a file read)",
            "floors": {
                "ram": "one copy of the packed bytes into a device tensor of the same size",
                "disk": "one read() of adapter_model.safetensors",
                "remote": "one GET of adapter_model.safetensors",
                "verified": "the disk or remote floor plus one sha256 of the bytes",
            },
            "target_ratio": TARGET,
            "tiers": tiers,
            "summary": {
                t: f"{v['median_s'] * 1e3:.2f} ms / floor {v['floor_median_s'] * 1e3:.2f} ms = "
                f"{v['ratio']:.2f}x {'PASS' if v['within_1_2x'] else 'FAIL'}"
                for t, v in tiers.items()
            },
            "environment": environment(device, dtype_name),
        }
    finally:
        if s3_ctx is not None:
            await s3_ctx.__aexit__(None, None, None)


def load(
    model: str = "smollm2-135m",
    rank: int = 16,
    device: str = "auto",
    dtype: str | None = None,
    repeats: int = 7,
    s3: bool = True,
    out: Path | None = None,
    calibration_out: Path | None = None,
) -> dict[str, Any]:
    """Run the benchmark, print its JSON (and write it to out); write per-tier times to calibration_out."""
    dev = pick_device(device)
    dtype = dtype or default_dtype(dev)
    with tempfile.TemporaryDirectory(dir=os.environ.get("LORAFLEET_BENCH_TMP")) as tmp:
        result = asyncio.run(_run(model, rank, dev, dtype, repeats, s3, Path(tmp)))
    emit(result, out)
    if calibration_out is not None:
        calibration = {
            "source": "lorafleet bench load",
            "device": str(dev),
            "model_shapes": model,
            "rank": rank,
            "adapter_bytes": result["adapter_file_bytes"],
            "load_s": {tier: v["median_s"] for tier, v in result["tiers"].items()},
        }
        calibration_out.write_text(json.dumps(calibration, indent=2) + "\n")
    return result


if __name__ == "__main__":
    import sys

    load(s3="--no-s3" not in sys.argv)
