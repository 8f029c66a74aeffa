"""The Idempotency-Key steps around one chat completion (rules in gateway.public.idempotency)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Response

from gateway.errors import BadRequest, Conflict, ServiceUnavailable, Unprocessable
from gateway.public.idempotency import (
    REPLAYED_HEADER,
    IdempotencyStore,
    IdempotencyStoreDown,
    fingerprint,
    store_key,
    valid_key,
)

# The answer headers a replay repeats (x-request-id is each request's own).
_KEPT = ("content-type", "x-adapter-id", "x-adapter-tier", "x-lorafleet-merged")


@dataclass(frozen=True)
class Claimed:
    """This request holds the key: complete it with the answer, or release it."""

    store: IdempotencyStore
    entry: str
    fp: str

    async def complete(self, response: Response) -> None:
        headers = {k: v for k, v in response.headers.items() if k.lower() in _KEPT}
        await self.store.complete(self.entry, self.fp, bytes(response.body), headers)

    async def release(self) -> None:
        await self.store.release(self.entry, self.fp)


async def begin(
    store: IdempotencyStore, tenant_id: str, key: str, request: bytes, stream: bool
) -> Claimed | Response:
    """Claim the key for this request (its canonical bytes), or answer it: the stored replay, or the error
    the rules give."""
    if not valid_key(key):
        raise BadRequest(
            "invalid_idempotency_key",
            "Idempotency-Key must be 1 to 255 printable ASCII characters",
            "Idempotency-Key",
        )
    if stream:
        raise BadRequest(
            "idempotency_not_supported_for_stream",
            "Idempotency-Key is for non-streaming requests: a stream is not stored or replayed",
            "stream",
        )
    entry, fp = store_key(store.prefix, tenant_id, key), fingerprint(request)
    try:
        found = await store.claim(entry, fp)
    except IdempotencyStoreDown as exc:
        raise ServiceUnavailable(
            "idempotency_unavailable",
            "the idempotency store is unavailable; retry shortly",
            None,
            {"Retry-After": "2"},
        ) from exc
    if found.outcome == "claimed":
        return Claimed(store, entry, fp)
    if found.outcome == "running":
        raise Conflict(
            "idempotency_in_progress",
            "a request with this Idempotency-Key is still running; retry once it has finished",
            "Idempotency-Key",
            {"Retry-After": "1"},
        )
    if found.outcome == "conflict":
        raise Unprocessable(
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different request body",
            "Idempotency-Key",
        )
    headers = {**(found.headers or {}), REPLAYED_HEADER: "true"}
    return Response(found.body, status_code=200, headers=headers)
