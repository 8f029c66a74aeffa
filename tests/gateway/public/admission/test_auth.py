"""Which keys a locked-out address may still present: only keys this gateway has found valid, looked up as
usual, so a key revoked since fails; a guess is never vouched for."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import Unauthorized
from gateway.public.admission.auth import KeyAuthenticator
from gateway.tenants import key_hash


class Keys:
    """fetchrow over live key hashes -> tenant."""

    def __init__(self, live: dict[str, str]) -> None:
        self.live = {key_hash(k): t for k, t in live.items()}

    async def fetchrow(self, sql: str, digest: str) -> dict[str, Any] | None:
        tenant = self.live.get(digest)
        if tenant is None:
            return None
        return {
            "key_id": "k1",
            "key_hash": digest,
            "tenant_id": tenant,
            "requests_per_s": 1,
            "tokens_per_min": 1,
        }


async def test_only_keys_found_valid_are_vouched_for_and_a_revoked_one_stops_being() -> None:
    keys = Keys({"sk-good": "acme"})
    auth = KeyAuthenticator(keys, cache_ttl_s=0.0)  # type: ignore[arg-type]
    assert not auth.vouched("Bearer sk-good")  # never seen work here
    assert (await auth.authenticate("Bearer sk-good")).tenant_id == "acme"
    assert auth.vouched("Bearer sk-good") and auth.vouched("Bearer  sk-good ")
    with pytest.raises(Unauthorized):
        await auth.authenticate("Bearer sk-guess")
    assert not auth.vouched("Bearer sk-guess") and not auth.vouched(None) and not auth.vouched("Bearer ")
    keys.live.clear()  # revoked
    with pytest.raises(Unauthorized):
        await auth.authenticate("Bearer sk-good")
    assert not auth.vouched("Bearer sk-good")


async def test_vouched_keys_expire_and_are_bounded() -> None:
    keys = Keys({f"sk-{i}": "acme" for i in range(5)})
    auth = KeyAuthenticator(keys, cache_ttl_s=0.0, max_entries=3, vouched_ttl_s=60.0)  # type: ignore[arg-type]
    for i in range(5):
        await auth.authenticate(f"Bearer sk-{i}")
    assert [auth.vouched(f"Bearer sk-{i}") for i in range(5)] == [False, False, True, True, True]
    expired = KeyAuthenticator(keys, cache_ttl_s=0.0, vouched_ttl_s=0.0)  # type: ignore[arg-type]
    await expired.authenticate("Bearer sk-0")
    assert not expired.vouched("Bearer sk-0")
