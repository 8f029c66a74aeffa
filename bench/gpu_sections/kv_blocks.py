"""The KV section: the blocks a replica gets once the weights and the production profile's slots are in.

The replica's own budget code (replica.kv.budget, as replica.runtime.kv_blocks calls it) with the production
profile's gpu_memory_utilization from lorafleet.sizing, a torch-free module; replica.config is not used (it
needs pydantic-settings). On a CPU the budget is the mode's kv_cache_bytes stand-in.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.gpu_sections.common import Bench, free_memory
from lorafleet.sizing import PRODUCTION, gpu_budget
from replica.engine.model_runner import DEFAULT_BLOCK_SIZE
from replica.kv.budget import kv_budget_bytes, sequence_blocks
from replica.kv.paged_cache import bytes_per_block


def measure(bench: Bench, out: dict[str, Any]) -> None:
    """Blocks, tokens and bytes of KV cache at the production memory fraction, on this device."""
    model = bench.need_model()
    free_memory(bench.device)  # the caching allocator's idle blocks would count as in use
    utilization = PRODUCTION.gpu_memory_utilization
    budget = kv_budget_bytes(bench.device, bench.mode.cpu_kv_bytes, utilization)
    block = bytes_per_block(model.config, DEFAULT_BLOCK_SIZE, bench.dtype)
    blocks = sequence_blocks(budget, block)  # as replica.runtime.kv_blocks counts them
    out.update(
        budget_from="gpu_memory_utilization" if bench.device.type == "cuda" else "cpu kv_cache_bytes",
        gpu_memory_utilization=utilization,
        budget_bytes=budget,
        block_size=DEFAULT_BLOCK_SIZE,
        block_bytes=block,
        blocks=blocks,
        tokens=blocks * DEFAULT_BLOCK_SIZE,
        bytes=blocks * block,
        full_batch_tokens=PRODUCTION.max_num_seqs * PRODUCTION.max_model_len,
        # lorafleet.sizing's arithmetic for the brief's 80 GB GPU, beside this device's measurement
        sizing_80gb_tokens=gpu_budget(PRODUCTION).kv_tokens,
    )
    if bench.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(bench.device)
        out.update(device_total_bytes=total, in_use_bytes=total - free)
