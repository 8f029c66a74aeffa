"""Function tools in a chat body: what is taken, and the 400 each bad combination gets."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from schemas.openai import ChatCompletionRequest
from schemas.openai_params import request_error
from schemas.openai_tools import NamedToolChoice

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "acme/support:prod", "messages": [{"role": "user", "content": "Hi"}]} | fields


def parsed(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(body(**fields))


def test_tools_default_to_auto_and_none_without_tools() -> None:
    assert parsed(tools=[WEATHER, TIME]).tool_mode() == "auto"
    assert parsed().tool_mode() == "none" and parsed(tools=[]).tool_mode() == "none"
    assert parsed(tools=[WEATHER], tool_choice="none").tool_mode() == "none"
    named = parsed(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}})
    mode = named.tool_mode()
    assert isinstance(mode, NamedToolChoice) and mode.function.name == "get_time"


def test_a_conversation_with_calls_and_their_results_is_taken() -> None:
    req = parsed(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3}'},
            {"role": "assistant", "content": "It is 3 degrees.", "tool_calls": []},
        ],
    )
    assert req.messages[1].text() == "" and req.messages[1].tool_calls is not None
    assert req.messages[1].tool_calls[0].function.arguments == '{"city": "Oslo"}'


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools[0].function.name"),
        ({"tools": [TIME] * 129}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "rm"}}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "Hi", "tool_calls": [CALL]}]}, "messages[0]"),
        ({"messages": [{"role": "assistant", "content": None}]}, "messages[0]"),
        ({"messages": [{"role": "assistant", "tool_calls": [CALL | {"type": "custom"}]}]}, "messages[0].tool_calls[0].type"),
    ],
)  # fmt: skip
def test_bad_tools_are_refused_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parsed(**fields)
    error = request_error(exc.value.errors(include_url=False))
    assert (error.param, error.code) == (param, "invalid_parameter"), error
