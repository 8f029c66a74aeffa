"""Token buckets on requests/s and tokens/min: atomic reserve, refill, refund, Retry-After."""

from __future__ import annotations

import math

from gateway.public.admission.rate_limit import (
    Limits,
    RateLimiter,
    TenantLimiter,
    TokenBucket,
    retry_after_header,
)


def test_burst_of_requests_admits_exactly_the_bucket() -> None:
    limiter = TenantLimiter(Limits(requests_per_s=10, tokens_per_min=1_000_000), now=0.0)
    decisions = [limiter.reserve(1, now=0.0) for _ in range(50)]
    assert sum(d.admitted for d in decisions) == 10
    refused = decisions[-1]
    assert refused.limit == "requests_per_s" and math.isclose(refused.retry_after_s, 0.1)


def test_tokens_are_reserved_up_front_and_unused_ones_refunded() -> None:
    limiter = TenantLimiter(Limits(requests_per_s=100, tokens_per_min=600), now=0.0)
    assert limiter.reserve(500, now=0.0).admitted
    refused = limiter.reserve(200, now=0.0)
    assert not refused.admitted and refused.limit == "tokens_per_min"
    assert math.isclose(refused.retry_after_s, 10.0)  # 100 more tokens at 10 tokens/s
    limiter.refund(450, now=0.0)  # the first request used 50 of its 500
    assert limiter.reserve(200, now=0.0).admitted


def test_refused_reservation_takes_nothing() -> None:
    limiter = TenantLimiter(Limits(requests_per_s=1, tokens_per_min=60), now=0.0)
    assert not limiter.reserve(61, now=0.0).admitted
    assert limiter.requests.level == 1 and limiter.tokens.level == 60


def test_buckets_refill_with_time_but_not_past_capacity() -> None:
    bucket = TokenBucket(capacity=10, rate=2)
    bucket.level = 0
    bucket.refill(3.0)
    assert bucket.level == 6
    bucket.refill(100.0)
    assert bucket.level == 10


def test_more_than_capacity_never_fits() -> None:
    limiter = TenantLimiter(Limits(requests_per_s=1, tokens_per_min=100), now=0.0)
    assert limiter.reserve(101, now=0.0).retry_after_s == math.inf


def test_tenants_have_separate_buckets() -> None:
    limiter = RateLimiter()
    tight = Limits(requests_per_s=1, tokens_per_min=1000)
    assert limiter.reserve("a", tight, 10, now=0.0).admitted
    assert not limiter.reserve("a", tight, 10, now=0.0).admitted
    assert limiter.reserve("b", tight, 10, now=0.0).admitted


def test_retry_after_is_a_whole_second_at_least_one() -> None:
    assert retry_after_header(0.01) == "1" and retry_after_header(1.2) == "2"
