"""The web console on the public listener: the page and its files under /console, the latest HTML reports
under /console/reports, and the admin API under /console/api behind the service token.

The page itself carries no secret: the chat playground calls the public API with the tenant's key, every
other view calls /console/api with the service token the operator enters.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from gateway.console import overview
from gateway.console.feed import ConsoleFeed
from gateway.console.fleet_snapshot import fleet_snapshot
from gateway.console.reports import REPORT_PATHS, report_links
from gateway.deps import AliasPath, Pool, require_service_token
from gateway.errors import NotFound
from gateway.public.online import Online
from gateway.registry import aliases
from gateway.sse_response import SseResponse
from schemas.api import AliasUpdate, AliasView
from schemas.console import FleetSnapshot, RegistrySnapshot, ReportList
from schemas.events import AliasChanged

STATIC = files("gateway") / "console_static"
STATIC_FILES = {"console.js": "text/javascript", "console.css": "text/css"}

page = APIRouter(prefix="/console", include_in_schema=False)
admin = APIRouter(prefix="/console/api", dependencies=[Depends(require_service_token)])


@page.get("")
async def console_root() -> RedirectResponse:
    return RedirectResponse("/console/", status_code=308)


@page.get("/")
async def console_page() -> HTMLResponse:
    return HTMLResponse((STATIC / "index.html").read_text(), headers={"Cache-Control": "no-cache"})


@page.get("/static/{name}")
async def console_file(name: str) -> FileResponse:
    if name not in STATIC_FILES:
        raise NotFound("not_found", f"no console file {name[:100]!r}")
    return FileResponse(
        str(STATIC / name), media_type=STATIC_FILES[name], headers={"Cache-Control": "no-cache"}
    )


@page.get("/reports/{index}/")
async def report_page(index: int) -> FileResponse:
    """One report page, by its place in REPORT_PATHS (so only those files are ever served)."""
    return FileResponse(str(_report(index)), media_type="text/html", headers={"Cache-Control": "no-cache"})


@page.get("/reports/{index}/{name}")
async def report_plot(index: int, name: str) -> FileResponse:
    """A PNG plot beside a report page (the page links its plots by file name)."""
    plot = _report(index).parent / name
    if not name.endswith(".png") or "/" in name or name.startswith(".") or not plot.is_file():
        raise NotFound("report_not_found", f"no plot {name[:100]!r} beside that report")
    return FileResponse(str(plot), media_type="image/png")


def _report(index: int) -> Path:
    path = REPORT_PATHS[index] if 0 <= index < len(REPORT_PATHS) else None
    if path is None or not path.is_file():
        raise NotFound(
            "report_not_found", "no such report; run `lorafleet loadtest` or `lorafleet report html`"
        )
    return path


@page.get("/api/reports", response_model=ReportList)
async def list_reports() -> ReportList:
    """The reports that exist now (they hold no tenant data, so the page lists them without the token)."""
    return ReportList(data=report_links(REPORT_PATHS, "/console/reports"))


def _snapshot(online: Online, feed: ConsoleFeed) -> FleetSnapshot:
    view = online.view
    states = view.states()
    hits = {s.replica_id: view.gpu_hit_rate(s.replica_id) for s, _ in states}
    return fleet_snapshot(states, feed.windows(), feed.alerts(), view.stale_s, view.replica_id_prefix, hits)


@admin.get("/fleet", response_model=FleetSnapshot)
async def fleet(request: Request) -> FleetSnapshot:
    return _snapshot(request.app.state.online, request.app.state.console_feed)


@admin.get("/fleet/stream")
async def fleet_stream(request: Request) -> SseResponse:
    """The fleet snapshot as `event: fleet` once a second, until the client goes away."""
    online: Online = request.app.state.online
    feed: ConsoleFeed = request.app.state.console_feed

    async def frames() -> AsyncGenerator[bytes, None]:
        while True:
            data = _snapshot(online, feed).model_dump_json()
            yield f"event: fleet\ndata: {data}\n\n".encode()
            await asyncio.sleep(1.0)

    return SseResponse(frames(), ping_s=0)


@admin.get("/registry", response_model=RegistrySnapshot)
async def registry(pool: Pool) -> RegistrySnapshot:
    return await overview.snapshot(pool)


@admin.put("/aliases/{alias:path}", response_model=AliasView)
async def move_alias(alias: AliasPath, body: AliasUpdate, pool: Pool, request: Request) -> AliasView:
    """Deploy or roll back, as PUT /internal/aliases does; this gateway reads the alias again at once."""
    view, changed = await aliases.set_alias(pool, alias, body.adapter_id, body.canary)
    if changed:
        request.app.state.online.aliases.apply(
            AliasChanged(**view.model_dump(include=set(AliasChanged.model_fields)))
        )
    return view
