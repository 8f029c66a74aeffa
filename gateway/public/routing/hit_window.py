"""Per replica, the share of the last minute's requests that found their adapter in a GPU slot (pure).

Counted in one-second buckets, so memory per replica is bounded by the window whatever the request rate.
"""

from __future__ import annotations

from collections import deque

WINDOW_S = 60


class HitWindow:
    """replica_id -> deque of [second, gpu hits, requests], the last WINDOW_S seconds."""

    def __init__(self, window_s: int = WINDOW_S) -> None:
        self.window_s = window_s
        self._buckets: dict[str, deque[list[int]]] = {}

    def record(self, replica_id: str, gpu: bool, now: float) -> None:
        buckets = self._buckets.setdefault(replica_id, deque())
        second = int(now)
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += int(gpu)
            buckets[-1][2] += 1
        else:
            buckets.append([second, int(gpu), 1])
        self._prune(buckets, second)

    def rate(self, replica_id: str, now: float) -> float | None:
        """GPU hits over requests in the window; None when no request went there in it."""
        buckets = self._buckets.get(replica_id)
        if not buckets:
            return None
        self._prune(buckets, int(now))
        requests = sum(b[2] for b in buckets)
        return sum(b[1] for b in buckets) / requests if requests else None

    def _prune(self, buckets: deque[list[int]], second: int) -> None:
        while buckets and buckets[0][0] <= second - self.window_s:
            buckets.popleft()
