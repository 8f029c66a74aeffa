"""The shared limiter's local fallback: each gateway admits its share of a tenant's limit."""

from __future__ import annotations

import asyncio

from gateway.public.admission.rate_limit import Limits
from gateway.public.admission.shared_rate_limit import SharedRateLimiter, bucket_prefix, share


def test_share_divides_both_limits() -> None:
    assert share(Limits(10, 600), 4) == Limits(2.5, 150)


def test_fallback_admits_one_share_of_the_burst() -> None:
    limiter = SharedRateLimiter(None, "", fallback_share=2, clock=lambda: 0.0)
    limits = Limits(requests_per_s=4, tokens_per_min=1_000_000)
    admitted = [asyncio.run(limiter.reserve("a", limits, 1)) for _ in range(10)]
    assert [r.store for r in admitted] == ["local"] * 10
    assert sum(r.decision.admitted for r in admitted) == 2  # 4/s shared by 2 gateways: a burst of 2 here


def test_fallback_makes_a_request_within_the_limit_wait_not_fail() -> None:
    limiter = SharedRateLimiter(None, "", fallback_share=2, retry_s=3.0, clock=lambda: 0.0)
    decision = asyncio.run(limiter.reserve("a", Limits(10, 1_000), 800)).decision
    assert not decision.admitted and decision.limit == "tokens_per_min" and decision.retry_after_s == 3.0
    never = asyncio.run(limiter.reserve("a", Limits(10, 1_000), 1_001)).decision
    assert never.retry_after_s == float("inf")


def test_fallback_refund_returns_tokens_to_the_local_bucket() -> None:
    limiter = SharedRateLimiter(None, "", clock=lambda: 0.0)
    limits = Limits(100, 600)
    assert asyncio.run(limiter.reserve("a", limits, 500)).decision.admitted
    assert not asyncio.run(limiter.reserve("a", limits, 200)).decision.admitted
    asyncio.run(limiter.refund("a", 450, "local"))
    assert asyncio.run(limiter.reserve("a", limits, 200)).decision.admitted


def test_fleets_on_different_databases_never_share_a_bucket() -> None:
    one, other = bucket_prefix("postgresql://h/a"), bucket_prefix("postgresql://h/b")
    assert one != other and one == bucket_prefix("postgresql://h/a")
