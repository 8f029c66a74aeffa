"""response_format end to end: the official openai client, the public gateway and one real SmolLM2 replica
(so concurrent requests share its batch), with the real PostgreSQL and Kafka."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import httpx
import jsonschema
import openai
import pytest

from harness.stacks.gateway import GatewayStack, gateway_stack, random_adapters
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FRUIT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "color": {"enum": ["red", "yellow", "green", "orange"]},
        "grams": {"type": "integer", "minimum": 1, "maximum": 999},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "color", "grams", "tags"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe one fruit as JSON."}]


@pytest.fixture(scope="module")
async def stack(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GatewayStack]:
    root, base_hash = await random_adapters(tmp_path_factory.mktemp("adapters"))
    replica = f"so{uuid.uuid4().hex[:6]}-a"
    async with gateway_stack(
        services.settings(), root, base_hash, tmp_path_factory.mktemp("gw"), replica_ids=(replica,)
    ) as s:
        await wait_until(lambda: _live(s, replica), "the replica to become live", 60)
        yield s


async def _live(stack: GatewayStack, replica: str) -> bool:
    """The gateway's own view (GET /ready) lists the replica as live."""
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{stack.url}/ready")).json()["replicas"] == [replica]


def _client(stack: GatewayStack, tenant: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys[tenant], max_retries=0)


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "fruit", "schema": schema, "strict": True}}


async def test_a_json_schema_answer_parses_and_validates(stack: GatewayStack) -> None:
    done = await _client(stack).chat.completions.create(
        model="acme/support:prod",
        messages=ASK,
        temperature=0,
        max_completion_tokens=120,
        response_format=_schema_format(FRUIT),
    )
    choice = done.choices[0]
    jsonschema.validate(json.loads(choice.message.content or ""), FRUIT)
    assert choice.finish_reason == "stop"


async def test_a_streamed_json_object_answer_parses(stack: GatewayStack) -> None:
    chunks = await _client(stack).chat.completions.create(
        model="acme/support:prod",
        messages=ASK,
        temperature=0,
        max_completion_tokens=300,
        response_format={"type": "json_object"},
        stream=True,
    )
    text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    assert text.startswith("{"), text
    assert isinstance(json.loads(text), dict), text


async def test_plain_rows_beside_a_json_row_answer_as_they_do_alone(stack: GatewayStack) -> None:
    plain = [("acme", "acme/support:prod", "Name three rivers."), ("globex", "globex/sales:prod", "Say hi.")]

    async def answer(tenant: str, alias: str, text: str) -> str:
        done = await _client(stack, tenant).chat.completions.create(
            model=alias, messages=[{"role": "user", "content": text}], temperature=0, max_completion_tokens=24
        )
        return done.choices[0].message.content or ""

    alone = [await answer(*row) for row in plain]
    await asyncio.sleep(1.0)  # globex's rate limit is two requests a second
    json_row = _client(stack).chat.completions.create(
        model="acme/support:prod",
        messages=ASK,
        temperature=0,
        max_completion_tokens=120,
        response_format=_schema_format(FRUIT),
    )
    together = await asyncio.gather(json_row, *(answer(*row) for row in plain))
    jsonschema.validate(json.loads(together[0].choices[0].message.content or ""), FRUIT)
    assert list(together[1:]) == alone


async def test_a_schema_over_a_limit_is_a_bad_request_naming_response_format(stack: GatewayStack) -> None:
    deep: dict = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    for schema in (deep, {"type": "no-such-type"}):
        with pytest.raises(openai.BadRequestError) as err:
            await _client(stack).chat.completions.create(
                model="acme/support:prod",
                messages=ASK,
                max_completion_tokens=8,
                response_format=_schema_format(schema),
            )
        assert err.value.param == "response_format"
