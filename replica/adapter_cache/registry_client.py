"""Ask the registry (the gateway's internal API) what a ready adapter version is and where its bytes live."""

from __future__ import annotations

import httpx

from replica.adapter_cache.errors import (
    AdapterCacheError,
    AdapterNotRegisteredError,
    RegistryUnavailableError,
)
from replica.adapter_cache.record import AdapterRecord, digest_of


class RegistryClient:
    """GET /internal/adapters/{adapter_id} with the service token; only `ready` versions are accepted."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client  # base_url and Authorization set by whoever builds it

    @classmethod
    def connect(cls, base_url: str, service_token: str, timeout_s: float = 10.0) -> RegistryClient:
        headers = {"Authorization": f"Bearer {service_token}"}
        return cls(httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s))

    async def get(self, adapter_id: str) -> AdapterRecord:
        try:
            resp = await self.client.get(f"/internal/adapters/{adapter_id}")
        except httpx.HTTPError as exc:
            raise RegistryUnavailableError(f"registry unreachable: {type(exc).__name__}") from exc
        if resp.status_code == 404:
            raise AdapterNotRegisteredError(f"adapter {adapter_id!r} is not registered", "adapter_id")
        if resp.status_code >= 500:
            raise RegistryUnavailableError(f"registry answered {resp.status_code} for adapter {adapter_id!r}")
        if resp.status_code != 200:
            raise AdapterCacheError(f"registry answered {resp.status_code} for adapter {adapter_id!r}")
        body = resp.json()
        if body.get("status") != "ready":
            raise AdapterNotRegisteredError(
                f"adapter {adapter_id!r} is {body.get('status')!r}, not ready", "adapter_id"
            )
        try:
            return AdapterRecord(
                adapter_id=body["adapter_id"],
                weights_uri=body["weights_uri"],
                digest=digest_of(body["checksum"]),
                base_model_hash=body["base_model_hash"],
                target_modules=tuple(body["target_modules"]),
                size_bytes=body.get("size_bytes"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AdapterCacheError(f"registry answer for {adapter_id!r} is malformed: {exc}") from exc

    async def close(self) -> None:
        await self.client.aclose()
