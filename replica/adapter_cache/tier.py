"""Tier names, the record of one load or eviction, and per-minute rates: plain values shared by the cache."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

# Where an adapter is, fastest first; "remote" is the object store (nothing on this machine).
Tier = Literal["gpu", "ram", "disk", "remote"]
TIER_ORDER: dict[str, int] = {"gpu": 0, "ram": 1, "disk": 2, "remote": 3}


def satisfies(have: str, want: str) -> bool:
    """True when an adapter in tier `have` is at least as close to a slot as `want` asks."""
    return TIER_ORDER[have] <= TIER_ORDER[want]


@dataclass(frozen=True)
class CacheEvent:
    """One load (from_tier -> to_tier) or one eviction (out of from_tier)."""

    kind: Literal["load", "evict"]
    adapter_id: str
    from_tier: Tier | None
    to_tier: Tier | None
    duration_s: float = 0.0
    bytes: int = 0


class RateWindow:
    """How many times something happened in the last `window_s` seconds."""

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._times: deque[float] = deque()
        self.total = 0

    def mark(self) -> None:
        self._times.append(self.clock())
        self.total += 1

    def count(self) -> int:
        cutoff = self.clock() - self.window_s
        while self._times and self._times[0] < cutoff:
            self._times.popleft()
        return len(self._times)
