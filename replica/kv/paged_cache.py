"""The paged KV cache's tensors: k and v [num_layers, num_blocks, block_size, kv_heads, head_dim], each
layer's slice bound to its attention module."""

from __future__ import annotations

import torch

from replica.model.llama import LlamaAttention, LlamaConfig, LlamaForCausalLM


def bytes_per_block(config: LlamaConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V of block_size tokens over every layer (7B, 16 tokens, fp16: 8 MiB)."""
    per_token = config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    return 2 * per_token * block_size * torch.finfo(dtype).bits // 8


class PagedKVCache:
    """The blocks every sequence's K and V live in; which block is whose is the block manager's business.

    num_blocks blocks are the sequences'; one more, the sink (index num_blocks), takes the writes of a
    padded decode step's padding rows and is never handed to a sequence.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        cfg = model.config
        shape = (cfg.num_hidden_layers, num_blocks + 1, block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.sink_block = num_blocks
        for i, layer in enumerate(model.model.layers):
            attn = layer.self_attn
            assert isinstance(attn, LlamaAttention)  # LoRA wraps the projections, never the attention
            attn.k_cache, attn.v_cache = self.k[i], self.v[i]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
