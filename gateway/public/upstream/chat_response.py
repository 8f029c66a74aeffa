"""The response over one replica stream: SSE chunks as tokens arrive, or one whole completion, in the shape
of the endpoint asked (CHAT_SHAPE: chat.completion; TEXT_SHAPE: the legacy text_completion).

Both read the stream through upstream_events.completion_events, so a token, the done line and every
failure mean the same on both paths. Streaming sends the content chunks (the first carries the role), the
finish chunk, the usage chunk when asked, then `data: [DONE]`; a failure midway ends it with an
`event: error` in OpenAI's error shape and no [DONE]. The JSON path answers the failure as the error
response instead. Each request is finished exactly once: ok, error with its code, or cancelled.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

import anyio
from fastapi import Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from gateway.errors import GatewayError
from gateway.public.online import RequestRecord
from gateway.public.upstream.chunk_encoder import DONE, ChunkEncoder, TextChunkEncoder, error_frame
from gateway.public.upstream.events import completion_events
from gateway.public.upstream.replica_client import UpstreamStream
from schemas.events import RequestStatus
from schemas.openai import AssistantMessage, ChatCompletion, Choice
from schemas.openai_completions import Completion, CompletionChoice
from schemas.replica_api import DoneEvent

Finish = Callable[[RequestRecord, RequestStatus, str | None], Awaitable[None]]  # Online.finish


def _chat_completion(rec: RequestRecord, model: str, text: str, done: DoneEvent) -> BaseModel:
    choice = Choice(message=AssistantMessage(content=text), finish_reason=done.finish_reason)
    return ChatCompletion(
        id=rec.completion_id, created=rec.created, model=model, choices=[choice], usage=done.usage
    )


def _text_completion(rec: RequestRecord, model: str, text: str, done: DoneEvent) -> BaseModel:
    choice = CompletionChoice(text=text, finish_reason=done.finish_reason)
    return Completion(
        id=rec.completion_id, created=rec.created, model=model, choices=[choice], usage=done.usage
    )


@dataclass(frozen=True)
class ResponseShape:
    """One endpoint's answer: its stream chunks, and its whole completion from (record, model, text, done)."""

    encoder: type[ChunkEncoder]
    whole: Callable[[RequestRecord, str, str, DoneEvent], BaseModel]


CHAT_SHAPE = ResponseShape(ChunkEncoder, _chat_completion)
TEXT_SHAPE = ResponseShape(TextChunkEncoder, _text_completion)


async def sse_chunks(
    rec: RequestRecord,
    upstream: UpstreamStream,
    model: str,
    usage_chunk: bool,
    finish: Finish,
    shape: ResponseShape = CHAT_SHAPE,
) -> AsyncGenerator[bytes, None]:
    """The framed SSE messages of a streamed completion (see the module doc)."""
    status: RequestStatus = "error"
    code: str | None = "replica_lost"
    encoder = shape.encoder(rec.completion_id, rec.created, model)
    first = True
    try:
        async with contextlib.aclosing(completion_events(upstream, rec)) as events:
            async for ev in events:
                if first or ev.text:
                    yield encoder.content(ev.text, first)
                    first = False
                if isinstance(ev, DoneEvent):
                    yield encoder.finish(ev.finish_reason)
                    if usage_chunk:
                        yield encoder.usage(ev.usage)
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
) -> Response:
    """One whole completion from the stream; a failed stream raises its GatewayError."""
    parts: list[str] = []
    done: DoneEvent | None = None
    try:
        async with contextlib.aclosing(completion_events(upstream, rec)) as events:
            async for ev in events:
                parts.append(ev.text)
                if isinstance(ev, DoneEvent):
                    done = ev
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
    assert done is not None  # completion_events ends with the done event or raises
    result = shape.whole(rec, model, "".join(parts), done)
    await finish(rec, "ok", None)
    return JSONResponse(result.model_dump(), headers=headers)
