"""Load failures remembered for failure_ttl_s: requests for that adapter meanwhile get the same error at
once, without another fetch; the first request after the TTL tries again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from replica.adapter_cache.errors import AdapterCacheError


@dataclass(frozen=True)
class Failure:
    until: float  # clock time from which it no longer counts
    error: AdapterCacheError


class FailedLoads:
    """adapter_id -> its last load failure, one entry per failing adapter and only while it counts."""

    def __init__(self) -> None:
        self.failures: dict[str, Failure] = {}

    def remember(self, adapter_id: str, exc: AdapterCacheError, now: float, ttl_s: float) -> None:
        for expired in [a for a, f in self.failures.items() if f.until <= now]:
            del self.failures[expired]
        self.failures[adapter_id] = Failure(now + ttl_s, exc)
        if exc.status == 503:
            exc.retry_after_s = ttl_s

    def refuse_if_failed(
        self, adapter_id: str, clock: Callable[[], float], ttl_s: float, loaded: Callable[[], bool]
    ) -> None:
        """Raise the adapter's failure again while it counts; forget it once expired, or once the adapter
        is loaded (an owner's load succeeded since)."""
        failed = self.failures.get(adapter_id)
        if failed is None:
            return
        exc = failed.error
        left = failed.until - clock()
        if left <= 0 or loaded():
            del self.failures[adapter_id]  # this request goes on
            return
        again = type(exc)(f"{exc.message} (failed {ttl_s - left:.1f}s ago)", exc.param)
        again.code, again.type, again.status = exc.code, exc.type, exc.status
        if exc.status == 503:
            again.retry_after_s = left
        raise again
