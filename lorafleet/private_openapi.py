"""An internal app's OpenAPI document, served only to callers holding its credential.

FastAPI serves /openapi.json, /docs and /redoc to anyone by default. An internal listener lists every
route it has (registrations, aliases, slot commands), so its document is behind the same check as those
routes, and the HTML pages (which would load their scripts from a CDN) are not served at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

OPENAPI_PATH = "/openapi.json"
CLOSED_DOCS: dict[str, Any] = {"openapi_url": None, "docs_url": None, "redoc_url": None}


def serve_private_openapi(app: FastAPI, guard: Callable[..., Any]) -> None:
    """Serve app.openapi() at /openapi.json to requests the guard dependency admits.
    The app must be built with **CLOSED_DOCS, so FastAPI adds no open copy of its own."""
    if app.openapi_url is not None:
        raise ValueError(f"{app.title}: build it with CLOSED_DOCS, or FastAPI serves {app.openapi_url} open")

    @app.get(OPENAPI_PATH, include_in_schema=False, dependencies=[Depends(guard)])
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())
