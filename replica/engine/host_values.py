"""Per-row values built on the host (lists) reaching the device without waiting for the device.

torch.tensor(values, device="cuda") copies from pageable memory and then synchronises the stream, so the
host waits there for every kernel queued before it: the sampler, called right after a decode step's launch,
would wait out the whole forward pass before queueing its own kernels. from_host stages the values in
pinned memory and queues a non-blocking copy behind that work instead. PyTorch's caching host allocator
keeps the pinned block until the copy has run, so the staging memory is never reused too early.
"""

from __future__ import annotations

from typing import Any

import torch


def from_host(values: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """values (a list, or nested lists) as a dtype tensor on device, queued without a host sync."""
    return to_device(torch.tensor(values, dtype=dtype), device)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on device, queued without a host sync: through pinned memory on CUDA (a non-blocking
    copy from pageable memory may still block the host while the driver stages it)."""
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)
