"""The sizes each run mode of bench/gpu_check.py measures at: full and quick on a GPU, a CPU smoke run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SHAPES: dict[str, dict[str, Any]] = {
    "7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=32),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}  # fmt: skip


@dataclass(frozen=True)
class Mode:
    """What one run measures; distinct counts above a batch size are left out of the grid."""

    shape: str  # a key of SHAPES
    device: str  # "cuda" or "cpu"
    dtype: torch.dtype
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    distinct: tuple[int, ...]
    calibration_context: int  # the decode context the calibration file takes its steps from
    kernel_ranks: tuple[int, ...]  # LoRA kernel checks at each module shape, in the mode's dtype
    kernel_dtypes: tuple[torch.dtype, ...]  # further checks at hidden x hidden, rank 16 (each a compile)
    warmup: int
    iters: int  # timed decode steps per grid point
    prefill_iters: int
    prefill_lens: tuple[int, ...]  # one sequence each, base only
    prefill_multi: tuple[int, int]  # (sequences, tokens each), with 0 and 8 distinct adapters
    mixed: tuple[int, int, int]  # (decode rows, their context, one prefill chunk's tokens) in one step
    load_ranks: tuple[int, ...]
    load_repeats: int
    sampling_batches: tuple[int, ...]
    deadline_s: float  # after this many seconds from the start, what is left is skipped
    cpu_kv_bytes: int  # the KV budget the replica takes on a CPU (kv_cache_bytes), for the smoke run


MODES: dict[str, Mode] = {
    "full": Mode(
        shape="7b",
        device="cuda",
        dtype=torch.bfloat16,
        batches=(1, 8, 16, 32, 64),
        contexts=(128, 1024, 2048),
        distinct=(0, 1, 8, 32),
        calibration_context=1024,
        kernel_ranks=(8, 16, 32, 64),
        kernel_dtypes=(torch.float16, torch.float32),
        warmup=3,
        iters=20,
        prefill_iters=5,
        prefill_lens=(128, 512, 2048),
        prefill_multi=(8, 512),
        mixed=(31, 1024, 512),
        load_ranks=(8, 16, 64),
        load_repeats=10,
        sampling_batches=(32, 64),
        deadline_s=420.0,
        cpu_kv_bytes=0,
    ),
    "quick": Mode(
        shape="7b",
        device="cuda",
        dtype=torch.bfloat16,
        batches=(1, 32),
        contexts=(1024,),
        distinct=(0, 1, 32),
        calibration_context=1024,
        kernel_ranks=(16, 64),
        kernel_dtypes=(),
        warmup=2,
        iters=10,
        prefill_iters=3,
        prefill_lens=(512, 2048),
        prefill_multi=(8, 512),
        mixed=(31, 1024, 512),
        load_ranks=(8, 16, 64),
        load_repeats=5,
        sampling_batches=(32, 64),
        deadline_s=160.0,
        cpu_kv_bytes=0,
    ),
    "cpu-smoke": Mode(
        shape="tiny",
        device="cpu",
        dtype=torch.float32,
        batches=(1, 32),
        contexts=(16, 64),
        distinct=(0, 1, 8, 32),
        calibration_context=64,
        kernel_ranks=(8, 16),
        kernel_dtypes=(),
        warmup=1,
        iters=3,
        prefill_iters=2,
        prefill_lens=(16, 64),
        prefill_multi=(8, 16),
        mixed=(7, 64, 16),
        load_ranks=(8, 16, 64),
        load_repeats=3,
        sampling_batches=(32, 64),
        deadline_s=300.0,
        cpu_kv_bytes=64 << 20,
    ),
}
