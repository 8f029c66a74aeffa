"""Constrained decoding end to end, response_format and required tool calls: the official openai client, the
public gateway and one real SmolLM2 replica (so concurrent requests share its batch), with the real
PostgreSQL and Kafka."""

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
WEATHER_ARGS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER_ARGS},
    },
    {"type": "function", "function": {"name": "get_time", "description": "Time now in a timezone"}},
]
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


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


async def test_plain_rows_beside_a_json_row_and_a_tool_row_answer_as_they_do_alone(
    stack: GatewayStack,
) -> None:
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
    tool_row = _client(stack).chat.completions.create(
        model="acme/support:prod",
        messages=WEATHER_ASK,
        temperature=0,
        max_completion_tokens=80,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    together = await asyncio.gather(json_row, tool_row, *(answer(*row) for row in plain))
    jsonschema.validate(json.loads(together[0].choices[0].message.content or ""), FRUIT)
    calls = together[1].choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER_ARGS)
    assert list(together[2:]) == alone


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


async def test_a_named_tool_call_has_arguments_that_validate(stack: GatewayStack) -> None:
    done = await _client(stack).chat.completions.create(
        model="acme/support:prod",
        messages=WEATHER_ASK,
        max_completion_tokens=80,
        seed=3,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_ARGS)


async def test_a_required_call_streams_as_deltas_the_official_client_assembles(stack: GatewayStack) -> None:
    async with _client(stack).chat.completions.stream(
        model="acme/support:prod",
        messages=WEATHER_ASK,
        max_completion_tokens=80,
        temperature=0.7,
        seed=5,
        tools=TOOLS,
        tool_choice="required",
    ) as stream:
        final = await stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        jsonschema.validate(arguments, WEATHER_ARGS)
    else:
        assert call.function.name == "get_time" and arguments == {}


async def test_a_tool_result_goes_back_in_the_next_turn(stack: GatewayStack) -> None:
    client = _client(stack)
    first = await client.chat.completions.create(
        model="acme/support:prod",
        messages=WEATHER_ASK,
        max_completion_tokens=80,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    message = first.choices[0].message
    (call,) = message.tool_calls or []
    history = [
        *WEATHER_ASK,
        message,  # the answer's own message, appended as OpenAI's guide does
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 3, "sky": "snow"})},
    ]
    for choice in ("none", "auto"):
        done = await client.chat.completions.create(
            model="acme/support:prod",
            messages=history,
            max_completion_tokens=16,
            tools=TOOLS,
            tool_choice=choice,
        )
        answer, used = done.choices[0], done.usage
        assert used is not None and first.usage is not None
        if choice == "none":  # the tools are not shown; the call and its result are
            assert answer.finish_reason in {"stop", "length"} and answer.message.tool_calls is None
            assert answer.message.content
        else:  # the tools, the call and its result
            assert used.prompt_tokens > first.usage.prompt_tokens


async def test_a_tool_schema_over_a_limit_is_a_bad_request_naming_tools(stack: GatewayStack) -> None:
    deep: dict = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(openai.BadRequestError) as err:
        await _client(stack).chat.completions.create(
            model="acme/support:prod",
            messages=WEATHER_ASK,
            max_completion_tokens=8,
            tools=[{"type": "function", "function": {"name": "deep", "parameters": deep}}],
            tool_choice="required",
        )
    assert err.value.param == "tools"
