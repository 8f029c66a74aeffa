"""GET /v1/models and /v1/models/{model}: the caller's own aliases, as OpenAI model objects. Each call is one
request of the tenant's requests-per-second limit (429 past it), since each may read the database."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.deps import PublicCaller
from gateway.errors import NotFound
from gateway.public.admission.refusals import refuse_if_limited
from gateway.public.endpoint import MODEL_NOT_FOUND
from schemas.openai import ModelCard, ModelList

router = APIRouter()


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request, caller: PublicCaller) -> ModelList:
    online = request.app.state.online
    refuse_if_limited(await online.charge_request(caller), caller)  # each lookup is one request
    rows = await online.aliases.list_aliases(caller.tenant_id)
    base = request.app.state.base_model_name
    return ModelList(
        data=[ModelCard(id=a, created=int(ts), owned_by=caller.tenant_id, parent=base) for a, ts in rows]
    )


@router.get("/v1/models/{model:path}", response_model=ModelCard)
async def get_model(model: str, request: Request, caller: PublicCaller) -> ModelCard:
    online = request.app.state.online
    refuse_if_limited(await online.charge_request(caller), caller)
    for alias, ts in await online.aliases.list_aliases(caller.tenant_id):
        if alias == model:
            return ModelCard(
                id=alias, created=int(ts), owned_by=caller.tenant_id, parent=request.app.state.base_model_name
            )
    raise NotFound("model_not_found", MODEL_NOT_FOUND, "model")
