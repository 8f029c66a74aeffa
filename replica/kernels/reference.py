"""Torch reference for the multi-LoRA adapter path: the semantics every kernel must match.

For one adapted linear layer with base weight W [hidden_out, hidden_in], a rank-bucket pool holds
    a_stack [num_slots, rank, hidden_in]    (PEFT lora_A, zero-padded to the bucket's rank)
    b_stack [num_slots, hidden_out, rank]   (PEFT lora_B, zero-padded to the bucket's rank)
    scale   [num_slots]                     (alpha / r, or alpha / sqrt(r) for rsLoRA)
and each batch row i carries slot_of_row[i] in [-1, num_slots); -1 means "no adapter in this pool".

    h = x W^T                                          (once for the whole batch, outside these functions)
    t = shrink(x)      t[i] = a_stack[s_i] @ x[i]      (zeros where s_i == -1)
    expand(h, t)       h[i] += scale[s_i] * (b_stack[s_i] @ t[i])   (untouched where s_i == -1)

There is no Python loop over adapters: rows gather their slot's matrices and run one batched multiply.
"""

from __future__ import annotations

import torch


def lora_shrink_ref(x: torch.Tensor, a_stack: torch.Tensor, slot_of_row: torch.Tensor) -> torch.Tensor:
    """Return t [num_tokens, rank] = a_stack[slot] @ x per row, zeros for slot -1 (fp32 accumulate)."""
    # x [num_tokens, hidden_in]; a_stack [num_slots, rank, hidden_in]; slot_of_row [num_tokens] int
    valid = slot_of_row >= 0
    safe = torch.where(valid, slot_of_row, torch.zeros_like(slot_of_row)).long()
    a_rows = a_stack[safe]  # [num_tokens, rank, hidden_in]
    t = torch.bmm(a_rows.float(), x.float().unsqueeze(-1)).squeeze(-1)  # [num_tokens, rank]
    t = t * valid.unsqueeze(-1)
    return t.to(x.dtype)


def lora_expand_ref(
    out: torch.Tensor,
    t: torch.Tensor,
    b_stack: torch.Tensor,
    scale: torch.Tensor,
    slot_of_row: torch.Tensor,
) -> None:
    """Add scale[slot] * b_stack[slot] @ t into out, in place, for rows whose slot is not -1."""
    # out [num_tokens, hidden_out]; t [num_tokens, rank]; b_stack [num_slots, hidden_out, rank]
    # scale [num_slots]; slot_of_row [num_tokens] int
    valid = slot_of_row >= 0
    safe = torch.where(valid, slot_of_row, torch.zeros_like(slot_of_row)).long()
    b_rows = b_stack[safe]  # [num_tokens, hidden_out, rank]
    delta = torch.bmm(b_rows.float(), t.float().unsqueeze(-1)).squeeze(-1)  # [num_tokens, hidden_out]
    delta = delta * (scale[safe].float() * valid).unsqueeze(-1)
    out.add_(delta.to(out.dtype))


def lora_loop_ref(
    x: torch.Tensor,
    a_stack: torch.Tensor,
    b_stack: torch.Tensor,
    scale: torch.Tensor,
    slot_of_row: torch.Tensor,
) -> torch.Tensor:
    """The plain per-row loop the batched functions equal; used only by tests as the ground truth."""
    # returns delta [num_tokens, hidden_out] in fp32
    delta = torch.zeros(x.shape[0], b_stack.shape[1], dtype=torch.float32)
    for i, s in enumerate(slot_of_row.tolist()):
        if s < 0:
            continue
        delta[i] = scale[s].float() * (b_stack[s].float() @ (a_stack[s].float() @ x[i].float()))
    return delta


def paged_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Paged decode attention, one row at a time (the semantics of kernels.paged_attention), fp32 inside."""
    # q [num_rows, heads, head_dim]; k_cache, v_cache [num_blocks, block_size, kv_heads, head_dim]
    # block_tables [num_rows, max_blocks]; context_lens [num_rows] -> out [num_rows, heads, head_dim]
    _, block_size, kv_heads, head_dim = k_cache.shape
    group = q.shape[1] // kv_heads
    out = torch.zeros_like(q)
    for i in range(q.shape[0]):
        n = int(context_lens[i])
        if n == 0:
            continue
        blocks = block_tables[i, : -(-n // block_size)].long()
        k = k_cache[blocks].reshape(-1, kv_heads, head_dim)[:n].float()  # [n, kv_heads, head_dim]
        v = v_cache[blocks].reshape(-1, kv_heads, head_dim)[:n].float()
        for h in range(q.shape[1]):
            p = torch.softmax(scale * (k[:, h // group] @ q[i, h].float()), dim=0)  # [n]
            out[i, h] = (p @ v[:, h // group]).to(q.dtype)
    return out
