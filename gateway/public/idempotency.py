"""Idempotency-Key on POST /v1/chat/completions and /v1/completions: one run per key, its answer
replayed to retries.

Contract (docs/api.md, "Idempotent retries"):
- The key is the `Idempotency-Key` header: 1 to 255 printable ASCII characters, else 400
  `invalid_idempotency_key`. It is scoped to the tenant; the store keeps its sha256, never the key.
- The first request with a key claims it and runs. A retry with the same key and the same body (the
  sha256 of the parsed request, so JSON spacing and key order do not matter) gets the stored answer once
  the first has completed, with `Idempotent-Replayed: true`, without running or being billed again; while
  the first still runs it gets 409 `idempotency_in_progress`; with another body 422
  `idempotency_key_reused`.
- Only a 200 is stored, for ttl_s (24 h). A request that fails gives its key back, so a retry runs anew.
  A claim whose gateway died is given back after lock_s.
- Streaming requests take no key (400 `idempotency_not_supported_for_stream`): replay is for JSON answers.
- The store is Redis, shared by every public gateway (the rate limits' client), or this process's memory
  when the rate limits are local. While Redis does not answer a request with a key gets 503
  `idempotency_unavailable` with Retry-After: without the store, at most once cannot be promised.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
KEY_RE = re.compile(r"[\x20-\x7e]{1,255}")


class IdempotencyStoreDown(Exception):
    """The shared store did not answer."""


@dataclass(frozen=True)
class Claim:
    """What claiming a key found: "claimed" (run it), "running", "conflict" (another body) or "done"."""

    outcome: str
    body: bytes = b""
    headers: dict[str, str] | None = None


def valid_key(value: str) -> bool:
    return KEY_RE.fullmatch(value) is not None and value.strip() != ""


def fingerprint(request: bytes) -> str:
    return hashlib.sha256(request).hexdigest()


def store_key(prefix: str, tenant_id: str, key: str) -> str:
    return prefix + tenant_id + ":" + hashlib.sha256(key.encode()).hexdigest()


def idempotency_prefix(database_url: str) -> str:
    """One fleet's namespace (its tenants are one database's rows)."""
    return "lorafleet:idempotency:" + hashlib.sha256(database_url.encode()).hexdigest()[:16] + ":"


# KEYS[1]: the entry. ARGV: fingerprint, lock ms. Returns {outcome, body, headers json}.
_CLAIM = """
local h = redis.call('HMGET', KEYS[1], 'state', 'fp', 'body', 'headers')
if not h[1] then
  redis.call('HSET', KEYS[1], 'state', 'running', 'fp', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'claimed', '', ''}
end
if h[2] ~= ARGV[1] then return {'conflict', '', ''} end
if h[1] == 'running' then return {'running', '', ''} end
return {'done', h[3], h[4]}
"""

# KEYS[1]: the entry. ARGV: fingerprint, body, headers json, ttl ms. Only a running claim of this body.
_COMPLETE = """
local h = redis.call('HMGET', KEYS[1], 'state', 'fp')
if h[1] ~= 'running' or h[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'body', ARGV[2], 'headers', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""

# KEYS[1]: the entry. ARGV: fingerprint. Gives back a running claim of this body.
_RELEASE = """
local h = redis.call('HMGET', KEYS[1], 'state', 'fp')
if h[1] == 'running' and h[2] == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end
return 0
"""


class IdempotencyStore:
    """claim, then complete (a 200) or release (anything else); in Redis, or in memory without it."""

    def __init__(
        self,
        redis: Redis | None,
        prefix: str,
        ttl_s: float = 86_400.0,
        lock_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.ttl_ms = int(ttl_s * 1000)
        self.lock_ms = int(lock_s * 1000)
        self.clock = clock
        # entry -> (state, fingerprint, body, headers, expires): the store when there is no Redis
        self._memory: dict[str, tuple[str, str, bytes, dict[str, str], float]] = {}
        if redis is not None:
            self._claim = redis.register_script(_CLAIM)
            self._complete = redis.register_script(_COMPLETE)
            self._release = redis.register_script(_RELEASE)

    async def claim(self, entry: str, fp: str) -> Claim:
        if self.redis is None:
            return self._claim_memory(entry, fp)
        try:
            outcome, body, headers = await self._claim(keys=[entry], args=[fp, self.lock_ms])
        except (RedisError, OSError) as exc:
            raise IdempotencyStoreDown(str(exc)) from exc
        outcome = outcome.decode() if isinstance(outcome, bytes) else str(outcome)
        if outcome != "done":
            return Claim(outcome)
        body = body if isinstance(body, bytes) else str(body).encode()
        return Claim("done", body, json.loads(headers))

    async def complete(self, entry: str, fp: str, body: bytes, headers: dict[str, str]) -> None:
        if self.redis is None:
            found = self._memory.get(entry)
            if found is not None and found[0] == "running" and found[1] == fp:
                self._memory[entry] = ("done", fp, body, headers, self.clock() + self.ttl_ms / 1000)
            return
        try:
            await self._complete(keys=[entry], args=[fp, body, json.dumps(headers), self.ttl_ms])
        except (RedisError, OSError):
            await self.release(entry, fp)  # not stored: a retry runs again rather than waiting on the lock

    async def release(self, entry: str, fp: str) -> None:
        if self.redis is None:
            found = self._memory.get(entry)
            if found is not None and found[0] == "running" and found[1] == fp:
                del self._memory[entry]
            return
        try:
            await self._release(keys=[entry], args=[fp])
        except (RedisError, OSError):
            pass  # the claim lapses after lock_s

    def _claim_memory(self, entry: str, fp: str) -> Claim:
        now = self.clock()
        found = self._memory.get(entry)
        if found is not None and found[4] <= now:
            del self._memory[entry]
            found = None
        if found is None:
            if len(self._memory) >= 100_000:
                self._memory = {k: v for k, v in self._memory.items() if v[4] > now}
            self._memory[entry] = ("running", fp, b"", {}, now + self.lock_ms / 1000)
            return Claim("claimed")
        state, stored_fp, body, headers, _ = found
        if stored_fp != fp:
            return Claim("conflict")
        if state == "running":
            return Claim("running")
        return Claim("done", body, headers)
