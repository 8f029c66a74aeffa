"""The web console's routes. The page and its files go on both listeners, each showing its own views: the
public listener's page is the tenants' chat playground (it calls /v1 with the tenant's key); the internal
listener's is the operator console, whose views call the admin API under /console/api behind the service
token, and which links the latest HTML reports. The admin API and the reports are never on the public
listener.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from gateway.console import overview
from gateway.console.fleet_snapshot import fleet_snapshot
from gateway.console.live import ConsoleLive
from gateway.console.reports import REPORT_PATHS, report_links
from gateway.deps import AliasPath, Pool, require_service_token
from gateway.errors import NotFound
from gateway.registry import aliases
from gateway.sse_response import SseResponse
from schemas.api import AliasUpdate, AliasView
from schemas.console import FleetSnapshot, RegistrySnapshot, ReportList

STATIC = files("gateway.console") / "static"
STATIC_FILES = {"console.js": "text/javascript", "console.css": "text/css"}
# The views each listener's page shows (index.html's sections; console.js hides the others).
TENANT_VIEWS = ("chat",)
OPERATOR_VIEWS = ("fleet", "registry", "reports")
VIEWS_MARK = "<body>"


def page_router(views: tuple[str, ...]) -> APIRouter:
    """/console (the page, showing these views) and /console/static/{name}."""
    page = APIRouter(prefix="/console", include_in_schema=False)
    html = (STATIC / "index.html").read_text().replace(VIEWS_MARK, f'<body data-views="{" ".join(views)}">')

    @page.get("")
    async def console_root() -> RedirectResponse:
        return RedirectResponse("/console/", status_code=308)

    @page.get("/")
    async def console_page() -> HTMLResponse:
        return HTMLResponse(html, headers={"Cache-Control": "no-cache"})

    @page.get("/static/{name}")
    async def console_file(name: str) -> FileResponse:
        if name not in STATIC_FILES:
            raise NotFound("not_found", f"no console file {name[:100]!r}")
        return FileResponse(
            str(STATIC / name), media_type=STATIC_FILES[name], headers={"Cache-Control": "no-cache"}
        )

    return page


reports = APIRouter(prefix="/console", include_in_schema=False)
admin = APIRouter(prefix="/console/api", dependencies=[Depends(require_service_token)])


@reports.get("/reports/{index}/")
async def report_page(index: int) -> FileResponse:
    """One report page, by its place in REPORT_PATHS (so only those files are ever served)."""
    return FileResponse(str(_report(index)), media_type="text/html", headers={"Cache-Control": "no-cache"})


@reports.get("/reports/{index}/{name}")
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


@reports.get("/api/reports", response_model=ReportList)
async def list_reports() -> ReportList:
    """The reports that exist now (they hold no tenant data, so the page lists them without the token)."""
    return ReportList(data=report_links(REPORT_PATHS, "/console/reports"))


def _snapshot(live: ConsoleLive) -> FleetSnapshot:
    view, feed = live.view, live.feed
    states = view.states()
    hits = {s.replica_id: view.gpu_hit_rate(s.replica_id) for s, _ in states}
    return fleet_snapshot(states, feed.windows(), feed.alerts(), view.stale_s, view.replica_id_prefix, hits)


@admin.get("/fleet", response_model=FleetSnapshot)
async def fleet(request: Request) -> FleetSnapshot:
    return _snapshot(request.app.state.console)


@admin.get("/fleet/stream")
async def fleet_stream(request: Request) -> SseResponse:
    """The fleet snapshot as `event: fleet` once a second, until the client goes away."""
    live: ConsoleLive = request.app.state.console

    async def frames() -> AsyncGenerator[bytes, None]:
        while True:
            data = _snapshot(live).model_dump_json()
            yield f"event: fleet\ndata: {data}\n\n".encode()
            await asyncio.sleep(1.0)

    return SseResponse(frames(), ping_s=0)


@admin.get("/registry", response_model=RegistrySnapshot)
async def registry(pool: Pool) -> RegistrySnapshot:
    return await overview.snapshot(pool)


@admin.put("/aliases/{alias:path}", response_model=AliasView)
async def move_alias(alias: AliasPath, body: AliasUpdate, pool: Pool) -> AliasView:
    """Deploy or roll back, as PUT /internal/aliases does (the public gateways drop their cached entry on
    its aliases.changed)."""
    view, _changed = await aliases.set_alias(pool, alias, body.adapter_id, body.canary)
    return view
