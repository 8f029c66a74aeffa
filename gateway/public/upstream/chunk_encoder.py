"""The SSE bytes of one streamed completion, chat or legacy text, without a pydantic model per token.

Per request, each kind of chunk (the first content chunk, a content chunk, the finish chunk) is dumped once
by the endpoint's chunk model (schemas.openai.ChatCompletionChunk; schemas.openai_completions
.CompletionChunk for TextChunkEncoder) around a placeholder string; a token's chunk is that dump's bytes
with the placeholder replaced by the token's JSON string. json.encoder.encode_basestring escapes exactly as
pydantic does (UTF-8 left as is; quote, backslash and control characters escaped the same way), so every
chunk is byte for byte the model's own JSON. Frames are `data: <json>` lines ended by a blank line, with
CRLF line ends (what sse-starlette wrote for the same events). A chunk that carries logprobs is dumped
whole by the model; a choice's templates are made on its first chunk.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring
from typing import Any

from pydantic import BaseModel

from gateway.errors import GatewayError
from schemas.openai import (
    ChatCompletionChunk,
    ChatFinishReason,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    TokenLogprob,
    Usage,
)
from schemas.openai_completions import CompletionChunk, CompletionChunkChoice, CompletionLogprobs
from schemas.openai_tools import FunctionCallDelta, ToolCall, ToolCallDelta

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
        self._templates: dict[tuple[int, bool], tuple[bytes, bytes]] = {}  # (choice, first) -> head, tail

    def _chunk(self, choices: list[Any], usage: Usage | None) -> BaseModel:
        return ChatCompletionChunk(
            id=self.completion_id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def _content_choice(
        self, text: str, first: bool, index: int = 0, logprobs: TokenLogprob | None = None
    ) -> BaseModel:
        delta = Delta(role="assistant", content=text) if first else Delta(content=text)
        shown = ChoiceLogprobs(content=[logprobs]) if logprobs is not None else None
        return ChunkChoice(index=index, delta=delta, logprobs=shown)

    def _finish_choice(self, reason: ChatFinishReason, index: int = 0) -> BaseModel:
        return ChunkChoice(index=index, delta=Delta(), finish_reason=reason)

    def _dump(self, choices: list[Any], usage: Usage | None = None) -> str:
        return self._chunk(choices, usage).model_dump_json(exclude_none=False)

    def _split(self, choice: BaseModel) -> tuple[bytes, bytes]:
        head, hole, tail = self._dump([choice]).partition(_HOLE_JSON)
        assert hole, "the placeholder appears in the dump exactly once"
        return b"data: " + head.encode(), tail.encode() + END

    def content(self, text: str, first: bool, index: int = 0, logprobs: TokenLogprob | None = None) -> bytes:
        """A content chunk of choice index; a choice's first in a chat completion also carries the
        assistant role."""
        if logprobs is not None:
            return frame(self._dump([self._content_choice(text, first, index, logprobs)]))
        template = self._templates.get((index, first))
        if template is None:
            template = self._templates[index, first] = self._split(self._content_choice(_HOLE, first, index))
        head, tail = template
        return head + encode_basestring(text).encode() + tail

    def tool_call(self, position: int, call: ToolCall, index: int = 0) -> bytes:
        """A whole tool call (the position-th of choice index) as one delta."""
        function = FunctionCallDelta(name=call.function.name, arguments=call.function.arguments)
        delta = Delta(
            tool_calls=[ToolCallDelta(index=position, id=call.id, type="function", function=function)]
        )
        return frame(self._dump([ChunkChoice(index=index, delta=delta)]))

    def finish(self, reason: ChatFinishReason, index: int = 0) -> bytes:
        return frame(self._dump([self._finish_choice(reason, index)]))

    def usage(self, usage: Usage) -> bytes:
        """The usage chunk (no choices) sent last when the caller asked for it."""
        return frame(self._dump([], usage))


class TextChunkEncoder(ChunkEncoder):
    """The framed chunks of one legacy text completion: `text` in each choice, no role."""

    def _chunk(self, choices: list[Any], usage: Usage | None) -> BaseModel:
        return CompletionChunk(
            id=self.completion_id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        super().__init__(completion_id, created, model)
        self._offsets: dict[int, int] = {}  # choice -> characters its tokens' logprobs have covered

    def _content_choice(
        self, text: str, first: bool, index: int = 0, logprobs: TokenLogprob | None = None
    ) -> CompletionChunkChoice:
        if logprobs is None:
            return CompletionChunkChoice(text=text, index=index)
        offset = self._offsets.get(index, 0)
        self._offsets[index] = offset + len(logprobs.token)
        return CompletionChunkChoice(
            text=text, index=index, logprobs=CompletionLogprobs.of([logprobs], offset)
        )

    def _finish_choice(self, reason: ChatFinishReason, index: int = 0) -> CompletionChunkChoice:
        assert reason != "tool_calls", "a legacy completion has no tools"
        return CompletionChunkChoice(text="", index=index, finish_reason=reason)
