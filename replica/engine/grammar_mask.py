"""The sampler's mask step: each constrained row's logits keep only the tokens its grammar allows next.

Semantics, for row i with a grammar g and every token t: logits[i, t] = -inf unless bit t of
g.allowed_bitmask() is set; rows without a grammar are returned unchanged. No row constrained: logits
itself, with no copy and no device work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from replica.engine.host_values import from_host, to_device


class Grammar(Protocol):
    """One sequence's grammar state (replica.structured.matcher.GrammarMatcher)."""

    def allowed_bitmask(self) -> bytes:
        """Bit t % 8 of byte t // 8 is set when token t may come next."""
        ...

    def advance(self, token_id: int) -> bool: ...


def constrain(logits: torch.Tensor, grammars: Sequence[Grammar | None]) -> torch.Tensor:
    """logits [rows, vocab] with each constrained row masked (a copy); grammars[i] is row i's or None."""
    rows = [i for i, g in enumerate(grammars) if g is not None]
    if not rows:
        return logits
    vocab = logits.shape[-1]
    masks = [np.frombuffer(g.allowed_bitmask(), dtype=np.uint8) for g in grammars if g is not None]
    packed = torch.from_numpy(np.stack(masks))  # [constrained, vocab_bytes] uint8, bit t of byte t // 8
    allowed = unpack_bits(to_device(packed, logits.device), vocab)  # [constrained, vocab] bool
    index = from_host(rows, torch.int64, logits.device)  # [constrained]
    masked = logits.clone()  # [rows, vocab]
    masked[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return masked


def unpack_bits(packed: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bits [n, vocab] bool of bytes [n, vocab_bytes] uint8, lowest bit first; tokens past them are False."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)  # [8]
    bits = ((packed[:, :, None] >> shifts) & 1).bool().flatten(1)  # [n, vocab_bytes * 8]
    if bits.shape[1] >= vocab:
        return bits[:, :vocab]
    pad = torch.zeros(bits.shape[0], vocab - bits.shape[1], dtype=torch.bool, device=packed.device)
    return torch.cat([bits, pad], dim=1)
