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


class Grammar(Protocol):
    """One sequence's grammar state (replica.structured.matcher.GrammarMatcher)."""

    def allowed_bitmask(self) -> bytes: ...

    def advance(self, token_id: int) -> bool: ...


def constrain(logits: torch.Tensor, grammars: Sequence[Grammar | None]) -> torch.Tensor:
    """logits [rows, vocab] with each constrained row masked (a copy); grammars[i] is row i's or None."""
    rows = [i for i, g in enumerate(grammars) if g is not None]
    if not rows:
        return logits
    vocab = logits.shape[-1]
    masks = [np.frombuffer(g.allowed_bitmask(), dtype="<i4") for g in grammars if g is not None]
    words = torch.from_numpy(np.stack(masks))  # [constrained, vocab_words] int32, bit t of word t // 32
    allowed = unpack_bits(words.to(logits.device, non_blocking=True), vocab)  # [constrained, vocab] bool
    index = torch.tensor(rows, dtype=torch.int64).to(logits.device, non_blocking=True)  # [constrained]
    masked = logits.clone()  # [rows, vocab]
    masked[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return masked


def unpack_bits(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bits [n, vocab] bool of little-endian int32 words [n, vocab_words]; tokens past the words are False."""
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)  # [32]
    bits = ((words[:, :, None] >> shifts) & 1).bool().flatten(1)  # [n, vocab_words * 32]
    if bits.shape[1] >= vocab:
        return bits[:, :vocab]
    pad = torch.zeros(bits.shape[0], vocab - bits.shape[1], dtype=torch.bool, device=words.device)
    return torch.cat([bits, pad], dim=1)
