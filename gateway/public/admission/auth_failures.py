"""A limit on failed authentications per source address, shared by every public gateway through Redis.

Contract (docs/api.md, "Errors"):
- A source is the client address the server sees (uvicorn puts a trusted proxy's X-Forwarded-For there).
- Each failed authentication (a missing, malformed, unknown or revoked key) counts one in the source's
  window, which opens at its first failure and lasts window_s. Once a window holds `limit` failures, every
  request from that source is refused with 429 until the window ends, before its key is looked at, except
  one bearing a key this gateway has found valid before (KeyAuthenticator.vouched): a bad client behind a
  shared address (a corporate proxy) does not lock out the tenants working behind it. A key never seen
  working here is refused from that address too; keys from other addresses are not.
- Redis holds one counter per source (INCR, PEXPIRE on the first), namespaced by the fleet's database like
  the rate limits, so N gateways together allow `limit` failures, not N times it.
- While Redis does not answer, each gateway counts alone at ceil(limit / fallback_share) (the number of
  public gateways), as the rate limits do, and tries Redis again after retry_s.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.public.pause import Pause

log = logging.getLogger(__name__)

# KEYS[1]: the source's counter. ARGV: window (ms). Returns {failures in the window, ms left in it}.
_FAIL = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
return {n, ttl}
"""

# KEYS[1]: the source's counter. Returns {failures in the window, ms left in it} (0, 0 when none).
_PEEK = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then ttl = 0 end
return {n, ttl}
"""


def failure_prefix(database_url: str) -> str:
    """The key prefix of one fleet's auth-failure counters."""
    return "lorafleet:authfail:" + hashlib.sha256(database_url.encode()).hexdigest()[:16] + ":"


class LocalWindows:
    """source -> (failures, window end): the same fixed windows, in this process only. Pure state."""

    def __init__(self, window_s: float, max_sources: int = 100_000) -> None:
        self.window_s = window_s
        self.max_sources = max_sources
        self._windows: dict[str, tuple[int, float]] = {}

    def peek(self, source: str, now: float) -> tuple[int, float]:
        """(failures, seconds left) of the source's open window; (0, 0) when it has none."""
        count, ends = self._windows.get(source, (0, 0.0))
        if ends <= now:
            self._windows.pop(source, None)
            return 0, 0.0
        return count, ends - now

    def fail(self, source: str, now: float) -> tuple[int, float]:
        count, left = self.peek(source, now)
        if count == 0:
            if len(self._windows) >= self.max_sources:
                self._windows.clear()  # bounded memory under a flood of addresses
            left = self.window_s
        self._windows[source] = (count + 1, now + left)
        return count + 1, left


class AuthFailureLimiter:
    """blocked_for(source) before authenticating, failed(source) after a failed one."""

    def __init__(
        self,
        redis: Redis | None,
        prefix: str,
        limit: int,
        window_s: float,
        fallback_share: int = 1,
        retry_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.limit = limit
        self.window_s = window_s
        self.local_limit = max(1, math.ceil(limit / max(1, fallback_share)))
        self.retry_s = retry_s
        self.clock = clock
        self.local = LocalWindows(window_s)
        self.redis_pause = Pause(retry_s, clock)
        if redis is not None:
            self._fail = redis.register_script(_FAIL)
            self._peek = redis.register_script(_PEEK)

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def _in_fallback(self) -> bool:
        return self.redis is None or self.redis_pause.active()

    def _failed_redis(self, exc: Exception) -> None:
        if self.redis_pause.start():
            log.warning(
                "Redis unreachable (%s): counting auth failures locally at %d per source, retrying in %.1fs",
                exc,
                self.local_limit,
                self.retry_s,
            )

    async def _shared(self, script_name: str, source: str) -> tuple[int, float] | None:
        """(failures, seconds left) from Redis; None when Redis did not answer."""
        if self._in_fallback():
            return None
        script = self._fail if script_name == "fail" else self._peek
        try:
            count, ttl_ms = await script(keys=[self.prefix + source], args=[int(self.window_s * 1000)])
        except (RedisError, OSError) as exc:
            self._failed_redis(exc)
            return None
        return int(count), int(ttl_ms) / 1000

    async def blocked_for(self, source: str) -> float:
        """Seconds until this source may try again; 0 when it may now."""
        if not self.enabled:
            return 0.0
        shared = await self._shared("peek", source)
        if shared is not None:
            count, left = shared
            return left if count >= self.limit else 0.0
        count, left = self.local.peek(source, self.clock())
        return left if count >= self.local_limit else 0.0

    async def failed(self, source: str) -> None:
        """Count one failed authentication from source."""
        if not self.enabled:
            return
        if await self._shared("fail", source) is None:
            self.local.fail(source, self.clock())
