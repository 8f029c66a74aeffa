"""Counter-based sampling noise: Gumbel noise from a stateless hash of (seed, output index, token id).

A row's noise depends on its own key only, so a seeded request draws the same token alone or anywhere in
any batch. The hash is exact int64 arithmetic on values kept to 32 bits: the same bits on CPU and CUDA.
"""

from __future__ import annotations

import torch

from replica.engine.host_values import from_host

MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31: a 32-bit value times one stays below 2**63, so int64 never overflows.
_ROUNDS = ((0x7FEB352D, 15), (0x21F0AAAD, 15), (0x31848BAB, 14))
_MULT_SALT = 0x68E31DA4  # nonzero salts: seed 0 must not start at mix32's fixed point 0
_OFFSET_SALT = 0x1B873593


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit mixer (xorshift-multiply rounds) of int64 values in [0, 2**32), any shape."""
    x = x ^ (x >> 16)
    for mult, shift in _ROUNDS:
        x = (x * mult) & MASK32
        x = x ^ (x >> shift)
    return x


def row_keys(seeds: list[int], steps: list[int], device: torch.device) -> torch.Tensor:
    """Each row's hash key [rows, 2] int64 (an odd multiplier below 2**31, an offset below 2**32) from its
    seed (any int, read as 64 bits) and its output index."""
    words = from_host(
        [[s & MASK32, (s >> 32) & MASK32, n & MASK32] for s, n in zip(seeds, steps, strict=True)],
        torch.int64,
        device,
    )  # [rows, 3]: seed low word, seed high word, output index
    lo, hi, index = words.unbind(dim=1)  # [rows] each
    # two chains with their own salts: two rows share all their noise with odds near 2**-62, not 2**-32
    mult = (mix32(mix32(mix32(lo ^ _MULT_SALT) ^ hi) ^ index) & 0x7FFFFFFF) | 1  # [rows], odd
    offset = mix32(mix32(mix32(hi ^ _OFFSET_SALT) ^ lo) ^ index)  # [rows]
    return torch.stack([mult, offset], dim=1)


def uniforms(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """Uniforms [rows, vocab] float32 strictly inside (0, 1) for keys [rows, 2]: mix32(mult * token + offset).

    A per-row affine map before the mixer keeps two rows' hash inputs from being shifted copies of each other.
    Each uniform is (2k + 1) * 2**-24 for a 23-bit k: exact in float32, never 0 or 1, so log is always finite.
    """
    tokens = torch.arange(vocab, dtype=torch.int64, device=keys.device)  # [vocab]
    x = (tokens * keys[:, :1] + keys[:, 1:]) & MASK32  # [rows, vocab]; below 2**31 * 2**31 + 2**32
    bits = mix32(x) >> 9  # [rows, vocab], 23 bits
    return (bits * 2 + 1).to(torch.float32) * 2.0**-24


def gumbel(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise [rows, vocab] float32: argmax(logits + noise) draws from softmax(logits)."""
    return -torch.log(-torch.log(uniforms(keys, vocab)))
