"""Least privilege, tried against the real processes and services: each credential is refused what it is not
for (docs/security.md has the table of principals, with these tests beside each row)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from harness.ports import free_port
from harness.seed import Alias, ReadyAdapter, Seed, Tenant
from harness.spec import HttpReady, ProcessSpec, StackSpec, app_args
from harness.stack import RunningStack, private_stack

pytestmark = pytest.mark.integration

SERVICE_TOKEN = "lp-service-token-of-its-own"
READ_TOKEN = "lp-registry-read-token-of-its-own"
BASE_HASH = "sha256:" + "1" * 64


@pytest.fixture(scope="module")
async def internal(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningStack]:
    """An internal gateway with its own service and registry-read tokens, over a database with one tenant,
    two ready adapters and an alias."""
    port = free_port()
    seed = Seed(
        (Tenant("acme", 10, 100_000),),
        (
            ReadyAdapter("acme-a-v1", "acme", BASE_HASH),
            ReadyAdapter("acme-a-v2", "acme", BASE_HASH, version=2),
        ),
        (Alias.of("acme/a:prod", "acme-a-v1"),),
    )
    gateway = ProcessSpec(
        "gateway",
        app_args("gateway"),
        port,
        {
            "LORAFLEET_GATEWAY_INTERNAL_PORT": str(port),
            "LORAFLEET_GATEWAY_SERVICE_TOKEN": SERVICE_TOKEN,
            "LORAFLEET_GATEWAY_REGISTRY_READ_TOKEN": READ_TOKEN,
            "LORAFLEET_GATEWAY_SERVED_BASE_MODEL_HASH": BASE_HASH,
        },
        (HttpReady(f"http://127.0.0.1:{port}/console/", 90),),
    )
    spec = StackSpec(processes=(gateway,), database=f"lp_{uuid.uuid4().hex[:10]}", seed=seed)
    work: Path = tmp_path_factory.mktemp("least-privilege")
    async with private_stack(spec, services.settings(), work) as stack:
        yield stack


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_the_replicas_registry_token_reads_an_adapter_and_nothing_else(internal: RunningStack) -> None:
    registration = {
        "adapter_id": "acme-evil-v1",
        "tenant_id": "acme",
        "version": 1,
        "base_model_hash": BASE_HASH,
        "rank": 8,
        "alpha": 16,
        "target_modules": ["q_proj"],
        "weights_uri": "s3://lorafleet-adapters/acme/evil/",
        "checksum": "sha256:" + "2" * 64,
    }
    async with httpx.AsyncClient(base_url=internal.procs["gateway"].url, headers=_bearer(READ_TOKEN)) as c:
        record = await c.get("/internal/adapters/acme-a-v1")
        assert record.status_code == 200 and record.json()["status"] == "ready"
        tried = {
            "register": await c.post("/internal/adapters", json=registration),
            "move an alias": await c.put("/internal/aliases/acme/a:prod", json={"adapter_id": "acme-a-v2"}),
            "list the registry": await c.get("/internal/adapters"),
            "list aliases": await c.get("/internal/aliases"),
            "console registry": await c.get("/console/api/registry"),
            "console alias move": await c.put(
                "/console/api/aliases/acme/a:prod", json={"adapter_id": "acme-a-v2"}
            ),
        }
    assert {what: r.status_code for what, r in tried.items()} == dict.fromkeys(tried, 401)
    assert tried["register"].json()["error"]["code"] == "invalid_service_token"
    async with httpx.AsyncClient(base_url=internal.procs["gateway"].url, headers=_bearer(SERVICE_TOKEN)) as c:
        alias = (await c.get("/internal/aliases/acme/a:prod")).json()
        assert alias["adapter_id"] == "acme-a-v1"  # nothing moved
        adapters = {a["adapter_id"] for a in (await c.get("/internal/adapters")).json()["data"]}
        assert "acme-evil-v1" not in adapters
        moved = await c.put("/internal/aliases/acme/a:prod", json={"adapter_id": "acme-a-v2"})
        assert moved.status_code == 200  # the service token can: the refusals above were the token's


async def test_the_operator_console_is_on_the_internal_listener_behind_the_service_token(
    internal: RunningStack,
) -> None:
    async with httpx.AsyncClient(base_url=internal.procs["gateway"].url) as c:
        page = await c.get("/console/")
        assert page.status_code == 200 and 'data-views="fleet registry reports"' in page.text
        assert (await c.get("/console/api/fleet")).status_code == 401
        fleet = await c.get("/console/api/fleet", headers=_bearer(SERVICE_TOKEN))
        assert fleet.status_code == 200 and "replicas" in fleet.json()
