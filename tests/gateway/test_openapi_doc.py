"""The public OpenAPI document describes the chat and legacy completions bodies a schema-driven fuzzer
generates from: every field of OpenAI's request, lorafleet's extensions, and no room for any other field at
any level."""

from __future__ import annotations

from typing import Any

import httpx

from gateway.config import GatewayConfig
from gateway.public.app import build_public_app
from schemas.openai_params import COMPLETIONS_UNSUPPORTED, UNSUPPORTED

# CreateChatCompletionRequest's properties in OpenAI's openapi.yaml
OPENAI_CHAT_FIELDS = {
    "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "messages", "metadata", "modalities", "model", "n",
    "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_retention",
    "reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier", "stop", "store",
    "stream", "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user",
    "verbosity", "web_search_options",
}  # fmt: skip
# CreateCompletionRequest's properties in OpenAI's openapi.yaml
OPENAI_COMPLETION_FIELDS = {
    "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "model", "n",
    "presence_penalty", "prompt", "seed", "stop", "stream", "stream_options", "suffix", "temperature",
    "top_p", "user",
}  # fmt: skip
EXTENSIONS = {"cache_salt"}


async def _document() -> dict[str, Any]:
    transport = httpx.ASGITransport(app=build_public_app(GatewayConfig.from_env()))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
        resp = await c.get("/openapi.json")
    assert resp.status_code == 200
    return resp.json()


async def test_the_chat_body_has_every_openai_field_and_refuses_others_at_every_level() -> None:
    doc = await _document()
    content = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]
    body = content["application/json"]["schema"]
    components = doc["components"]["schemas"]
    chat = components[body["$ref"].rsplit("/", 1)[1]]
    assert set(chat["properties"]) == OPENAI_CHAT_FIELDS | EXTENSIONS
    assert "top_k" not in chat["properties"]  # the engine's, not OpenAI's
    for name in ("ChatCompletionRequest", "Message", "ContentPart", "StreamOptions"):
        assert components[name]["additionalProperties"] is False, name
    bias = next(s for s in chat["properties"]["logit_bias"]["anyOf"] if s["type"] == "object")
    assert bias["additionalProperties"] is False and bias["maxProperties"] == 300
    penalty = next(s for s in chat["properties"]["presence_penalty"]["anyOf"] if s["type"] == "number")
    assert (penalty["minimum"], penalty["maximum"]) == (-2.0, 2.0)


async def test_each_unsupported_field_says_what_it_accepts() -> None:
    components = (await _document())["components"]["schemas"]
    models = {
        "": "ChatCompletionRequest",
        "messages[].": "Message",
        "messages[].content[].": "ContentPart",
        "tools[].": "Tool",
    }
    for key in UNSUPPORTED:
        prefix, name = key.rsplit(".", 1) if "." in key else ("", key)
        properties = components[models[prefix + "." if prefix else ""]]["properties"]
        assert properties[name]["description"].startswith("Not supported by this server"), key


async def test_the_completions_body_has_every_openai_field_and_refuses_others() -> None:
    doc = await _document()
    content = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]
    components = doc["components"]["schemas"]
    body = components[content["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]]
    assert body["additionalProperties"] is False and body["required"] == ["model", "prompt"]
    assert set(body["properties"]) == OPENAI_COMPLETION_FIELDS | EXTENSIONS
    assert components["StreamOptions"]["additionalProperties"] is False
    for name in COMPLETIONS_UNSUPPORTED:
        assert body["properties"][name]["description"].startswith("Not supported by this server"), name
    assert "422" not in doc["paths"]["/v1/completions"]["post"]["responses"]
