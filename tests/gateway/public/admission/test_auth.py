"""Which keys a locked-out address may still present: only keys this gateway has found valid, looked up as
usual, so a key revoked since fails; a guess is never vouched for."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import Unauthorized
from gateway.public.admission import auth as auth_module
from gateway.public.admission.auth import KeyAuthenticator
from gateway.tenants import key_hash


class Keys:
    """fetchrow over live key hashes -> tenant."""

    def __init__(self, live: dict[str, str]) -> None:
        self.live = {key_hash(k): t for k, t in live.items()}
        self.reads = 0

    async def fetch(self, sql: str, digests: list[str], timeout: float) -> list[dict[str, Any]]:
        self.reads += 1
        return [row for d in digests if (row := self._row(d)) is not None]

    async def fetchrow(self, sql: str, digest: str) -> dict[str, Any] | None:
        self.reads += 1
        return self._row(digest)

    def _row(self, digest: str) -> dict[str, Any] | None:
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


async def test_keys_in_use_are_read_again_together_and_a_revocation_applies_at_the_next_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """refresh_known keeps every cached valid key fresh in one statement, so that a key in use never waits on
    a read on a request's path; a key revoked since is refused from that read on, within the TTL."""
    now = [1000.0]
    monkeypatch.setattr(auth_module.time, "monotonic", lambda: now[0])
    keys = Keys({f"sk-{i}": f"t{i}" for i in range(50)})
    auth = KeyAuthenticator(keys, cache_ttl_s=5.0)  # type: ignore[arg-type]
    for i in range(50):
        await auth.authenticate(f"Bearer sk-{i}")
    with pytest.raises(Unauthorized):
        await auth.authenticate("Bearer sk-guess")  # a miss: cached, never read again in bulk
    assert keys.reads == 51
    for _ in range(4):  # a bulk read every 2.5 s, half the TTL: the entries never lapse
        now[0] += 2.5
        assert await auth.refresh_known(timeout_s=1.0) == 50
        for i in range(50):
            assert (await auth.authenticate(f"Bearer sk-{i}")).tenant_id == f"t{i}"
    assert keys.reads == 51 + 4
    del keys.live[key_hash("sk-7")]  # revoked
    await auth.refresh_known(timeout_s=1.0)
    with pytest.raises(Unauthorized):
        await auth.authenticate("Bearer sk-7")
    assert (await auth.authenticate("Bearer sk-8")).tenant_id == "t8"
