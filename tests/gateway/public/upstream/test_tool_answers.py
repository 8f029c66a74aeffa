"""Tool calls read out of a replica's text: streamed as deltas the official client assembles, or whole.

The replica streams text; the gateway gives out content and calls (schemas.tool_format's form), with ids,
indexes and finish_reason tool_calls, in both response shapes and per choice.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from gateway.public.upstream.chat_response import CHAT_SHAPE, completion_response, sse_chunks
from gateway.public.upstream.tool_answer import ToolAnswer
from replica.stream_events import stream_events
from schemas.replica_api import encode_event
from schemas.tool_format import ToolStream
from tests.gateway.public.upstream.replica_lines import outputs, record, replica_bytes, upstream
from tests.gateway.public.upstream.test_choices_and_logprobs import Finished

NAMES = frozenset({"get_weather", "get_time"})
TAGGED = [
    "Sure. ",
    "<tool_",
    'call>\n{"name": "get_weather", ',
    '"arguments": {"city": "Oslo"}}\n</tool_call>',
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
]
WHOLE = ['{"name": "get_weather", ', '"arguments": {"city": ', '"Lima"}}']


def _answers(whole: bool = False, parallel: bool = True) -> Callable[[], ToolAnswer]:
    return lambda: ToolAnswer(ToolStream(NAMES, whole), parallel)


async def _streamed(
    body: bytes, tools: Callable[[], ToolAnswer], choices: int = 1
) -> tuple[list[dict], object]:
    frames = [
        f
        async for f in sse_chunks(
            record(), upstream(body, chunk=7), "m", False, Finished(), CHAT_SHAPE, choices, tools
        )
    ]
    chunks = [json.loads(f.split(b"data: ", 1)[1]) for f in frames if not f.startswith(b"data: [DONE]")]
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    return chunks, state.get_final_completion()


async def test_streamed_calls_are_deltas_the_official_client_assembles() -> None:
    chunks, final = await _streamed(replica_bytes(outputs(TAGGED, "stop")), _answers())
    message = final.choices[0].message  # type: ignore[attr-defined]
    assert message.content == "Sure. " and final.choices[0].finish_reason == "tool_calls"  # type: ignore[attr-defined]
    calls = message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {}),
    ]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
    content = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks if c["choices"])
    assert "<tool" not in content


async def test_parallel_false_keeps_the_first_call_only() -> None:
    _, final = await _streamed(replica_bytes(outputs(TAGGED, "stop")), _answers(parallel=False))
    assert [c.function.name for c in final.choices[0].message.tool_calls] == ["get_weather"]  # type: ignore[attr-defined]


async def test_a_required_call_is_the_whole_answer_and_a_cut_one_stays_text() -> None:
    resp = await completion_response(
        record(),
        upstream(replica_bytes(outputs(WHOLE, "stop"))),
        "m",
        {},
        Finished(),
        CHAT_SHAPE,
        1,
        False,
        _answers(True),
    )
    choice = json.loads(bytes(resp.body))["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Lima"}
    cut = await completion_response(
        record(),
        upstream(replica_bytes(outputs(WHOLE[:2], "length"))),
        "m",
        {},
        Finished(),
        CHAT_SHAPE,
        1,
        False,
        _answers(True),
    )
    choice = json.loads(bytes(cut.body))["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["tool_calls"] is None
    assert choice["message"]["content"] == "".join(WHOLE[:2])


async def test_each_choice_reads_its_own_calls() -> None:
    calls, plain = outputs(WHOLE, "stop"), outputs(["no call"], "stop")
    body = b"".join(
        encode_event(e) for i, o in [(0, calls), (1, plain)] for step in o for e in stream_events(step, i)
    )
    _, final = await _streamed(body, _answers(True), choices=2)
    first, second = final.choices  # type: ignore[attr-defined]
    assert first.finish_reason == "tool_calls" and first.message.tool_calls[0].function.name == "get_weather"
    assert (
        second.finish_reason == "stop"
        and second.message.content == "no call"
        and not second.message.tool_calls
    )
