"""The service routes beside generate: drain, adapter load and unload, and the replica's state."""

from __future__ import annotations

from fastapi import APIRouter

from replica.routes.deps import Authorized, ReplicaDrain, ServiceAuthorized, ServingReplica
from schemas.ids import AdapterId
from schemas.replica_api import (
    DrainRequest,
    DrainResponse,
    LoadRequest,
    LoadResponse,
    StateResponse,
    UnloadResponse,
)

router = APIRouter()


@router.post("/internal/drain")
async def start_drain(
    _: ServiceAuthorized, drain: ReplicaDrain, body: DrainRequest | None = None
) -> DrainResponse:
    return drain.start(body.deadline_s if body is not None else None)


@router.post("/internal/replicas/{replica_id}/adapters/{adapter_id}/load")
async def load(
    replica_id: str,
    adapter_id: AdapterId,
    _: Authorized,
    replica: ServingReplica,
    body: LoadRequest | None = None,
) -> LoadResponse:
    trained_on = body.base_model_hash if body is not None else None
    bucket, ms = await replica.load_adapter(adapter_id, trained_on)
    return LoadResponse(adapter_id=adapter_id, tier="gpu", rank_bucket=bucket, load_ms=round(ms, 3))


@router.post("/internal/replicas/{replica_id}/adapters/{adapter_id}/unload")
async def unload(
    replica_id: str, adapter_id: AdapterId, _: Authorized, replica: ServingReplica
) -> UnloadResponse:
    await replica.unload_adapter(adapter_id)
    return UnloadResponse(adapter_id=adapter_id, unloaded=True)


@router.get("/internal/replicas/{replica_id}/state")
async def state(replica_id: str, _: Authorized, replica: ServingReplica) -> StateResponse:
    return replica.state()
