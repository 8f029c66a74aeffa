"""A byte-budgeted LRU over keys, with pins: pure bookkeeping that tiers use to choose what to evict.

A pinned key (pin count > 0) is in use and is never chosen. Adding a key evicts idle keys, least recently
used first, until the new one fits; if only pinned keys are left, nothing changes and TierFullError says so.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

from replica.adapter_cache.errors import TierFullError

K = TypeVar("K", bound=Hashable)


class ByteLru(Generic[K]):
    """key -> size in bytes, in least-recently-used order, within `budget` bytes."""

    def __init__(self, budget: int, name: str = "tier") -> None:
        self.budget = budget
        self.name = name
        self._sizes: OrderedDict[K, int] = OrderedDict()
        self._pins: Counter[K] = Counter()
        self.used = 0

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def keys(self) -> list[K]:
        """Keys from least to most recently used."""
        return list(self._sizes)

    def size(self, key: K) -> int:
        return self._sizes[key]

    def pins(self, key: K) -> int:
        return self._pins[key]

    def touch(self, key: K) -> None:
        self._sizes.move_to_end(key)

    def plan(self, size: int) -> list[K]:
        """The idle keys, LRU first, that must go for `size` more bytes to fit (else TierFullError)."""
        if size > self.budget:
            raise TierFullError(f"{size} bytes exceed the whole {self.name} budget of {self.budget}")
        need = self.used + size - self.budget
        victims: list[K] = []
        for key, key_size in self._sizes.items():
            if need <= 0:
                break
            if self._pins[key] == 0:
                victims.append(key)
                need -= key_size
        if need > 0:
            raise TierFullError(f"{self.name} is full of adapters in use ({self.used}/{self.budget} bytes)")
        return victims

    def add(self, key: K, size: int) -> list[K]:
        """Insert (or refresh) key; return the keys evicted to make room, which the caller must drop."""
        if key in self._sizes:
            self.touch(key)
            return []
        victims = self.plan(size)
        for victim in victims:
            self.remove(victim)
        self._sizes[key] = size
        self.used += size
        return victims

    def remove(self, key: K) -> None:
        """Forget a key (explicit unload or eviction); its pins go with it."""
        size = self._sizes.pop(key, None)
        if size is not None:
            self.used -= size
        self._pins.pop(key, None)

    def pin(self, key: K) -> None:
        if key not in self._sizes:
            raise KeyError(key)
        self._pins[key] += 1

    def unpin(self, key: K) -> None:
        if self._pins[key] <= 0:
            raise ValueError(f"{key!r} unpinned more often than pinned")
        self._pins[key] -= 1
