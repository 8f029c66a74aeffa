"""What the sections share: the run's state, the skip signal, step timing, block tables and report writes."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.gpu_sections.modes import Mode
from replica.lora.layers import LoraLinear
from replica.lora.row_layout import ModuleKey
from replica.lora.slots import SlotRef
from replica.model.llama import LlamaForCausalLM

RANK = 16  # the rank bucket the decode and prefill adapters sit in (the brief's adapters are rank 16)
NUM_ADAPTERS = 32  # rank-16 slots filled with random adapters: the most distinct adapters a step uses
HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e peak: the bandwidth floor of a decode step


class Skipped(Exception):
    """A section or measurement that cannot run here; its message is the reason recorded."""


@dataclass
class Bench:
    """One run: its mode, device, report (sections write into it), and the model once built."""

    mode: Mode
    device: torch.device
    report: dict[str, Any]
    save: Callable[[], None]  # writes the report file as it stands
    deadline: float  # time.monotonic() past which the remaining measurements are skipped
    model: LlamaForCausalLM | None = None
    wrappers: dict[ModuleKey, LoraLinear] = field(default_factory=dict)

    @property
    def dtype(self) -> torch.dtype:
        return self.mode.dtype

    def past_deadline(self) -> bool:
        return time.monotonic() >= self.deadline

    def need_model(self) -> LlamaForCausalLM:
        if self.model is None:
            raise Skipped("no model: the model section did not build one")
        return self.model


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], object], device: torch.device, warmup: int, iters: int) -> dict[str, float]:
    """Seconds of each call after warm-up, each waited for: median, mean and min over iters calls."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return dict(
        median_s=statistics.median(times), mean_s=statistics.fmean(times), min_s=min(times), iters=iters
    )


def blocks_for(lengths: list[int], block_size: int) -> int:
    """Blocks that hold sequences of these lengths (positions), each in blocks of its own."""
    return sum(-(-n // block_size) for n in lengths)


def block_tables(lengths: list[int], block_size: int) -> list[list[int]]:
    """Disjoint runs of block ids from 0, one per sequence, each covering its length in positions."""
    tables, first = [], 0
    for n in lengths:
        count = -(-n // block_size)
        tables.append(list(range(first, first + count)))
        first += count
    return tables


def slot_for(row: int, distinct: int) -> SlotRef | None:
    """Row i uses adapter i mod distinct; None (base only) when distinct is 0."""
    return SlotRef(RANK, row % distinct) if distinct else None


def free_memory(device: torch.device) -> None:
    """Hand cached blocks back to the device, so the next runner's KV cache and mem_get_info see them."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write data as JSON atomically: a temporary file in the same folder, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
