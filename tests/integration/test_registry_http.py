"""The registry's HTTP door and the alias API on the real PostgreSQL, app in-process over ASGI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncpg
import pytest

from tests.gateway.adapter_files import TINY_BASE_HASH, write_base_config
from tests.gateway.registry.internal_app import gateway_config, internal_client

GOOD = {
    "adapter_id": "acme-support-v1",
    "tenant_id": "acme",
    "version": 1,
    "base_model_hash": TINY_BASE_HASH,
    "rank": 4,
    "alpha": 8.0,
    "target_modules": ["q_proj", "v_proj"],
    "weights_uri": "s3://lorafleet-adapters/adapters/acme/acme-support-v1",
    "checksum": "sha256:" + "1" * 64,
}


@pytest.fixture
async def client(services, migrated_db: str, pool: asyncpg.Pool, tmp_path: Path):
    await pool.execute("INSERT INTO tenants (tenant_id) VALUES ('acme'), ('globex')")
    platform = services.settings().model_copy(update={"database_url": migrated_db})
    config = gateway_config(platform, TINY_BASE_HASH, write_base_config(tmp_path / "base"))
    async with internal_client(config) as c:
        yield c


async def _outbox(pool: asyncpg.Pool, topic: str) -> list[dict]:
    rows = await pool.fetch("SELECT * FROM outbox WHERE aggregate_type = $1 ORDER BY seq", topic)
    return [{**dict(r), "payload": json.loads(r["payload"])} for r in rows]


async def test_registration_is_pending_with_its_event_and_idempotent(client, pool) -> None:
    first = await client.post("/internal/adapters", json=GOOD)
    assert first.status_code == 202, first.text
    assert first.json() == {"adapter_id": "acme-support-v1", "status": "pending", "created": True}
    again = await client.post("/internal/adapters", json=GOOD)
    assert again.status_code == 200 and again.json()["created"] is False
    rows = await _outbox(pool, "adapters.registered")
    assert [r["aggregate_id"] for r in rows] == ["acme-support-v1"]
    shown = (await client.get("/internal/adapters/acme-support-v1")).json()
    assert (
        shown["status"] == "pending"
        and shown["reason_code"] is None
        and shown["checksum"] == GOOD["checksum"]
    )


async def test_identical_registrations_sent_at_once_make_one_row_and_one_event(client, pool) -> None:
    resps = await asyncio.gather(*(client.post("/internal/adapters", json=GOOD) for _ in range(8)))
    assert sorted(r.status_code for r in resps) == [200] * 7 + [202], [r.text for r in resps]
    assert [r.json()["created"] for r in resps].count(True) == 1
    count = await pool.fetchval("SELECT count(*) FROM adapters WHERE adapter_id = $1", GOOD["adapter_id"])
    assert count == 1
    assert [r["aggregate_id"] for r in await _outbox(pool, "adapters.registered")] == ["acme-support-v1"]


async def test_same_id_with_different_content_is_a_conflict(client, pool) -> None:
    assert (await client.post("/internal/adapters", json=GOOD)).status_code == 202
    resp = await client.post("/internal/adapters", json={**GOOD, "checksum": "sha256:" + "2" * 64})
    assert resp.status_code == 409
    assert resp.json()["error"]["code"] == "adapter_conflict"
    assert len(await _outbox(pool, "adapters.registered")) == 1


@pytest.mark.parametrize(
    "change, code",
    [
        ({"weights_uri": "file:///etc/passwd"}, "invalid_weights_uri"),
        ({"weights_uri": "s3://127.0.0.1/adapters/x"}, "invalid_weights_uri"),
        ({"weights_uri": "s3://other-bucket/adapters/x"}, "invalid_weights_uri"),
        ({"weights_uri": "s3://lorafleet-adapters/a/../../x"}, "invalid_weights_uri"),
        ({"rank": 128}, "adapter_rank_exceeds_limit"),
        ({"base_model_hash": "sha256:" + "f" * 64}, "base_model_mismatch"),
        ({"target_modules": ["q_proj", "lm_head"]}, "unknown_target_module"),
        ({"checksum": "abc"}, "invalid_checksum"),
        ({"tenant_id": "initech"}, "unknown_tenant"),
        ({"rank": "sixteen"}, "invalid_parameter"),
        ({"adapter_id": "../etc/passwd"}, "invalid_parameter"),
        ({"extra": 1}, "unknown_parameter"),  # a field outside the contract, named
    ],
)
async def test_bad_registrations_are_refused_at_once_with_their_code(client, pool, change, code) -> None:
    resp = await client.post("/internal/adapters", json={**GOOD, **change})
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["code"] == code and set(error) == {"message", "type", "param", "code"}
    assert await pool.fetchval("SELECT count(*) FROM adapters") == 0
    assert await _outbox(pool, "adapters.registered") == []


async def test_malformed_json_is_a_4xx_never_a_500(client) -> None:
    resp = await client.post(
        "/internal/adapters", content=b'{"adapter_id": ', headers={"content-type": "application/json"}
    )
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic dGVzdA==", "test-service-token"])
async def test_internal_routes_need_the_service_token(client, header) -> None:
    headers = {"Authorization": header} if header else {}
    client.headers.pop("Authorization")
    for method, url in [
        ("POST", "/internal/adapters"),
        ("GET", "/internal/aliases"),
        ("GET", "/internal/adapters"),
        ("GET", "/internal/adapters/acme-support-v1"),
        ("GET", "/internal/aliases/acme/support:prod"),
        ("PUT", "/internal/aliases/acme/support:prod"),
    ]:
        resp = await client.request(method, url, json=GOOD, headers=headers)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_service_token"


async def test_unknown_adapter_is_404(client) -> None:
    resp = await client.get("/internal/adapters/nope")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "adapter_not_found"


async def _ready(client, pool, adapter_id: str, tenant: str = "acme", version: int = 1) -> None:
    body = {**GOOD, "adapter_id": adapter_id, "tenant_id": tenant, "version": version}
    body["weights_uri"] = f"s3://lorafleet-adapters/adapters/{tenant}/{adapter_id}"
    assert (await client.post("/internal/adapters", json=body)).status_code == 202
    await pool.execute("UPDATE adapters SET status = 'ready' WHERE adapter_id = $1", adapter_id)


async def test_alias_deploy_and_rollback_keep_previous_and_count_revisions(client, pool) -> None:
    await _ready(client, pool, "acme-support-v1")
    await _ready(client, pool, "acme-support-v2", version=2)
    url = "/internal/aliases/acme/support:prod"
    first = (await client.put(url, json={"adapter_id": "acme-support-v1"})).json()
    assert (first["adapter_id"], first["previous_adapter_id"], first["revision"]) == (
        "acme-support-v1",
        None,
        1,
    )
    deploy = (await client.put(url, json={"adapter_id": "acme-support-v2"})).json()
    assert (deploy["adapter_id"], deploy["previous_adapter_id"], deploy["revision"]) == (
        "acme-support-v2",
        "acme-support-v1",
        2,
    )
    rollback = (await client.put(url, json={"adapter_id": deploy["previous_adapter_id"]})).json()
    assert (rollback["adapter_id"], rollback["previous_adapter_id"], rollback["revision"]) == (
        "acme-support-v1",
        "acme-support-v2",
        3,
    )
    same = await client.put(url, json={"adapter_id": "acme-support-v1"})
    assert same.status_code == 200 and same.json()["revision"] == 3
    events = await _outbox(pool, "aliases.changed")
    assert [(e["payload"]["adapter_id"], e["payload"]["revision"]) for e in events] == [
        ("acme-support-v1", 1),
        ("acme-support-v2", 2),
        ("acme-support-v1", 3),
    ]
    assert all(e["aggregate_id"] == "acme/support:prod" for e in events)
    listed = (await client.get("/internal/aliases", params={"tenant_id": "acme"})).json()["data"]
    assert [a["alias"] for a in listed] == ["acme/support:prod"]
    assert (await client.get(f"{url}")).json()["adapter_id"] == "acme-support-v1"


async def test_alias_refuses_other_tenants_and_unready_versions(client, pool) -> None:
    await _ready(client, pool, "globex-bot-v1", tenant="globex")
    cross = await client.put("/internal/aliases/acme/bot:prod", json={"adapter_id": "globex-bot-v1"})
    assert cross.status_code == 422 and cross.json()["error"]["code"] == "alias_tenant_mismatch"
    assert (await client.post("/internal/adapters", json=GOOD)).status_code == 202
    pending = await client.put("/internal/aliases/acme/support:prod", json={"adapter_id": GOOD["adapter_id"]})
    assert pending.status_code == 409 and pending.json()["error"]["code"] == "adapter_not_ready"
    missing = await client.put("/internal/aliases/acme/support:prod", json={"adapter_id": "acme-nope"})
    assert missing.status_code == 404
    bad = await client.put("/internal/aliases/not an alias", json={"adapter_id": "globex-bot-v1"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_alias"
    assert await pool.fetchval("SELECT count(*) FROM aliases") == 0
    assert await _outbox(pool, "aliases.changed") == []


async def test_alias_canary_is_validated_announced_and_ended_by_a_plain_put(client, pool) -> None:
    await _ready(client, pool, "acme-support-v1")
    await _ready(client, pool, "acme-support-v2", version=2)
    await _ready(client, pool, "globex-bot-v1", tenant="globex")
    url = "/internal/aliases/acme/support:prod"
    assert (await client.put(url, json={"adapter_id": "acme-support-v1"})).status_code == 200
    for canary, status, code in [
        ({"adapter_id": "acme-support-v2", "weight": 1.5}, 422, "invalid_parameter"),
        ({"adapter_id": "acme-support-v2", "weight": 0}, 422, "invalid_parameter"),
        ({"adapter_id": "acme-support-v2"}, 422, "invalid_parameter"),
        ({"adapter_id": "acme-support-v1", "weight": 0.1}, 422, "canary_is_current"),
        ({"adapter_id": "globex-bot-v1", "weight": 0.1}, 422, "alias_tenant_mismatch"),
        ({"adapter_id": "acme-nope", "weight": 0.1}, 404, "adapter_not_found"),
    ]:
        bad = await client.put(url, json={"adapter_id": "acme-support-v1", "canary": canary})
        assert bad.status_code == status, (canary, bad.text)
        error = bad.json()["error"]
        assert error["param"].startswith("canary") and error["code"] == code, error
    split = await client.put(url, json={"adapter_id": "acme-support-v1", "canary": CANARY})
    assert split.status_code == 200, split.text
    view = split.json()
    assert (view["canary_adapter_id"], view["canary_weight"], view["revision"]) == (
        "acme-support-v2",
        0.25,
        2,
    )
    ended = (await client.put(url, json={"adapter_id": "acme-support-v1"})).json()
    assert (ended["canary_adapter_id"], ended["previous_adapter_id"], ended["revision"]) == (None, None, 3)
    events = [e["payload"] for e in await _outbox(pool, "aliases.changed")]
    assert [(e["canary_adapter_id"], e["canary_weight"], e["revision"]) for e in events] == [
        (None, None, 1),
        ("acme-support-v2", 0.25, 2),
        (None, None, 3),
    ]


CANARY = {"adapter_id": "acme-support-v2", "weight": 0.25}
