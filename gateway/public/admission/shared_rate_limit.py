"""Each tenant's token buckets shared by every public gateway through Redis, with a local fallback.

Contract (docs/security.md, "Rate limits across gateways"):
- Redis holds one hash per tenant (requests and tokens levels, last refill on Redis's own clock). A reserve
  and a refund are each one Lua script, so they are atomic across gateways: N gateways together admit the
  tenant's limit, not N times it. The buckets follow gateway.public.admission.rate_limit's rules (a
  one-second burst of requests, a minute of tokens, both-or-neither reservation, refund of unused tokens).
- The keys are namespaced by the database the gateways read tenants from, so two fleets sharing a Redis
  never share a tenant's bucket.
- When Redis does not answer within its timeout, this gateway admits from a local bucket at the limit
  divided by fallback_share (the number of public gateways), so the fleet still admits about the limit
  in total; it tries Redis again after retry_s. A refund goes back to the store that made the reservation.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.public.admission.rate_limit import Decision, Limits, RateLimiter
from gateway.public.pause import Pause

log = logging.getLogger(__name__)

Store = Literal["redis", "local"]

# KEYS[1]: the tenant's bucket. ARGV: requests capacity, requests/s, tokens capacity, tokens/s, tokens
# wanted, key ttl (ms). Returns {admitted, requests wait, tokens wait ("inf" if it can never fit)}.
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rcap, rrate = tonumber(ARGV[1]), tonumber(ARGV[2])
local tcap, trate, want = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local h = redis.call('HMGET', KEYS[1], 'req', 'tok', 'ts')
local req, tok, ts = tonumber(h[1]) or rcap, tonumber(h[2]) or tcap, tonumber(h[3]) or now
if now > ts then
  req = req + (now - ts) * rrate
  tok = tok + (now - ts) * trate
  ts = now
end
req = math.min(rcap, req)
tok = math.min(tcap, tok)
local rwait = 0
if req < 1 then rwait = (1 - req) / rrate end
local twait = '0'
if want > tcap then twait = 'inf' elseif tok < want then twait = tostring((want - tok) / trate) end
local admitted = 0
if rwait == 0 and twait == '0' then
  req = req - 1
  tok = tok - want
  admitted = 1
end
redis.call('HSET', KEYS[1], 'req', tostring(req), 'tok', tostring(tok), 'ts', tostring(ts),
  'tcap', tostring(tcap), 'trate', tostring(trate))
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {admitted, tostring(rwait), twait}
"""

# KEYS[1]: the tenant's bucket. ARGV: tokens to give back. A bucket that expired is full already.
_REFUND = """
local h = redis.call('HMGET', KEYS[1], 'tok', 'ts', 'tcap', 'trate')
if not h[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tok, ts, tcap, trate = tonumber(h[1]), tonumber(h[2]), tonumber(h[3]), tonumber(h[4])
if now > ts then
  tok = tok + (now - ts) * trate
  ts = now
end
tok = math.min(tcap, tok + tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'tok', tostring(tok), 'ts', tostring(ts))
return 1
"""


def bucket_prefix(database_url: str) -> str:
    """The key prefix of one fleet: its tenants are the rows of one database."""
    return "lorafleet:ratelimit:" + hashlib.sha256(database_url.encode()).hexdigest()[:16] + ":"


def share(limits: Limits, n: int) -> Limits:
    """One gateway's part of a tenant's limits when n gateways each count alone."""
    return Limits(limits.requests_per_s / n, limits.tokens_per_min / n)


@dataclass(frozen=True)
class Reservation:
    """The decision and the store that holds the reservation (where its refund goes)."""

    decision: Decision
    store: Store


class SharedRateLimiter:
    """Reserve and refund in Redis; the local fallback while Redis is unreachable."""

    def __init__(
        self,
        redis: Redis | None,
        prefix: str,
        fallback_share: int = 1,
        retry_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.fallback_share = max(1, fallback_share)
        self.retry_s = retry_s
        self.clock = clock
        self.local = RateLimiter()
        self.redis_errors = 0
        self.redis_pause = Pause(retry_s, clock)
        if redis is not None:
            self._reserve = redis.register_script(_RESERVE)
            self._refund = redis.register_script(_REFUND)

    @property
    def in_fallback(self) -> bool:
        """Whether admissions are counted locally now (no Redis, or Redis failed within retry_s)."""
        return self.redis is None or self.redis_pause.active()

    def _failed(self, exc: Exception) -> None:
        self.redis_errors += 1
        if self.redis_pause.start():
            log.warning(
                "Redis unreachable (%s): admitting at 1/%d of each limit locally, retrying in %.1fs",
                exc,
                self.fallback_share,
                self.retry_s,
            )

    async def reserve(self, tenant_id: str, limits: Limits, tokens: int) -> Reservation:
        if not self.in_fallback:
            try:
                return Reservation(await self._reserve_shared(tenant_id, limits, tokens), "redis")
            except (RedisError, OSError) as exc:
                self._failed(exc)
        return Reservation(self._reserve_local(tenant_id, limits, tokens), "local")

    async def refund(self, tenant_id: str, tokens: int, store: Store) -> None:
        if tokens <= 0:
            return
        if store == "local":
            self.local.refund(tenant_id, tokens, self.clock())
            return
        if self.redis is None or self.in_fallback:
            return  # the bucket refills on its own; a refund is not worth a wait on a failing Redis
        try:
            await self._refund(keys=[self.prefix + tenant_id], args=[tokens])
        except (RedisError, OSError) as exc:
            self._failed(exc)

    async def _reserve_shared(self, tenant_id: str, limits: Limits, tokens: int) -> Decision:
        # the same buckets as gateway.public.admission.rate_limit.TenantLimiter: a one-second burst, a
        # minute of tokens
        ttl_ms = int(1000 * (60 + max(1.0, limits.requests_per_s) / limits.requests_per_s))
        args = [max(1.0, limits.requests_per_s), limits.requests_per_s]
        args += [limits.tokens_per_min, limits.tokens_per_min / 60.0, tokens, ttl_ms]
        admitted, req_wait, tok_wait = await self._reserve(keys=[self.prefix + tenant_id], args=args)
        if int(admitted):
            return Decision(True)
        waits = {"requests_per_s": float(req_wait), "tokens_per_min": float(tok_wait)}
        limit, wait = max(waits.items(), key=lambda kv: kv[1])
        return Decision(False, limit, wait)

    def _reserve_local(self, tenant_id: str, limits: Limits, tokens: int) -> Decision:
        decision = self.local.reserve(tenant_id, share(limits, self.fallback_share), tokens, self.clock())
        if decision.retry_after_s == math.inf and tokens <= limits.tokens_per_min:
            # fits the whole limit, only not this gateway's share: a wait, not a request that never fits
            return Decision(False, "tokens_per_min", self.retry_s)
        return decision
