"""Liveness, readiness (live replicas known) and Prometheus metrics for the public gateway."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request, response: Response) -> dict[str, object]:
    live = request.app.state.online.view.live()
    if not live:
        response.status_code = 503
    return {"status": "ready" if live else "no_replicas", "replicas": sorted(r.replica_id for r in live)}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(
        generate_latest(request.app.state.online.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
