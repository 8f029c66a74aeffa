"""Per-tenant token buckets on requests/s and tokens/min: pure state, a clock passed in.

Admission reserves one request and prompt + max_tokens tokens at once (both or neither), so concurrent
requests cannot all see room that only one of them has; completion refunds the tokens it did not use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    """capacity units, refilled at rate units per second; level may not go below zero."""

    capacity: float
    rate: float
    level: float = field(default=-1.0)
    updated: float = 0.0

    def __post_init__(self) -> None:
        if self.level < 0:
            self.level = self.capacity

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = max(self.updated, now)

    def wait_for(self, amount: float) -> float:
        """Seconds until amount is available (after refill); inf if it never fits."""
        if amount > self.capacity:
            return math.inf
        return max(0.0, (amount - self.level) / self.rate)

    def give_back(self, amount: float) -> None:
        self.level = min(self.capacity, self.level + amount)


@dataclass(frozen=True)
class Limits:
    requests_per_s: float
    tokens_per_min: float


@dataclass(frozen=True)
class Decision:
    """admitted, or which limit refused and after how many seconds a retry can succeed."""

    admitted: bool
    limit: str | None = None
    retry_after_s: float = 0.0


class TenantLimiter:
    """The two buckets of one tenant."""

    def __init__(self, limits: Limits, now: float) -> None:
        self.limits = limits
        # A one-second burst of requests; a full minute of tokens.
        self.requests = TokenBucket(max(1.0, limits.requests_per_s), limits.requests_per_s, updated=now)
        self.tokens = TokenBucket(limits.tokens_per_min, limits.tokens_per_min / 60.0, updated=now)

    def reserve(self, tokens: int, now: float) -> Decision:
        """Take one request and `tokens` tokens, or nothing; say how long to wait when refused."""
        self.requests.refill(now)
        self.tokens.refill(now)
        waits = {"requests_per_s": self.requests.wait_for(1), "tokens_per_min": self.tokens.wait_for(tokens)}
        limit, wait = max(waits.items(), key=lambda kv: kv[1])
        if wait > 0:
            return Decision(False, limit, wait)
        self.requests.level -= 1
        self.tokens.level -= tokens
        return Decision(True)

    def refund(self, tokens: int, now: float) -> None:
        """Return reserved tokens that were not used."""
        self.tokens.refill(now)
        if tokens > 0:
            self.tokens.give_back(tokens)


class RateLimiter:
    """tenant_id -> TenantLimiter; limits may change (the tenant row is re-read), buckets are kept."""

    def __init__(self) -> None:
        self._tenants: dict[str, TenantLimiter] = {}

    def reserve(self, tenant_id: str, limits: Limits, tokens: int, now: float) -> Decision:
        limiter = self._tenants.get(tenant_id)
        if limiter is None or limiter.limits != limits:
            limiter = self._tenants[tenant_id] = TenantLimiter(limits, now)
        return limiter.reserve(tokens, now)

    def refund(self, tenant_id: str, tokens: int, now: float) -> None:
        limiter = self._tenants.get(tenant_id)
        if limiter is not None:
            limiter.refund(tokens, now)

    def tokens_available(self, tenant_id: str, now: float) -> float | None:
        limiter = self._tenants.get(tenant_id)
        if limiter is None:
            return None
        limiter.tokens.refill(now)
        return limiter.tokens.level


def retry_after_header(wait_s: float) -> str:
    """Retry-After as an integer number of seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))


def retry_after_of(upstream: str | None) -> str:
    """Another service's Retry-After (seconds) as ours: whole seconds from 1 to 3600, 1 if unreadable."""
    try:
        wait = float(upstream) if upstream is not None else 1.0
    except ValueError:
        return "1"
    return retry_after_header(min(wait, 3600.0)) if math.isfinite(wait) else "1"
