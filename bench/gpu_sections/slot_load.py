"""The slot-load section: a RAM-tier adapter into a GPU slot through GpuTier.load, the replica's own path.

The RAM entry is a HostAdapter packed in its bucket's row layout, in pinned memory on CUDA as the cache
keeps it there (replica.adapter_cache.cache: pin_host on CUDA); every target module of every layer, so the
write is one host-to-device copy on the tier's side stream, plus the slot table's bookkeeping. The floor is
one plain copy of the same buffer into a slot row, measured beside it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from bench.gpu_sections.common import Bench, synchronize
from lorafleet.sizing import PRODUCTION
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.host import HostAdapter, row_targets


def measure(bench: Bench, out: dict[str, Any]) -> None:
    """Median seconds of a RAM -> slot load per rank (ranks below a bucket load padded to it)."""
    bench.need_model()
    gpu = GpuTier(bench.wrappers, dict(PRODUCTION.lora_slots))
    by_rank: dict[str, dict[str, Any]] = {}
    out["by_rank"] = by_rank
    for rank in bench.mode.load_ranks:
        by_rank[str(rank)] = load_times(gpu, rank, bench)
        bench.save()


def load_times(gpu: GpuTier, rank: int, bench: Bench) -> dict[str, Any]:
    """Load a fresh adapter id each time (a resident one returns at once), removing it after."""
    pin = bench.device.type == "cuda"
    layout = gpu.row_layout(rank)
    targets = row_targets(list(layout.index), layout)
    numel = sum(layout.module_numel(k) for k in targets)
    flat = torch.zeros(numel, dtype=bench.dtype, pin_memory=pin)  # [numel]
    scales = torch.full((len(targets),), 2.0, dtype=torch.float32, pin_memory=pin)  # [num_targets]

    def host(i: int) -> HostAdapter:
        return HostAdapter(
            adapter_id=f"bench-r{rank}-{i}",
            digest="",
            rank=rank,
            bucket=layout.rank,
            targets=targets,
            flat=flat,
            scales=scales,
        )

    times = []
    for i in range(bench.mode.load_repeats + 1):  # the first is a warm-up
        entry = host(i)
        start = time.perf_counter()
        ref = gpu.load(entry).ref
        elapsed = time.perf_counter() - start
        gpu.remove(entry.adapter_id)
        times.append(elapsed)
    row = gpu.arenas[layout.rank].data[ref.index]  # [row_numel]

    def floor() -> None:
        row[:numel].copy_(flat, non_blocking=pin)
        synchronize(bench.device)

    floors = []
    for _ in range(bench.mode.load_repeats + 1):
        start = time.perf_counter()
        floor()
        floors.append(time.perf_counter() - start)
    median, floor_s = statistics.median(times[1:]), statistics.median(floors[1:])
    nbytes = flat.nbytes + scales.nbytes
    return dict(
        bucket=layout.rank,
        bytes=nbytes,
        pinned=pin,
        median_s=median,
        min_s=min(times[1:]),
        gb_per_s=nbytes / median / 1e9,
        floor_s=floor_s,
        over_floor=median / floor_s,
        repeats=bench.mode.load_repeats,
    )
