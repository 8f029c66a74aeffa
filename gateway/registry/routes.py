"""The internal API: registry (POST/GET adapters) and aliases (PUT/GET), behind the service token; one
adapter's record also behind the registry-read token, the only route a replica calls."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Response

from gateway.deps import AliasPath, Pool, Rules, require_registry_reader, require_service_token
from gateway.errors import NotFound
from gateway.registry import adapters, aliases
from gateway.registry.registration_rules import check_fields
from schemas.api import (
    AdapterList,
    AdapterRegistration,
    AdapterStatus,
    AdapterView,
    AliasList,
    AliasUpdate,
    AliasView,
    RegistrationAccepted,
)
from schemas.ids import ADAPTER_ID_RE, TENANT_ID_RE

router = APIRouter(prefix="/internal", dependencies=[Depends(require_service_token)])
reader = APIRouter(prefix="/internal", dependencies=[Depends(require_registry_reader)])
# A tenant id filter outside the id grammar is refused (422) before it reaches the database.
TenantFilter = Query(default=None, max_length=63, pattern=TENANT_ID_RE.pattern)


@router.post("/adapters", status_code=202, response_model=RegistrationAccepted)
async def register_adapter(
    body: AdapterRegistration, pool: Pool, rules: Rules, response: Response
) -> RegistrationAccepted:
    """Check the fields at once; store the version as pending and queue its validation (202)."""
    check_fields(
        rules,
        base_model_hash=body.base_model_hash,
        rank=body.rank,
        target_modules=body.target_modules,
        weights_uri=body.weights_uri,
        checksum=body.checksum,
    )
    created, status = await adapters.register(pool, body)
    if not created:
        response.status_code = 200
    return RegistrationAccepted(adapter_id=body.adapter_id, status=status, created=created)


@router.get("/adapters", response_model=AdapterList)
async def list_adapters(
    pool: Pool,
    tenant_id: str | None = TenantFilter,
    status: AdapterStatus | None = None,
) -> AdapterList:
    return AdapterList(data=await adapters.list_adapters(pool, tenant_id, status))


@reader.get("/adapters/{adapter_id}", response_model=AdapterView)
async def get_adapter(adapter_id: str, pool: Pool) -> AdapterView:
    # an id outside the grammar names no adapter: 404 without a database read
    view = await adapters.get_adapter(pool, adapter_id) if ADAPTER_ID_RE.fullmatch(adapter_id) else None
    if view is None:
        raise NotFound("adapter_not_found", f"adapter {adapter_id[:200]!r} does not exist", "adapter_id")
    return view


@router.put("/aliases/{alias:path}", response_model=AliasView)
async def put_alias(alias: AliasPath, body: AliasUpdate, pool: Pool) -> AliasView:
    """Move the alias (deploy or rollback), optionally with a weighted canary; a PUT without a canary ends
    one. The old target is kept as previous_adapter_id."""
    view, _changed = await aliases.set_alias(pool, alias, body.adapter_id, body.canary)
    return view


@router.get("/aliases", response_model=AliasList)
async def list_aliases(pool: Pool, tenant_id: str | None = TenantFilter) -> AliasList:
    return AliasList(data=await aliases.list_aliases(pool, tenant_id))


@router.get("/aliases/{alias:path}", response_model=AliasView)
async def get_alias(alias: AliasPath, pool: Pool) -> AliasView:
    return await aliases.get_alias(pool, alias)
