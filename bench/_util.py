"""Small helpers every benchmark shares: device choice, timing, medians, peak memory, JSON output."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def pick_device(name: str) -> torch.device:
    """'auto' means CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def default_dtype(device: torch.device) -> str:
    """bf16 on GPU (what production serves); fp32 on CPU, where bf16 matmuls are emulated and slow."""
    return "bfloat16" if device.type == "cuda" else "float32"


def sync(device: torch.device) -> None:
    """Wait for queued GPU work so wall-clock time covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, inner: int = 1) -> float:
    """Seconds per call of fn, averaged over `inner` back-to-back calls."""
    sync(device)
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    sync(device)
    return (time.perf_counter() - start) / inner


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def cuda_peak_mib(device: torch.device) -> float | None:
    """torch.cuda.max_memory_allocated since the last reset, or None on CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / (1 << 20)


def reset_cuda_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def environment(device: torch.device, dtype: str) -> dict[str, Any]:
    """What the numbers were measured on; absolute times only mean something on the same kind of machine."""
    env: dict[str, Any] = {
        "device": str(device),
        "dtype": dtype,
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "load_average_1m": round(os.getloadavg()[0], 2),  # other work on the machine skews CPU timings
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    else:
        env["note"] = "CPU run: ratios are indicative, absolute times only count on GPU"
    return env


def emit(result: dict[str, Any], out: Path | None = None) -> None:
    """Print the result as JSON to stdout (the benchmark's output), and write it to `out` if given."""
    text = json.dumps(result, indent=2, sort_keys=False)
    if out is not None:
        out.write_text(text + "\n")
    print(text)  # noqa: T201 (a benchmark program's output is its JSON)
