"""The SSE bytes of one streamed completion, chat or legacy text, without a pydantic model per token.

Per request, each kind of chunk (the first content chunk, a content chunk, the finish chunk) is dumped once
by the endpoint's chunk model (schemas.openai.ChatCompletionChunk; schemas.openai_completions
.CompletionChunk for TextChunkEncoder) around a placeholder string; a token's chunk is that dump's bytes
with the placeholder replaced by the token's JSON string. json.encoder.encode_basestring escapes exactly as
pydantic does (UTF-8 left as is; quote, backslash and control characters escaped the same way), so every
chunk is byte for byte the model's own JSON. Frames are `data: <json>` lines ended by a blank line, with
CRLF line ends (what sse-starlette wrote for the same events).
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring
from typing import Any

from pydantic import BaseModel

from gateway.errors import GatewayError
from schemas.openai import ChatCompletionChunk, ChunkChoice, Delta, FinishReason, Usage
from schemas.openai_completions import CompletionChunk, CompletionChunkChoice

END = b"\r\n\r\n"
DONE = b"data: [DONE]" + END
_HOLE = "\x00lorafleet-token\x00"  # no id, alias or model name holds a NUL
_HOLE_JSON = encode_basestring(_HOLE)


def frame(data: str) -> bytes:
    """One SSE message with this data line."""
    return b"data: " + data.encode() + END


def error_frame(exc: GatewayError) -> bytes:
    """The `event: error` message a failed stream ends with (OpenAI's error object as data)."""
    return b"event: error\r\ndata: " + json.dumps(exc.body()).encode() + END


class ChunkEncoder:
    """The framed chunks of one chat completion (id, created and model fixed for the request)."""

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        self.completion_id = completion_id
        self.created = created
        self.model = model
        self._first = self._split(self._content_choice(_HOLE, True))
        self._next = self._split(self._content_choice(_HOLE, False))

    def _chunk(self, choices: list[Any], usage: Usage | None) -> BaseModel:
        return ChatCompletionChunk(
            id=self.completion_id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def _content_choice(self, text: str, first: bool) -> BaseModel:
        return ChunkChoice(delta=Delta(role="assistant", content=text) if first else Delta(content=text))

    def _finish_choice(self, reason: FinishReason) -> BaseModel:
        return ChunkChoice(delta=Delta(), finish_reason=reason)

    def _dump(self, choices: list[Any], usage: Usage | None = None) -> str:
        return self._chunk(choices, usage).model_dump_json(exclude_none=False)

    def _split(self, choice: BaseModel) -> tuple[bytes, bytes]:
        head, hole, tail = self._dump([choice]).partition(_HOLE_JSON)
        assert hole, "the placeholder appears in the dump exactly once"
        return b"data: " + head.encode(), tail.encode() + END

    def content(self, text: str, first: bool) -> bytes:
        """A content chunk; the first of a chat completion also carries the assistant role."""
        head, tail = self._first if first else self._next
        return head + encode_basestring(text).encode() + tail

    def finish(self, reason: FinishReason) -> bytes:
        return frame(self._dump([self._finish_choice(reason)]))

    def usage(self, usage: Usage) -> bytes:
        """The usage chunk (no choices) sent last when the caller asked for it."""
        return frame(self._dump([], usage))


class TextChunkEncoder(ChunkEncoder):
    """The framed chunks of one legacy text completion: `text` in each choice, no role."""

    def _chunk(self, choices: list[Any], usage: Usage | None) -> BaseModel:
        return CompletionChunk(
            id=self.completion_id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def _content_choice(self, text: str, first: bool) -> CompletionChunkChoice:
        return CompletionChunkChoice(text=text)

    def _finish_choice(self, reason: FinishReason) -> CompletionChunkChoice:
        return CompletionChunkChoice(text="", finish_reason=reason)
