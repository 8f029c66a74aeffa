"""Per-step attention and LoRA metadata, set by the model runner and read by the layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from replica.lora.batch_meta import LoraBatchMeta


@dataclass
class Context:
    """What one forward pass over a packed batch (all sequences' new tokens concatenated) needs."""

    token_rows: torch.Tensor  # [num_tokens] long: KV-cache row of each token's sequence
    # prefill sequences, attended one by one: (kv_row, first_token, num_new_tokens, context_len)
    prefills: list[tuple[int, int, int, int]]
    # decode sequences (one new token each), attended together
    decode_token_idx: torch.Tensor  # [num_decodes] long: index of the token in the packed batch
    decode_rows: torch.Tensor  # [num_decodes] long: KV-cache row
    # decode attention runs over the cache rows 0..decode_span-1 as a view (no copy of the cache);
    # decode_mask [decode_span, 1, 1, max_decode_context_len] keeps each decoding row's own positions
    # (rows that are not decoding keep position 0 only, so their unused output stays finite)
    decode_mask: torch.Tensor
    max_decode_context_len: int
    lora: LoraBatchMeta | None = None
    decode_span: int = 0


_CONTEXT: Context | None = None


def set_context(context: Context | None) -> None:
    """Install the metadata for the next forward pass (None: plain single-sequence causal forward)."""
    global _CONTEXT
    _CONTEXT = context


def get_context() -> Context | None:
    """Return the metadata of the forward pass in progress, if any."""
    return _CONTEXT
