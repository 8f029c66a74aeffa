"""A bounded least-recently-used map, safe across threads, that counts its hits and misses."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class LruCache(Generic[V]):
    """At most capacity values by key; the least recently used goes first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._values: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        """The value under key (now the most recently used), or None; counts a hit or a miss."""
        with self._lock:
            value = self._values.get(key)
            if value is None:
                self.misses += 1
                return None
            self.hits += 1
            self._values.move_to_end(key)
            return value

    def put(self, key: str, value: V) -> None:
        """Store value under key, dropping the least recently used past capacity."""
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.capacity:
                self._values.popitem(last=False)

    def __len__(self) -> int:
        return len(self._values)
