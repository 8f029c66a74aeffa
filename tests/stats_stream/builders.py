"""Small builders for the events the stats stream consumes, with sensible defaults."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from schemas.events import ReplicaEvent, ReplicaState, RequestCompleted

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def request(
    adapter: str = "a1",
    tenant: str = "acme",
    tier: str | None = "gpu",
    ttft: float | None = 0.1,
    completion: int = 100,
    prompt: int = 10,
    total_s: float = 1.0,
    status: str = "ok",
    t: float = 1.0,
) -> RequestCompleted:
    return RequestCompleted(
        occurred_at=at(t),
        request_id="r",
        tenant_id=tenant,
        alias=f"{tenant}/support:prod",
        adapter_id=adapter,
        replica_id="rep-1",
        tier=tier,
        status=status,
        prompt_tokens=prompt,
        completion_tokens=completion,
        ttft_s=ttft,
        total_s=total_s,
    )


def replica_event(
    replica: str = "rep-1", kind: str = "evict", adapter: str = "a1", t: float = 1.0
) -> ReplicaEvent:
    return ReplicaEvent(occurred_at=at(t), replica_id=replica, kind=kind, adapter_id=adapter)


def state(
    replica: str = "rep-1",
    queue: int = 0,
    tokens: int = 0,
    status: str = "ready",
    t: float = 1.0,
    gpu_slots: int = 0,
) -> ReplicaState:
    return ReplicaState(
        occurred_at=at(t),
        replica_id=replica,
        url=f"http://{replica}",
        status=status,
        queue_depth=queue,
        tokens_in_flight=tokens,
        gpu_slots=gpu_slots,
    )
