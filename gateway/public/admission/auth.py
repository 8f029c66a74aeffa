"""API-key authentication for the public API: bearer key -> tenant, with a short cache.

The secret is hashed (sha256) before anything else; the stored hash is compared in constant time. Misses
are cached too, briefly, so a flood of bad keys does not reach PostgreSQL for each try. A revoked key stops
working within cache_ttl_s. While the store is unavailable an expired entry keeps answering (a known key
keeps working, a known bad key keeps failing); a key never seen gets StoreUnavailable, a 503.

It also remembers, for vouched_ttl_s, the digests of keys it has found valid: a source address locked out
for failed authentications (auth_failures.py) may still present one of those, and it is looked up as
usual (a key revoked since fails), so a bad client behind a shared address locks out only keys this
gateway has not seen work. A guess is never among them unless it is a valid key, which is as hard to guess
as any key, and a guess is never looked up.
"""

from __future__ import annotations

import hmac
import time

import asyncpg

from gateway.errors import StoreUnavailable, Unauthorized
from gateway.public.store_guard import StoreGuard
from gateway.tenants import Caller, find_caller, find_callers, key_hash

INVALID_KEY = "Incorrect API key provided. You can find your API key in your lorafleet tenant settings."


class KeyAuthenticator:
    """Authenticate `Authorization: Bearer <key>` headers against api_keys."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        cache_ttl_s: float = 5.0,
        max_entries: int = 10_000,
        guard: StoreGuard | None = None,
        vouched_ttl_s: float = 86_400.0,
    ) -> None:
        self.pool = pool
        self.guard = guard or StoreGuard(deadline_s=2.0, pause_s=1.0)
        self.cache_ttl_s = cache_ttl_s
        self.max_entries = max_entries
        self.vouched_ttl_s = vouched_ttl_s
        self._cache: dict[str, tuple[float, Caller | None]] = {}
        self._vouched: dict[str, float] = {}  # digest of a key found valid -> until when, oldest first

    def vouched(self, authorization: str | None) -> bool:
        """Whether this header's key was found valid here within vouched_ttl_s (it may be revoked since)."""
        digest = _digest(authorization)
        until = self._vouched.get(digest) if digest is not None else None
        return until is not None and until > time.monotonic()

    async def authenticate(self, authorization: str | None) -> Caller:
        digest = _digest(authorization)
        if digest is None:
            raise Unauthorized("invalid_api_key", INVALID_KEY)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            caller = cached[1]
        else:
            try:
                caller = await self.guard.read(lambda: self._lookup(digest))
            except StoreUnavailable:
                if cached is None:
                    raise
                caller = cached[1]  # the store is down: the last answer stands until it is back
            else:
                if len(self._cache) >= self.max_entries:
                    self._cache.clear()
                self._cache[digest] = (now + self.cache_ttl_s, caller)
        if caller is None:
            self._vouched.pop(digest, None)
            raise Unauthorized("invalid_api_key", INVALID_KEY)
        self._vouch(digest, now)
        return caller

    def _vouch(self, digest: str, now: float) -> None:
        self._vouched.pop(digest, None)
        self._vouched[digest] = now + self.vouched_ttl_s  # newest last
        while len(self._vouched) > self.max_entries:
            del self._vouched[next(iter(self._vouched))]

    async def refresh_known(self, timeout_s: float) -> int:
        """Read every cached valid key again in one statement, so that a key in use never expires on a
        request's path; a key revoked since is refused from then on. How many were read."""
        digests = [d for d, (_, caller) in self._cache.items() if caller is not None]
        if not digests:
            return 0
        found = await find_callers(self.pool, digests, timeout_s)
        expires = time.monotonic() + self.cache_ttl_s
        for digest in digests:
            if digest in self._cache:  # not cleared while the statement ran
                self._cache[digest] = (expires, found.get(digest))
        return len(digests)

    async def _lookup(self, digest: str) -> Caller | None:
        found = await find_caller(self.pool, digest)
        if found is None:
            return None
        stored, caller = found
        return caller if hmac.compare_digest(stored, digest) else None


def _digest(authorization: str | None) -> str | None:
    """The key's hash from `Authorization: Bearer <key>`; None for any other header, or none."""
    scheme, _, secret = (authorization or "").partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret or len(secret) > 256:
        return None
    return key_hash(secret)
