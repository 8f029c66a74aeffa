"""The replica's HTTP service: streaming generate, adapter load/unload, state and drain, behind a service
token; GET /ready (no token) says whether it may be routed to."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from lorafleet.private_openapi import CLOSED_DOCS, serve_private_openapi
from replica.arrival import StampArrival
from replica.control.drain import Drain
from replica.control.placements import PlacementsTable
from replica.errors import ReplicaError
from replica.lifespans import LIFESPANS, serving_mode
from replica.routes import generate, internal, probes
from replica.routes.deps import authorized, service_authorized
from replica.runtime import Replica
from schemas.api import ErrorBody, ErrorDetail
from schemas.openai_params import request_error

__all__ = ["authorized", "create_app", "service_authorized"]

log = logging.getLogger(__name__)

ROUTERS = (probes.router, internal.router, generate.router)


def create_app(replica: Replica, on_drained: Callable[[], None] | None = None) -> FastAPI:
    """Build the FastAPI app around an assembled Replica (the engine thread starts with the app).

    With a control plane (Kafka control loop and adapter cache) the replica warms before it turns ready;
    without one it is ready at once. on_drained runs when a drain has finished (it stops the server)."""
    settings = replica.settings
    mode = serving_mode(settings)
    table = PlacementsTable(settings.platform, settings.replica_id) if mode == "controlled" else None
    drain = Drain(replica, table, on_drained or (lambda: log.info("drained; the process may stop now")))
    app = FastAPI(
        title="lorafleet replica", lifespan=LIFESPANS[mode], exception_handlers=ERROR_HANDLERS, **CLOSED_DOCS
    )
    serve_private_openapi(app, service_authorized)
    app.state.replica = replica
    app.state.drain = drain
    app.add_middleware(StampArrival)
    for router in ROUTERS:
        app.include_router(router)
    return app


async def replica_error(request: Request, exc: ReplicaError) -> JSONResponse:
    return JSONResponse(exc.to_body().model_dump(), status_code=exc.status, headers=exc.headers())


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    error = request_error(exc.errors(), from_request=True)  # the gateway's answer to the same body
    return JSONResponse(ErrorBody(error=error).model_dump(), status_code=400)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = "not_found" if exc.status_code == 404 else "http_error"
    err = ErrorDetail(message=str(exc.detail), type="invalid_request_error", code=code)
    return JSONResponse(ErrorBody(error=err).model_dump(), status_code=exc.status_code)


ERROR_HANDLERS: dict[int | type[Exception], Callable[[Request, Any], Coroutine[Any, Any, Response]]] = {
    ReplicaError: replica_error,
    RequestValidationError: validation_error,
    StarletteHTTPException: http_error,
}
