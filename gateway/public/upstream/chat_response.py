"""The response over one replica stream: SSE chunks as tokens arrive, or one whole completion, in the shape
of the endpoint asked (CHAT_SHAPE: chat.completion; TEXT_SHAPE: the legacy text_completion).

Both read the stream through upstream_events.completion_events, so a token, the done lines and every
failure mean the same on both paths. A request has n choices, each with its index; their chunks
interleave as the replica sends them. Streaming sends each choice's content chunks (its first carries the
role, a token's carries its logprobs when asked), each choice's finish chunk, then the usage chunk when
asked, then `data: [DONE]`; a failure midway ends it with an `event: error` in OpenAI's error shape and no
[DONE]. The JSON path answers the failure as the error response instead. Each request is finished exactly
once: ok, error with its code, or cancelled.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from fastapi import Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from gateway.errors import GatewayError
from gateway.public.online import RequestRecord
from gateway.public.upstream.chunk_encoder import DONE, ChunkEncoder, TextChunkEncoder, error_frame
from gateway.public.upstream.events import completion_events
from gateway.public.upstream.replica_client import UpstreamStream
from gateway.public.upstream.tool_answer import ToolAnswer, chat_finish
from schemas.events import RequestStatus
from schemas.openai import (
    AssistantMessage,
    ChatCompletion,
    Choice,
    ChoiceLogprobs,
    FinishReason,
    TokenLogprob,
    Usage,
)
from schemas.openai_completions import Completion, CompletionChoice, CompletionLogprobs
from schemas.openai_tools import ToolCall
from schemas.replica_api import DoneEvent

Finish = Callable[[RequestRecord, RequestStatus, str | None], Awaitable[None]]  # Online.finish


@dataclass
class ChoiceResult:
    """One choice as the stream built it: its text, its tokens' logprobs (None: not asked) and its end."""

    index: int
    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason = "stop"
    tool_calls: list[ToolCall] | None = None  # read from the text of a chat with tools (parts: the rest)

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _chat_completion(rec: RequestRecord, model: str, choices: list[ChoiceResult], usage: Usage) -> BaseModel:
    return ChatCompletion(
        id=rec.completion_id,
        created=rec.created,
        model=model,
        choices=[
            Choice(
                index=c.index,
                message=AssistantMessage(
                    content=(c.text or None) if c.tool_calls else c.text, tool_calls=c.tool_calls
                ),
                logprobs=ChoiceLogprobs(content=c.logprobs) if c.logprobs is not None else None,
                finish_reason=chat_finish(c.finish_reason, c.tool_calls),
            )
            for c in choices
        ],
        usage=usage,
    )


def _text_completion(rec: RequestRecord, model: str, choices: list[ChoiceResult], usage: Usage) -> BaseModel:
    return Completion(
        id=rec.completion_id,
        created=rec.created,
        model=model,
        choices=[
            CompletionChoice(
                index=c.index,
                text=c.text,
                logprobs=CompletionLogprobs.of(c.logprobs) if c.logprobs is not None else None,
                finish_reason=c.finish_reason,
            )
            for c in choices
        ],
        usage=usage,
    )


@dataclass(frozen=True)
class ResponseShape:
    """One endpoint's answer: its stream chunks, and its whole completion from (record, model, choices,
    usage)."""

    encoder: type[ChunkEncoder]
    whole: Callable[[RequestRecord, str, list[ChoiceResult], Usage], BaseModel]


CHAT_SHAPE = ResponseShape(ChunkEncoder, _chat_completion)
TEXT_SHAPE = ResponseShape(TextChunkEncoder, _text_completion)


async def sse_chunks(
    rec: RequestRecord,
    upstream: UpstreamStream,
    model: str,
    usage_chunk: bool,
    finish: Finish,
    shape: ResponseShape = CHAT_SHAPE,
    choices: int = 1,
    tools: Callable[[], ToolAnswer] | None = None,
) -> AsyncGenerator[bytes, None]:
    """The framed SSE messages of a streamed completion (see the module doc); tools reads each choice's
    calls out of its text (a chat with tools)."""
    status: RequestStatus = "error"
    code: str | None = "replica_lost"
    encoder = shape.encoder(rec.completion_id, rec.created, model)
    started: set[int] = set()
    answers: dict[int, ToolAnswer] = {}
    try:
        async with contextlib.aclosing(completion_events(upstream, rec, choices)) as events:
            async for ev in events:
                logprobs = None if isinstance(ev, DoneEvent) else ev.logprobs
                text, calls = ev.text, list[ToolCall]()
                answer = answers.get(ev.index)
                if answer is None and tools is not None:  # the choice's first event: its reader
                    answer = answers[ev.index] = tools()
                if answer is not None:
                    text, calls = answer.feed(ev.text)
                    if isinstance(ev, DoneEvent):
                        rest, last = answer.close()
                        text, calls = text + rest, calls + last
                first = ev.index not in started
                if first or text or logprobs is not None:
                    yield encoder.content(text, first, ev.index, logprobs)
                    started.add(ev.index)
                for call in calls:
                    assert answer is not None
                    yield encoder.tool_call(answer.calls.index(call), call, ev.index)
                if isinstance(ev, DoneEvent):
                    reason = answer.finish_reason(ev.finish_reason) if answer else ev.finish_reason
                    yield encoder.finish(reason, ev.index)
        if usage_chunk and rec.usage is not None:
            yield encoder.usage(rec.usage)
        yield DONE
        status, code = "ok", None
    except GatewayError as exc:
        status, code = "error", exc.code
        yield error_frame(exc)
    except BaseException:
        status, code = "cancelled", "client_disconnected"
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
            await finish(rec, status, code)


async def completion_response(
    rec: RequestRecord,
    upstream: UpstreamStream,
    model: str,
    headers: dict[str, str],
    finish: Finish,
    shape: ResponseShape = CHAT_SHAPE,
    choices: int = 1,
    logprobs: bool = False,
    tools: Callable[[], ToolAnswer] | None = None,
) -> Response:
    """One whole completion from the stream; a failed stream raises its GatewayError. With logprobs, every
    choice has a logprobs list (empty when it stopped before any token line)."""
    results = [ChoiceResult(i, logprobs=[] if logprobs else None) for i in range(choices)]
    try:
        async with contextlib.aclosing(completion_events(upstream, rec, choices)) as events:
            async for ev in events:
                result = results[ev.index]
                result.parts.append(ev.text)
                if isinstance(ev, DoneEvent):
                    result.finish_reason = ev.finish_reason
                elif ev.logprobs is not None and result.logprobs is not None:
                    result.logprobs.append(ev.logprobs)
    except GatewayError as exc:
        with anyio.CancelScope(shield=True):
            await finish(rec, "error", exc.code)
        raise
    except BaseException:
        with anyio.CancelScope(shield=True):
            await finish(rec, "cancelled", "client_disconnected")
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
    assert rec.usage is not None  # completion_events ends after every choice's done event or raises
    if tools is not None:
        for result in results:
            answer = tools()
            text, calls = answer.feed(result.text)
            rest, last = answer.close()
            result.parts, result.tool_calls = [text + rest], (calls + last) or None
    whole = shape.whole(rec, model, results, rec.usage)
    await finish(rec, "ok", None)
    return JSONResponse(whole.model_dump(), headers=headers)
