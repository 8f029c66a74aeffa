"""Registry and alias errors as domain types, each with its HTTP status and machine code; rendered in one
place as OpenAI's error body {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from schemas.api import ErrorBody, ErrorDetail
from schemas.openai_params import request_error

log = logging.getLogger(__name__)

# What a PostgreSQL outage raises through a time-bounded pool: a refused or reset connection and a timeout
# (TimeoutError is an OSError), a lost connection, a server shutting down, restarting or cancelling a
# statement, a connection closed under the caller, or asyncpg's protocol state broken by a lost connection
# ("cannot switch to state ...; another operation is in progress").
STORE_DOWN: tuple[type[Exception], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)
STORE_RETRY_AFTER_S = 2


class GatewayError(Exception):
    """Base: subclasses fix status and type; code names the exact failure for machines."""

    status = 400
    type = "invalid_request_error"

    def __init__(
        self, code: str, message: str, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers

    def body(self) -> dict[str, Any]:
        detail = ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorBody(error=detail).model_dump()


class InvalidRegistration(GatewayError):
    """A registration field the registry refuses; the same codes are the validator's reason codes."""

    status = 422


class NotFound(GatewayError):
    status = 404


class Conflict(GatewayError):
    status = 409


class Unprocessable(GatewayError):
    """A well-formed request the API cannot take as it is (an Idempotency-Key reused with another body)."""

    status = 422


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "server_error"


class InternalError(GatewayError):
    """A failure the gateway has no domain error for: a bug, answered in the same shape."""

    status = 500
    type = "server_error"


class StoreUnavailable(ServiceUnavailable):
    """PostgreSQL did not answer within its deadline and no cached answer stands in; retry shortly."""

    def __init__(self, message: str = "the registry store is unavailable; retry shortly") -> None:
        super().__init__(
            "control_plane_unavailable", message, None, {"Retry-After": str(STORE_RETRY_AFTER_S)}
        )


class GatewayTimeout(GatewayError):
    """A replica sent no first token, or went silent mid-stream, within its deadline."""

    status = 504
    type = "server_error"


class BadGateway(GatewayError):
    """A replica answered with something that is not the generate contract."""

    status = 502
    type = "server_error"


class BadRequest(GatewayError):
    """The public API's 400: a body that does not parse or a parameter we refuse."""


class PayloadTooLarge(GatewayError):
    status = 413


class RequestTimeout(GatewayError):
    """The client did not send its whole request body in time."""

    status = 408


class RateLimited(GatewayError):
    """A tenant limit; type names it (requests | tokens), as OpenAI does; Retry-After in headers."""

    status = 429

    def __init__(self, limit_type: str, message: str, headers: dict[str, str]) -> None:
        super().__init__("rate_limit_exceeded", message, None, headers)
        self.type = limit_type


class Overloaded(GatewayError):
    """A 429 that is no tenant limit of the gateway's: a replica's cap (its cold loads for the tenant).
    The replica's code and Retry-After pass through."""

    status = 429
    type = "requests"


class TooManyAuthFailures(GatewayError):
    """A source address past its limit of failed authentications; Retry-After says when it may try again."""

    status = 429
    type = "requests"

    def __init__(self, retry_after: str) -> None:
        super().__init__(
            "too_many_auth_failures",
            f"Too many failed authentications from this address; try again in {retry_after}s.",
            None,
            {"Retry-After": retry_after},
        )


def _render(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Translate domain errors, body validation errors and plain HTTP errors to the OpenAI shape."""

    async def on_gateway_error(_req: Request, exc: GatewayError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        return _render(exc.status, exc.body(), exc.headers or headers)

    async def on_validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        error = request_error(exc.errors(), from_request=True)
        return _render(422, ErrorBody(error=error).model_dump())

    async def on_http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return _render(exc.status_code, GatewayError(code or "http_error", str(exc.detail)).body())

    async def on_store_down(_req: Request, exc: Exception) -> JSONResponse:
        log.error("control plane store unavailable: %s: %s", type(exc).__name__, exc)
        down = StoreUnavailable()
        return _render(down.status, down.body(), down.headers)

    async def on_unexpected(_req: Request, exc: Exception) -> JSONResponse:
        # the server logs the traceback; the caller gets OpenAI's shape, and nothing of the exception's text
        log.error("unhandled %s while serving a request", type(exc).__name__)
        body = InternalError("internal_error", "the server had an error processing the request").body()
        return _render(500, body)

    # app.exception_handler (not add_exception_handler, typed for handlers of any Exception) takes each
    # handler with the exception type it is registered for.
    app.exception_handler(GatewayError)(on_gateway_error)
    for kind in STORE_DOWN:
        app.exception_handler(kind)(on_store_down)
    app.exception_handler(RequestValidationError)(on_validation)
    app.exception_handler(StarletteHTTPException)(on_http)
    app.exception_handler(Exception)(on_unexpected)
