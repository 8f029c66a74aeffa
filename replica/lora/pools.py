"""Stacked adapter weights for one adapted linear and one rank bucket, indexed by slot."""

from __future__ import annotations

from typing import Any

import torch


class BucketPool:
    """a [num_slots, rank, in_features], b [num_slots, out_features, rank], scale [num_slots] (fp32).

    An adapter of smaller rank than the bucket is zero-padded: the extra rows of A and columns of B are
    zero, so they add nothing. A free or reset slot is all zeros with scale 0. Built by a SlotArena
    (replica.lora.arena), a, b and scale are views into the arena's rows: the slot stride is the row.
    """

    arena: Any = None  # the SlotArena this pool is a view of, if any

    @classmethod
    def of_views(
        cls, rank: int, a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, arena: Any
    ) -> BucketPool:
        """A pool over existing storage: a [S, rank, in], b [S, out, rank], scale [S] fp32."""
        pool = cls.__new__(cls)
        pool.rank, pool.a, pool.b, pool.scale, pool.arena = rank, a, b, scale, arena
        return pool

    def __init__(
        self,
        num_slots: int,
        rank: int,
        in_features: int,
        out_features: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.rank = rank
        self.a = torch.zeros(num_slots, rank, in_features, dtype=dtype, device=device)
        self.b = torch.zeros(num_slots, out_features, rank, dtype=dtype, device=device)
        self.scale = torch.zeros(num_slots, dtype=torch.float32, device=device)

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
