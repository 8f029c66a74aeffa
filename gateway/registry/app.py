"""Build the gateway's internal FastAPI app (registry, aliases and the operator console) and serve it with
uvicorn."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway.config import GatewayConfig
from gateway.console import routes as console
from gateway.console.live import console_live
from gateway.deps import require_service_token
from gateway.errors import install_error_handlers
from gateway.openapi_doc import install_openapi
from gateway.registry import routes
from gateway.registry.registration_rules import RegistryRules
from gateway.registry.served_base import served_base_hash
from lorafleet.db.pool import create_pool
from lorafleet.private_openapi import CLOSED_DOCS, serve_private_openapi
from lorafleet.profile import refuse_dev_tokens
from schemas import principals


def build_internal_app(config: GatewayConfig, rules: RegistryRules | None = None) -> FastAPI:
    """The internal API app; the pool is opened in the lifespan, rules default to the served base's."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.rules = rules or RegistryRules.build(
            served_base_hash(config.gateway), config.gateway.max_rank, config.platform.object_store_prefixes
        )
        app.state.pool = await create_pool(config.platform, min_size=1, max_size=10)
        try:
            async with console_live(config, app.state.pool) as live:
                app.state.console = live
                yield
        finally:
            await app.state.pool.close()

    app = FastAPI(title="lorafleet internal API", lifespan=lifespan, **CLOSED_DOCS)
    app.state.service_token_digest = hashlib.sha256(
        config.gateway.service_token.get_secret_value().encode()
    ).digest()
    app.state.read_token_digest = hashlib.sha256(
        config.gateway.registry_read_token.get_secret_value().encode()
    ).digest()
    install_error_handlers(app)
    install_openapi(app)
    serve_private_openapi(app, require_service_token)
    app.include_router(routes.router)
    app.include_router(routes.reader)
    app.include_router(console.page_router(console.OPERATOR_VIEWS))
    app.include_router(console.reports)
    app.include_router(console.admin)
    return app


def serve() -> None:
    """Serve the internal API (registry and aliases) and the operator console on the internal listener."""
    import uvicorn

    config = GatewayConfig.from_env(principals.GATEWAY)
    tokens = {
        "LORAFLEET_GATEWAY_SERVICE_TOKEN": config.gateway.service_token,
        "LORAFLEET_GATEWAY_REGISTRY_READ_TOKEN": config.gateway.registry_read_token,
    }
    refuse_dev_tokens(config.platform, "gateway", tokens)
    uvicorn.run(
        build_internal_app(config),
        host=config.gateway.internal_host,
        port=config.gateway.internal_port,
        log_level="info",
        **config.platform.listener_options(),
    )
