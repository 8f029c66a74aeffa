"""KV cache: one contiguous row of max_model_len positions per running sequence (rows from RowAllocator)."""

from __future__ import annotations

import torch

from replica.model.llama import LlamaAttention, LlamaForCausalLM


class RowAllocator:
    """Pure bookkeeping of free KV rows (lowest row first, so runs are reproducible)."""

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self._free = list(range(num_rows))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int | None:
        """Take the lowest free row, or None when all are in use."""
        if not self._free:
            return None
        self._free.sort()
        return self._free.pop(0)

    def free(self, row: int) -> None:
        if row in self._free or not 0 <= row < self.num_rows:
            raise ValueError(f"row {row} is not allocated")
        self._free.append(row)


class KVCache:
    """k, v [num_layers, max_num_seqs, kv_heads, max_model_len, head_dim], bound to the attention layers."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        max_num_seqs: int,
        max_model_len: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        cfg = model.config
        shape = (cfg.num_hidden_layers, max_num_seqs, cfg.num_key_value_heads, max_model_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_model_len = max_model_len
        for i, layer in enumerate(model.model.layers):
            attn = layer.self_attn
            assert isinstance(attn, LlamaAttention)  # LoRA wraps the projections, never the attention
            attn.k_cache, attn.v_cache = self.k[i], self.v[i]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    @staticmethod
    def bytes_needed(
        model: LlamaForCausalLM, max_num_seqs: int, max_model_len: int, dtype: torch.dtype
    ) -> int:
        """Size of a cache before allocating it (7B, 32 x 2000, fp16: about 8.4 GB)."""
        cfg = model.config
        per = cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * torch.finfo(dtype).bits // 8
        return 2 * per * max_num_seqs * max_model_len
