"""Every route of every app has an auth dependency of the right scope, or is on the explicit list of open
routes (probes, /metrics without tenant data, the OpenAPI documents, the console's static page and reports).
A route added without one fails here: the list is walked from the real apps, not written by hand.

Scopes: `tenant` is an API key (gateway.deps.public_caller); `service` is the service token
(gateway.deps.require_service_token on the gateways, replica.server.service_authorized / authorized on the
replica) or, on the one registry route replicas call, the registry-read token beside it
(gateway.deps.require_registry_reader). A tenant key never opens a service route: the checks compare against
different secrets. The public listener serves /v1, the tenants' console page, its probes and a tenant-free
/metrics, nothing else: the operator console and its admin API are on the internal listener."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from gateway.config import GatewayConfig
from gateway.deps import public_caller, require_registry_reader, require_service_token
from gateway.public.app import build_public_app
from gateway.public.metrics import GatewayMetrics
from gateway.public.tenant_metrics import build_tenant_metrics_app
from gateway.registry.app import build_internal_app
from replica.config import ReplicaSettings
from replica.server import authorized, create_app, service_authorized

TENANT: set[Callable[..., Any]] = {public_caller}
CONSOLE_PAGE = {("GET", "/console"), ("GET", "/console/"), ("GET", "/console/static/{name}")}
SERVICE: set[Callable[..., Any]] = {
    require_service_token,
    require_registry_reader,
    service_authorized,
    authorized,
}

OPEN = {
    "public": {
        *(("GET", p) for p in ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")),
        ("GET", "/health"),
        ("GET", "/ready"),
        ("GET", "/metrics"),  # no tenant id (tests/integration/test_gateway_trust.py)
        *CONSOLE_PAGE,
    },
    # the operator console's page and the report links: no secret and no tenant data in either
    "internal": {
        *CONSOLE_PAGE,
        ("GET", "/console/reports/{index}/"),
        ("GET", "/console/reports/{index}/{name}"),
        ("GET", "/console/api/reports"),
    },
    "tenant-metrics": set(),
    "replica": {("GET", "/health"), ("GET", "/ready"), ("GET", "/metrics")},
}
TENANT_ROUTES = {
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model:path}"),
}
DOCS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for dep in dependant.dependencies:
        if dep.call is not None:
            yield dep.call
        yield from _calls(dep)


def _walk(routes: list[Any], prefix: str, extra: set[Callable[..., Any]]) -> Iterator[tuple[str, str, set]]:
    for route in routes:
        if isinstance(route, APIRoute):
            calls = set(_calls(route.dependant)) | extra
            for method in sorted(route.methods):
                yield method, prefix + route.path, calls
        elif hasattr(route, "original_router"):  # an included router (FastAPI >= 0.16x keeps it whole)
            context = route.include_context
            deps = {d.dependency for d in getattr(context, "dependencies", ()) if d.dependency is not None}
            yield from _walk(route.original_router.routes, prefix + (context.prefix or ""), extra | deps)
        else:
            assert getattr(route, "path", None) in DOCS, f"a route outside FastAPI's APIRoute: {route}"
            yield "GET", prefix + route.path, extra  # FastAPI's own document and pages: no dependency


def _routes(app: FastAPI) -> Iterator[tuple[str, str, set[Callable[..., Any]]]]:
    yield from _walk(list(app.routes), "", set())


def _apps() -> dict[str, FastAPI]:
    config = GatewayConfig.from_env()
    replica = SimpleNamespace(settings=ReplicaSettings(replica_id="r0", control_enabled=False), gpu=None)
    return {
        "public": build_public_app(config),
        "internal": build_internal_app(config),
        "tenant-metrics": build_tenant_metrics_app(GatewayMetrics(), "a-service-token"),
        "replica": create_app(replica),  # type: ignore[arg-type]
    }


def _violations(name: str, app: FastAPI) -> list[str]:
    out, seen = [], set()
    for method, path, calls in _routes(app):
        seen.add((method, path))
        route = f"{name}: {method} {path}"
        if (method, path) in OPEN[name]:
            if calls & (TENANT | SERVICE):
                out.append(f"{route} is listed open but checks a credential")
        elif (method, path) in TENANT_ROUTES:
            if not calls & TENANT or calls & SERVICE:
                out.append(f"{route} must take a tenant API key")
        elif not calls & SERVICE:
            out.append(f"{route} has no service-token dependency")
        elif calls & TENANT:
            out.append(f"{route} is a service route that also takes API keys")
    out += [f"{name}: listed open, but the app has no {m} {p}" for m, p in sorted(OPEN[name] - seen)]
    return out


@pytest.mark.parametrize("name", sorted(OPEN))
def test_every_route_is_open_by_name_or_has_its_scope_of_auth(name: str) -> None:
    assert _violations(name, _apps()[name]) == []


def test_a_route_added_without_a_dependency_is_caught() -> None:
    app = _apps()["internal"]
    router = APIRouter(prefix="/internal")

    @router.post("/pause")
    async def pause() -> None:  # the vLLM-style unauthenticated ops route
        return None

    app.include_router(router)
    assert _violations("internal", app) == ["internal: POST /internal/pause has no service-token dependency"]


def test_the_console_admin_api_is_on_the_internal_listener_behind_the_service_token() -> None:
    internal = {(m, p): calls for m, p, calls in _routes(_apps()["internal"])}
    admin = [key for key in internal if key[1].startswith("/console/api/") and key not in OPEN["internal"]]
    assert ("GET", "/console/api/fleet") in admin and ("PUT", "/console/api/aliases/{alias:path}") in admin
    assert all(require_service_token in internal[key] for key in admin)
    others = [p for (_, p) in internal if p not in DOCS and not p.startswith("/console")]
    assert others and all(p.startswith("/internal/") for p in others)


def test_the_public_listener_serves_v1_the_tenant_page_and_probes_only() -> None:
    served = {(m, p) for m, p, _ in _routes(_apps()["public"])}
    probes = {("GET", "/health"), ("GET", "/ready"), ("GET", "/metrics")}
    docs = {("GET", p) for p in DOCS}
    assert served == TENANT_ROUTES | CONSOLE_PAGE | probes | docs


def test_the_registry_read_token_opens_one_adapter_record_and_nothing_else() -> None:
    reader = [(m, p) for m, p, calls in _routes(_apps()["internal"]) if require_registry_reader in calls]
    assert reader == [("GET", "/internal/adapters/{adapter_id}")]


def test_only_the_public_app_serves_its_api_document_open() -> None:
    apps = _apps()
    for name in ("internal", "replica"):
        docs = {(m, p): calls for m, p, calls in _routes(apps[name]) if p in DOCS}
        assert list(docs) == [("GET", "/openapi.json")], (name, docs)
        assert docs["GET", "/openapi.json"] & SERVICE, f"{name}: its document must take the service token"
        assert apps[name].openapi()["paths"], name
