"""The internal app in-process (httpx.ASGITransport, lifespan run by hand) against a test database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from pydantic import SecretStr

from gateway.config import GatewayConfig, GatewaySettings
from gateway.registry.app import build_internal_app
from lorafleet.config import PlatformSettings

TOKEN = "test-service-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def gateway_config(platform: PlatformSettings, base_hash: str, model_dir: Path, **overrides) -> GatewayConfig:
    settings = GatewaySettings(
        service_token=SecretStr(TOKEN),
        served_base_model_hash=base_hash,
        served_model_dir=model_dir,
        **overrides,
    )
    return GatewayConfig(platform, settings)


@asynccontextmanager
async def internal_client(config: GatewayConfig) -> AsyncIterator[httpx.AsyncClient]:
    app = build_internal_app(config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://internal", headers=AUTH) as client:
            yield client
