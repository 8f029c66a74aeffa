"""response_format on the replica with SmolLM2: JSON answers that validate, the schema limits as 400s naming
response_format before any GPU work, and the compiled grammar reused for the same schema."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import jsonschema
import pytest

from replica.config import ReplicaSettings
from replica.runtime import Replica, build_replica
from replica.server import create_app
from schemas.response_format import SchemaLimits

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
URL = "/internal/replicas/r1/generate"
ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["name", "count", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
async def replica(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Replica]:
    settings = ReplicaSettings(
        replica_id="r1",
        service_token=TOKEN,
        model_dir=smollm2_dir,
        device="cpu",
        max_num_seqs=4,
        max_model_len=512,
        lora_slots={8: 1},
        registry_url=None,
        control_enabled=False,
        cache_dir=tmp_path_factory.mktemp("cache"),
        structured_max_schema_bytes=1024,
        structured_max_schema_depth=6,
    )
    rep = build_replica(settings)
    await rep.start()
    yield rep
    await rep.stop()


@pytest.fixture
async def client(replica: Replica) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(replica))
    async with httpx.AsyncClient(transport=transport, base_url="http://replica") as c:
        yield c


def _body(response_format: dict, **changes: object) -> dict:
    ask = "Describe a fruit in JSON."
    return (
        {"messages": [{"role": "user", "content": ask}], "temperature": 0, "max_tokens": 96}
        | {"response_format": response_format}
        | changes
    )


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "item", "schema": schema, "strict": True}}


async def _answer(client: httpx.AsyncClient, body: dict) -> tuple[str, str]:
    """(text, finish_reason) of one generate call."""
    resp = await client.post(URL, json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    events = [json.loads(line) for line in resp.text.splitlines() if line]
    text = "".join(e["text"] for e in events if e["type"] in ("token", "done"))
    return text, events[-1]["finish_reason"]


async def test_a_json_schema_answer_validates_and_ends_with_the_json(client: httpx.AsyncClient) -> None:
    text, reason = await _answer(client, _body(_schema_format(ITEM)))
    jsonschema.validate(json.loads(text), ITEM)
    assert reason == "stop"


async def test_a_json_object_answer_is_an_object(client: httpx.AsyncClient) -> None:
    text, _ = await _answer(client, _body({"type": "json_object"}, max_tokens=200, temperature=0.8, seed=5))
    assert isinstance(json.loads(text), dict)


async def test_the_same_schema_compiles_once(client: httpx.AsyncClient, replica: Replica) -> None:
    assert replica.grammars is not None
    schema = ITEM | {"description": "cache probe"}
    misses = replica.grammars.cache.misses
    await _answer(client, _body(_schema_format(schema), max_tokens=4))
    hits = replica.grammars.cache.hits
    await _answer(client, _body(_schema_format(dict(reversed(list(schema.items())))), max_tokens=4))
    assert (replica.grammars.cache.misses, replica.grammars.cache.hits) == (misses + 1, hits + 1)
    scraped = (await client.get("/metrics")).text
    assert f'lorafleet_replica_grammar_cache_total{{result="hit"}} {hits + 1}.0' in scraped


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "description": "x" * 2000},
        {"type": "array", "items": [[[[[[{}]]]]]]},
        {"type": "no-such-type"},
        {"$ref": "#/$defs/missing"},
    ],
    ids=["too-large", "too-deep", "invalid", "dangling-ref"],
)
async def test_a_schema_over_a_limit_or_invalid_is_400_naming_response_format(
    client: httpx.AsyncClient, replica: Replica, schema: dict
) -> None:
    running = len(replica.running)
    resp = await client.post(URL, json=_body(_schema_format(schema)), headers=AUTH)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "response_format" and error["type"] == "invalid_request_error"
    assert len(replica.running) == running  # refused before it was queued


async def test_a_compile_over_the_time_limit_is_400_naming_response_format(
    client: httpx.AsyncClient, replica: Replica
) -> None:
    assert replica.grammars is not None
    limits = replica.grammars.limits
    replica.grammars.limits = SchemaLimits(limits.max_bytes, limits.max_depth, compile_timeout_s=1e-9)
    try:
        resp = await client.post(URL, json=_body(_schema_format({"enum": ["never", "seen"]})), headers=AUTH)
    finally:
        replica.grammars.limits = limits
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "response_format"
    assert "did not compile within" in resp.json()["error"]["message"]


async def test_each_of_n_choices_follows_the_schema_with_its_own_grammar(client: httpx.AsyncClient) -> None:
    body = _body(_schema_format(ITEM), n=3, temperature=1.0, seed=11)
    resp = await client.post(URL, json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    texts: dict[int, str] = {}
    for line in resp.text.splitlines():
        event = json.loads(line)
        if event["type"] in ("token", "done"):
            texts[event.get("index", 0)] = texts.get(event.get("index", 0), "") + event["text"]
    assert sorted(texts) == [0, 1, 2]
    for text in texts.values():
        jsonschema.validate(json.loads(text), ITEM)
