"""How many KV blocks a replica gets: from a byte budget on the CPU, from a share of the GPU's memory on
CUDA (what is left of gpu_memory_utilization x total once the weights and the adapter slots are in)."""

from __future__ import annotations

import torch


def blocks_in(budget_bytes: int, block_bytes: int) -> int:
    """Whole blocks that fit a budget (0 when even one does not)."""
    return max(0, budget_bytes // block_bytes)


def sequence_blocks(budget_bytes: int, block_bytes: int) -> int:
    """Blocks the sequences get: all that fit but one, the padding rows' sink (replica.kv.paged_cache)."""
    return max(0, blocks_in(budget_bytes, block_bytes) - 1)


def gpu_budget_bytes(device: torch.device, utilization: float) -> int:
    """Bytes the KV cache may take on a CUDA device: utilization of its memory, less what is in use now
    (call it after the weights and the LoRA slot stacks are allocated)."""
    torch.cuda.empty_cache()  # blocks the allocator keeps idle are free
    free, total = torch.cuda.mem_get_info(device)
    return max(0, int(utilization * total) - (total - free))


def kv_budget_bytes(device: torch.device, cpu_bytes: int, gpu_utilization: float) -> int:
    """The KV budget for the device the model runs on."""
    if device.type == "cuda":
        return gpu_budget_bytes(device, gpu_utilization)
    return cpu_bytes
