"""The chat response over one replica stream: SSE chunks as tokens arrive, or one chat.completion.

Both read the stream through upstream_events.completion_events, so a token, the done line and every
failure mean the same on both paths. Streaming sends the content chunks (the first carries the role), the
finish chunk, the usage chunk when asked, then `data: [DONE]`; a failure midway ends it with an
`event: error` in OpenAI's error shape and no [DONE]. The JSON path answers the failure as the error
response instead. Each request is finished exactly once: ok, error with its code, or cancelled.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from fastapi import Response
from fastapi.responses import JSONResponse

from gateway.errors import GatewayError
from gateway.online import RequestRecord
from gateway.replica_client import UpstreamStream
from gateway.upstream_events import completion_events
from schemas.events import RequestStatus
from schemas.openai import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    Delta,
    FinishReason,
)
from schemas.replica_api import DoneEvent

Finish = Callable[[RequestRecord, RequestStatus, str | None], Awaitable[None]]  # Online.finish


def _chunk(rec: RequestRecord, model: str, delta: Delta, finish: FinishReason | None = None) -> str:
    choice = ChunkChoice(delta=delta, finish_reason=finish)
    return ChatCompletionChunk(
        id=rec.completion_id, created=rec.created, model=model, choices=[choice]
    ).model_dump_json(exclude_none=False)


def _error_event(exc: GatewayError) -> dict[str, str]:
    return {"event": "error", "data": json.dumps(exc.body())}


async def sse_chunks(
    rec: RequestRecord, upstream: UpstreamStream, model: str, usage_chunk: bool, finish: Finish
) -> AsyncIterator[dict[str, str] | str]:
    """The SSE events of a streamed chat completion (see the module doc)."""
    status: RequestStatus = "error"
    code: str | None = "replica_lost"
    first = True
    try:
        async with contextlib.aclosing(completion_events(upstream, rec)) as events:
            async for ev in events:
                if first or ev.text:
                    delta = Delta(role="assistant", content=ev.text) if first else Delta(content=ev.text)
                    yield _chunk(rec, model, delta)
                    first = False
                if isinstance(ev, DoneEvent):
                    yield _chunk(rec, model, Delta(), ev.finish_reason)
                    if usage_chunk:
                        yield ChatCompletionChunk(
                            id=rec.completion_id, created=rec.created, model=model, choices=[], usage=ev.usage
                        ).model_dump_json()
                    yield "[DONE]"
                    status, code = "ok", None
    except GatewayError as exc:
        status, code = "error", exc.code
        yield _error_event(exc)
    except BaseException:
        status, code = "cancelled", "client_disconnected"
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
            await finish(rec, status, code)


async def completion_response(
    rec: RequestRecord, upstream: UpstreamStream, model: str, headers: dict[str, str], finish: Finish
) -> Response:
    """One chat.completion from the whole stream; a failed stream raises its GatewayError."""
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
    choice = Choice(message=AssistantMessage(content="".join(parts)), finish_reason=done.finish_reason)
    result = ChatCompletion(
        id=rec.completion_id, created=rec.created, model=model, choices=[choice], usage=done.usage
    )
    await finish(rec, "ok", None)
    return JSONResponse(result.model_dump(), headers=headers)
