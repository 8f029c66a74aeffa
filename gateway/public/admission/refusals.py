"""The 429s of admission, in OpenAI's shape: a rate limit (Retry-After from the bucket) and the cap on a
tenant's open requests."""

from __future__ import annotations

from typing import NoReturn

from gateway.errors import Overloaded, RateLimited
from gateway.public.admission.rate_limit import Decision, retry_after_header
from gateway.tenants import Caller


def refuse_if_limited(decision: Decision, caller: Caller) -> None:
    """Raise the 429 for a refused admission, with Retry-After; nothing for an admitted one."""
    if decision.admitted:
        return
    kind = "requests" if decision.limit == "requests_per_s" else "tokens"
    wait = retry_after_header(decision.retry_after_s)
    raise RateLimited(
        kind,
        f"Rate limit reached for {caller.tenant_id} on {decision.limit}; try again in {wait}s.",
        {"Retry-After": wait, "retry-after-ms": str(max(1, int(decision.retry_after_s * 1000)))},
    )


def refuse_concurrency(caller: Caller, cap: int) -> NoReturn:
    """The tenant has cap requests open on this gateway (its share of the per-tenant limit)."""
    raise Overloaded(
        "concurrency_limit_exceeded",
        f"{caller.tenant_id} has {cap} requests open on this gateway, its limit; retry when one has finished",
        None,
        {"Retry-After": "1"},
    )
