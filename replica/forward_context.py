"""Per-step attention and LoRA metadata, set by the model runner and read by the layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from replica.kernels.paged_ops import DecodeIndex
    from replica.lora.batch_meta import LoraBatchMeta


class PrefillSpan(NamedTuple):
    """One sequence computing several tokens this step (a prompt, or a chunk of one)."""

    first: int  # index of its first new token in the packed batch
    length: int  # its new tokens
    context_len: int  # positions it attends to: what was cached before, plus its new tokens
    blocks: torch.Tensor  # [>= ceil(context_len / block_size)] long: its block table


@dataclass
class Context:
    """What one forward pass over a packed batch (all sequences' new tokens concatenated) needs."""

    slot_mapping: (
        torch.Tensor
    )  # [num_tokens] long: the cache slot (block * block_size + offset) of each token
    prefills: list[PrefillSpan]  # attended one by one
    # sequences with one new token (decoding), attended together over their own blocks
    decode_token_idx: torch.Tensor  # [num_decodes] long: index of the token in the packed batch
    block_tables: torch.Tensor  # [num_decodes, max_blocks] int32: each decoding row's blocks (padded)
    context_lens: torch.Tensor  # [num_decodes] int32: positions each decoding row attends to
    max_decode_blocks: int  # blocks the longest decoding row spans (bounds the torch path's reads)
    lora: LoraBatchMeta | None = None
    all_decode: bool = False  # every token is a decoding row's, in row order: attention skips the row gather
    decode_index: DecodeIndex | None = None  # the torch decode path's gather and mask, set by the first layer


_CONTEXT: Context | None = None


def set_context(context: Context | None) -> None:
    """Install the metadata for the next forward pass (None: plain single-sequence causal forward)."""
    global _CONTEXT
    _CONTEXT = context


def get_context() -> Context | None:
    """Return the metadata of the forward pass in progress, if any."""
    return _CONTEXT
