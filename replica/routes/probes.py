"""The open routes (no token): liveness, readiness for the router and the probe, and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from replica.errors import ReplicaNotReadyError
from replica.routes.deps import ServingReplica

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready")
async def ready(replica: ServingReplica) -> JSONResponse:
    # no token: the Kubernetes readiness probe; ready means the router may send requests here
    life = replica.lifecycle
    if life.status == "ready":
        return JSONResponse({"status": "ready"})
    progress = f" ({life.warm_adapters}/{life.owned_adapters} owned adapters warm)"
    err = ReplicaNotReadyError(f"replica is {life.status}" + (progress if life.status == "warming" else ""))
    return JSONResponse(err.to_body().model_dump(), status_code=err.status)


@router.get("/metrics")
async def metrics(replica: ServingReplica) -> Response:
    # no token: Prometheus scrapes it like vLLM's; it shows load and adapter ids, never prompts
    return Response(generate_latest(replica.metrics.registry), media_type=CONTENT_TYPE_LATEST)
