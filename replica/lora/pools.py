"""Stacked adapter weights for one adapted linear and one rank bucket, indexed by slot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(eq=False)  # identity, not tensor-wise equality
class BucketPool:
    """a [num_slots, rank, in_features], b [num_slots, out_features, rank], scale [num_slots] (fp32).

    An adapter of smaller rank than the bucket is zero-padded: the extra rows of A and columns of B are
    zero, so they add nothing; so is a module the adapter does not target, with scale 0. A SlotArena
    (replica.lora.arena) builds every pool: a, b and scale are views into the arena's rows, so the slot
    stride is the row, and GpuTier writes a slot as one row (replica.adapter_cache.slot_copy).
    """

    rank: int
    a: torch.Tensor
    b: torch.Tensor
    scale: torch.Tensor
    arena: Any  # the SlotArena these are views of
    key: tuple[int, str]  # the module's (layer index, name) in the arena's row

    @property
    def num_slots(self) -> int:
        return self.a.shape[0]
