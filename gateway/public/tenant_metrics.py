"""The public gateway's second listener: per-tenant metrics, behind the service token.

Tenants reach the public port, so its /metrics carries no tenant id. The per-tenant series (bounded, see
gateway.public.metrics) are served here instead, on an address operators choose (loopback by default), to
callers presenting the service token as a bearer token, like /internal on the internal API.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.deps import require_service_token
from gateway.errors import install_error_handlers
from gateway.public.metrics import GatewayMetrics

router = APIRouter(dependencies=[Depends(require_service_token)])


@router.get("/metrics")
async def tenant_metrics(request: Request) -> Response:
    metrics: GatewayMetrics = request.app.state.metrics
    return Response(generate_latest(metrics.tenant_registry), media_type=CONTENT_TYPE_LATEST)


def build_tenant_metrics_app(metrics: GatewayMetrics, service_token: str) -> FastAPI:
    app = FastAPI(title="lorafleet gateway tenant metrics", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.metrics = metrics
    app.state.service_token_digest = hashlib.sha256(service_token.encode()).digest()
    install_error_handlers(app)
    app.include_router(router)
    return app


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server inside another one's event loop: the outer server owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_tenant_metrics(
    app: FastAPI, host: str, port: int, options: dict[str, Any] | None = None
) -> tuple[asyncio.Task[None], uvicorn.Server]:
    """Bind host:port now (a taken port fails the gateway's start) and serve app on it in a task."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", **(options or {}))
    server = _EmbeddedServer(config)
    return asyncio.create_task(server.serve(sockets=[sock]), name="tenant-metrics"), server
