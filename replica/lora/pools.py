"""Stacked adapter weights for one adapted linear and one rank bucket, indexed by slot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(eq=False)  # identity, not tensor-wise equality
class BucketPool:
    """a [num_slots, rank, in_features], b [num_slots, out_features, rank], scale [num_slots] (fp32).

    An adapter of smaller rank than the bucket is zero-padded: the extra rows of A and columns of B are
    zero, so they add nothing. A free or reset slot is all zeros with scale 0. A SlotArena
    (replica.lora.arena) builds every pool: a, b and scale are views into the arena's rows, so the slot
    stride is the row.
    """

    rank: int
    a: torch.Tensor
    b: torch.Tensor
    scale: torch.Tensor
    arena: Any  # the SlotArena these are views of

    @property
    def num_slots(self) -> int:
        return self.a.shape[0]

    def write(self, index: int, a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
        """Copy one adapter's module weights into slot index, padding its rank up to the bucket's."""
        # a [r, in_features]; b [out_features, r]; r <= self.rank
        r = a.shape[0]
        self.a[index].zero_()
        self.b[index].zero_()
        self.a[index, :r].copy_(a)
        self.b[index, :, :r].copy_(b)
        self.scale[index] = scale

    def reset(self, index: int) -> None:
        """Zero a slot so that it contributes nothing."""
        self.a[index].zero_()
        self.b[index].zero_()
        self.scale[index] = 0.0
