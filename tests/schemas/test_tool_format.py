"""The text form of tool calls: rendering for templates without tools, and reading calls back, streamed."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from schemas.openai_tools import CallRecord, FunctionSpec
from schemas.tool_format import (
    CLOSE,
    OPEN,
    ParsedCall,
    Piece,
    ToolStream,
    call_schema,
    parse_call,
    plain_messages,
)

WEATHER = FunctionSpec(
    name="get_weather",
    description="The weather in a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
TIME = FunctionSpec(name="get_time")
NAMES = frozenset({"get_weather", "get_time"})


def _joined(pieces: list[Piece]) -> list[Piece]:
    """Adjacent content pieces joined: how a client sees the stream."""
    out: list[Piece] = []
    for p in pieces:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif p != "":
            out.append(p)
    return out


def _stream(text: str, cuts: list[int], whole: bool = False) -> list[Piece]:
    stream, pieces, start = ToolStream(NAMES, whole), [], 0
    for cut in [*cuts, len(text)]:
        pieces += stream.feed(text[start:cut])
        start = cut
    return _joined(pieces + stream.close())


ANSWER = (
    'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    '<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call> <tool_ca'
)


def test_calls_and_content_are_the_same_however_the_text_is_cut() -> None:
    expected = [
        "Let me check. ",
        ParsedCall("get_weather", '{"city": "Oslo"}'),
        ParsedCall("get_time", "{}"),
        " <tool_ca",  # an unfinished tag at the end is content
    ]
    assert _stream(ANSWER, []) == expected
    rng = random.Random(3)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(ANSWER)), rng.randint(1, 30)))
        assert _stream(ANSWER, cuts) == expected
    assert _stream(ANSWER, list(range(1, len(ANSWER)))) == expected


def test_text_that_might_begin_a_tag_is_held_back_until_it_cannot() -> None:
    stream = ToolStream(NAMES)
    assert stream.feed("a <tool") == ["a "]
    assert stream.feed("s are") == ["<tools are"]


@pytest.mark.parametrize(
    "block",
    [
        '{"name": "rm_rf", "arguments": {}}',  # not one of the tools
        '{"name": "get_time", "arguments": [1]}',  # arguments not an object
        "not json",
    ],
)
def test_a_block_that_is_not_a_call_stays_content(block: str) -> None:
    text = f"x{OPEN}{block}{CLOSE}y"
    assert _stream(text, [3, 9]) == [text]


def test_a_whole_answer_is_one_call_or_its_text() -> None:
    call = '{"name": "get_weather", "arguments": {"city": "Lima", "unit": "c"}}'
    assert _stream(call, [5, 20], whole=True) == [ParsedCall("get_weather", '{"city": "Lima", "unit": "c"}')]
    assert _stream(call[:30], [5], whole=True) == [call[:30]]  # cut short (max_tokens): text, not a call


def test_parse_call_takes_arguments_as_text_or_under_parameters() -> None:
    assert parse_call('{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}', NAMES) == ParsedCall(
        "get_time", '{"tz": "UTC"}'
    )
    assert parse_call('{"name": "get_time", "parameters": {"tz": 1}}', NAMES) == ParsedCall(
        "get_time", '{"tz": 1}'
    )
    assert parse_call('{"name": "get_time"}', NAMES) == ParsedCall("get_time", "{}")


def test_call_schema_accepts_exactly_calls_of_the_chosen_functions() -> None:
    one = call_schema([WEATHER, TIME], "get_weather")
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Rome"}}, one)
    for bad in (
        {"name": "get_time", "arguments": {}},
        {"name": "get_weather", "arguments": {}},
        {"name": "get_weather", "arguments": {"city": "Rome"}, "extra": 1},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, one)
    either = call_schema([WEATHER, TIME])
    jsonschema.validate({"name": "get_time", "arguments": {}}, either)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_time", "arguments": {"x": 1}}, either)


def test_plain_messages_show_the_tools_and_write_earlier_calls() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [CallRecord(id="call_1", name="get_weather", arguments='{"city": "Oslo"}')],
        },
        {"role": "tool", "content": '{"temp": 3}'},
    ]
    out = plain_messages(messages, [WEATHER], "get_weather")
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool"]
    assert (
        out[0]["content"].startswith("Be brief.\n\n")
        and "You must call the function get_weather." in out[0]["content"]
    )
    listed = out[0]["content"].split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(listed)["function"]["name"] == "get_weather"
    assert out[2]["content"] == f'{OPEN}\n{{"name": "get_weather", "arguments": {{"city": "Oslo"}}}}\n{CLOSE}'
    assert plain_messages(messages[1:2], [], False) == messages[1:2]
