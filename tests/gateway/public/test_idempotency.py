"""The idempotency store's rules on its in-memory side (the Redis side: tests/integration/test_idempotency.py)."""

from __future__ import annotations

from gateway.public.idempotency import IdempotencyStore, fingerprint, store_key, valid_key


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_one_claim_runs_duplicates_wait_other_bodies_conflict_and_done_replays() -> None:
    clock = Clock()
    store = IdempotencyStore(None, "p:", ttl_s=100, lock_s=10, clock=clock)
    entry, fp = store_key("p:", "acme", "k1"), fingerprint(b"body")
    assert (await store.claim(entry, fp)).outcome == "claimed"
    assert (await store.claim(entry, fp)).outcome == "running"
    assert (await store.claim(entry, fingerprint(b"other"))).outcome == "conflict"
    await store.complete(entry, fp, b'{"ok": 1}', {"content-type": "application/json"})
    done = await store.claim(entry, fp)
    assert (done.outcome, done.body, done.headers) == (
        "done",
        b'{"ok": 1}',
        {"content-type": "application/json"},
    )
    clock.now = 101  # past the ttl the key is new again
    assert (await store.claim(entry, fp)).outcome == "claimed"


async def test_a_released_or_lapsed_claim_lets_the_retry_run() -> None:
    clock = Clock()
    store = IdempotencyStore(None, "p:", ttl_s=100, lock_s=10, clock=clock)
    entry, fp = store_key("p:", "acme", "k1"), fingerprint(b"body")
    assert (await store.claim(entry, fp)).outcome == "claimed"
    await store.release(entry, fp)
    assert (await store.claim(entry, fp)).outcome == "claimed"
    clock.now = 11  # a gateway that died holding it: the claim lapses
    assert (await store.claim(entry, fp)).outcome == "claimed"


def test_keys_are_scoped_to_the_tenant_and_bounded() -> None:
    assert store_key("p:", "acme", "k") != store_key("p:", "globex", "k")
    assert valid_key("a" * 255) and not valid_key("a" * 256)
    assert not valid_key("") and not valid_key(" ") and not valid_key("tab\tkey") and not valid_key("é")
