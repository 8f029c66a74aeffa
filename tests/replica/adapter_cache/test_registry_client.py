"""The replica's registry client tells a registry that can't answer now (unreachable, a 5xx), which the
command loop retries, from an answer that stays the same (404, another 4xx), which it dead-letters."""

from __future__ import annotations

import httpx
import pytest

from harness.ports import free_port
from replica.adapter_cache.errors import (
    AdapterCacheError,
    AdapterNotRegisteredError,
    RegistryUnavailableError,
)
from replica.adapter_cache.registry_client import RegistryClient


async def test_a_registry_nobody_listens_for_is_unavailable() -> None:
    client = RegistryClient.connect(f"http://127.0.0.1:{free_port()}", "token", timeout_s=2.0)
    with pytest.raises(RegistryUnavailableError):
        await client.get("acme-v1")
    await client.client.aclose()


@pytest.mark.parametrize(
    ("status", "raised"),
    [
        (503, RegistryUnavailableError),
        (500, RegistryUnavailableError),
        (404, AdapterNotRegisteredError),
        (400, AdapterCacheError),
    ],
)
async def test_each_answer_maps_to_its_error(status: int, raised: type[Exception]) -> None:
    async def registry(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=registry), base_url="http://registry")
    with pytest.raises(raised) as caught:
        await RegistryClient(http).get("acme-v1")
    assert raised is RegistryUnavailableError or not isinstance(caught.value, RegistryUnavailableError)
    await http.aclose()
