"""The fast SSE path writes, byte for byte, what the pydantic models and sse-starlette write for the same
events: content chunks (any text), finish chunks, the usage chunk, error events and [DONE]."""

from __future__ import annotations

import json

import pytest
from sse_starlette.event import ServerSentEvent

from gateway.errors import BadGateway, ServiceUnavailable
from gateway.public.upstream.chunk_encoder import DONE, ChunkEncoder, TextChunkEncoder, error_frame
from gateway.public.upstream.events import replica_lost
from schemas.openai import ChatCompletionChunk, ChunkChoice, Delta, Usage
from schemas.openai_completions import CompletionChunk, CompletionChunkChoice

TEXTS = [
    "Hel",
    "",
    " 世界",
    "é",
    "😀 emoji",
    'a "quoted" word',
    "back\\slash",
    "new\nline\r\ttab",
    "".join(chr(c) for c in range(0x20)),
    "\x7f\u2028\u2029\ufeff\ufffd",
    "</script>&<>'",
    "\U0010ffff",
]
MODELS = ["acme/support:prod", "tenant-1/name_with.dots:v2"]


def _model_frame(chunk: ChatCompletionChunk | CompletionChunk) -> bytes:
    """What the pydantic model and sse-starlette's framing give for one chunk."""
    return ServerSentEvent(data=chunk.model_dump_json(exclude_none=False)).encode()


def _chunk(model: str, choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id="chatcmpl-abc123", created=1764500000, model=model, choices=choices, usage=usage
    )


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("text", TEXTS)
def test_content_chunks_equal_the_models_json(model: str, text: str) -> None:
    enc = ChunkEncoder("chatcmpl-abc123", 1764500000, model)
    first = _chunk(model, [ChunkChoice(delta=Delta(role="assistant", content=text))])
    later = _chunk(model, [ChunkChoice(delta=Delta(content=text))])
    assert enc.content(text, first=True) == _model_frame(first)
    assert enc.content(text, first=False) == _model_frame(later)
    data = json.loads(enc.content(text, first=False)[len(b"data: ") : -4])
    assert data["choices"][0]["delta"]["content"] == text


@pytest.mark.parametrize("reason", ["stop", "length"])
def test_finish_chunk_equals_the_models_json(reason: str) -> None:
    enc = ChunkEncoder("chatcmpl-abc123", 1764500000, MODELS[0])
    expected = _chunk(MODELS[0], [ChunkChoice(delta=Delta(), finish_reason=reason)])  # type: ignore[arg-type]
    assert enc.finish(reason) == _model_frame(expected)  # type: ignore[arg-type]


def test_usage_chunk_equals_the_models_json() -> None:
    enc = ChunkEncoder("chatcmpl-abc123", 1764500000, MODELS[0])
    usage = Usage(prompt_tokens=31, completion_tokens=250, total_tokens=281)
    assert enc.usage(usage) == _model_frame(_chunk(MODELS[0], [], usage))


def _text_chunk(choices: list[CompletionChunkChoice], usage: Usage | None = None) -> CompletionChunk:
    return CompletionChunk(
        id="cmpl-abc123", created=1764500000, model=MODELS[1], choices=choices, usage=usage
    )


@pytest.mark.parametrize("text", TEXTS)
def test_text_completion_chunks_equal_the_models_json(text: str) -> None:
    enc = TextChunkEncoder("cmpl-abc123", 1764500000, MODELS[1])
    expected = _model_frame(_text_chunk([CompletionChunkChoice(text=text)]))
    assert enc.content(text, first=True) == enc.content(text, first=False) == expected
    data = json.loads(enc.content(text, first=True)[len(b"data: ") : -4])
    assert data["object"] == "text_completion" and data["choices"][0]["text"] == text


def test_text_completion_finish_and_usage_chunks_equal_the_models_json() -> None:
    enc = TextChunkEncoder("cmpl-abc123", 1764500000, MODELS[1])
    usage = Usage(prompt_tokens=4, completion_tokens=8, total_tokens=12)
    finish = _text_chunk([CompletionChunkChoice(text="", finish_reason="length")])
    assert enc.finish("length") == _model_frame(finish)
    assert enc.usage(usage) == _model_frame(_text_chunk([], usage))


@pytest.mark.parametrize(
    "exc",
    [
        replica_lost(),
        BadGateway("bad_replica_response", "the replica sent a malformed generate event"),
        ServiceUnavailable("generation_failed", 'failed: "RuntimeError" in step — ünïcode'),
    ],
)
def test_error_event_equals_sse_starlettes_encoding(exc: Exception) -> None:
    assert isinstance(exc, BadGateway | ServiceUnavailable)
    assert error_frame(exc) == ServerSentEvent(event="error", data=json.dumps(exc.body())).encode()


def test_done_equals_sse_starlettes_encoding() -> None:
    assert ServerSentEvent(data="[DONE]").encode() == DONE
