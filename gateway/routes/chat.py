"""POST /v1/chat/completions: authenticate, resolve the alias, admit under the tenant's limits, route, relay.

The alias is resolved here only; the replica gets the immutable adapter id. Streaming relays the replica's
tokens as SSE chunks as they arrive and ends with the usage chunk (when asked) and `data: [DONE]`, or with
an `event: error` and no [DONE] when the replica fails midway. A client that goes away closes the upstream
stream, which aborts the generation on the replica.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse

from gateway.deps import PublicCaller
from gateway.errors import BadRequest, NotFound, PayloadTooLarge, RateLimited, ServiceUnavailable
from gateway.online import Online, RequestRecord
from gateway.rate_limit import retry_after_header
from gateway.replica_client import ReplicaRejected, ReplicaUnavailable, UpstreamStream
from schemas.openai import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    Usage,
)

log = logging.getLogger(__name__)
router = APIRouter()

MODEL_NOT_FOUND = "The model does not exist or you do not have access to it."


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with 413 past limit bytes (declared or actually streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge("request_too_large", f"the request body is over {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge("request_too_large", f"the request body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_request(raw: bytes) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise BadRequest("invalid_json", "the request body is not valid JSON") from exc
        loc = [str(p) for p in first["loc"]]
        param = loc[0] if loc else None
        raise BadRequest("invalid_parameter", f"{'.'.join(loc) or 'body'}: {first['msg']}", param) from exc


def estimate_prompt_tokens(body: ChatCompletionRequest) -> int:
    """An upper-side estimate for admission (about 3 bytes a token plus template overhead per message)."""
    return sum(len(m.text().encode()) // 3 + 8 for m in body.messages) + 16


def replica_body(
    body: ChatCompletionRequest, adapter_id: str, request_id: str, max_tokens: int
) -> dict[str, Any]:
    # The replica's chat template knows system/user/assistant/tool; developer is OpenAI's new name for system.
    messages = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages
    ]
    out: dict[str, Any] = {
        "messages": messages,
        "adapter_id": adapter_id,
        "request_id": request_id,
        "max_tokens": max_tokens,
    }
    for name in ("temperature", "top_p", "seed", "stop"):
        value = getattr(body, name)
        if value is not None:
            out[name] = value
    return out


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, caller: PublicCaller) -> Response:
    online: Online = request.app.state.online
    settings = online.settings
    rec = RequestRecord(
        request_id=request.state.request_id, tenant_id=caller.tenant_id, started=time.perf_counter()
    )
    body = parse_request(await read_body(request, settings.max_body_bytes))
    rec.alias = body.model
    adapter_id = await online.aliases.resolve(caller.tenant_id, body.model)
    if adapter_id is None:
        raise NotFound("model_not_found", MODEL_NOT_FOUND, "model")
    rec.adapter_id = adapter_id
    max_tokens = body.completion_limit(settings.default_max_tokens)
    decision = online.admit(caller, rec, estimate_prompt_tokens(body) + max_tokens)
    if not decision.admitted:
        if decision.retry_after_s == float("inf"):
            raise BadRequest(
                "tokens_exceed_limit",
                "prompt plus max_completion_tokens is more than your tokens-per-minute limit",
                "max_completion_tokens",
            )
        kind = "requests" if decision.limit == "requests_per_s" else "tokens"
        wait = retry_after_header(decision.retry_after_s)
        raise RateLimited(
            kind,
            f"Rate limit reached for {caller.tenant_id} on {decision.limit}; try again in {wait}s.",
            {"Retry-After": wait, "retry-after-ms": str(max(1, int(decision.retry_after_s * 1000)))},
        )
    try:
        upstream = await online.open_upstream(rec, replica_body(body, adapter_id, rec.request_id, max_tokens))
    except ReplicaRejected as exc:
        await online.finish(rec, "error", exc.error.get("code") or "replica_rejected")
        code, msg, param = exc.error.get("code"), exc.error.get("message", ""), exc.error.get("param")
        if exc.status in (400, 413, 422):
            raise BadRequest(code or "invalid_request", msg, param) from exc
        raise ServiceUnavailable(code or "replica_error", msg, None, {"Retry-After": "1"}) from exc
    except ReplicaUnavailable as exc:
        await online.finish(rec, "error", "no_replica")
        raise ServiceUnavailable(
            "no_replica_available", "no replica can take this request now", None, {"Retry-After": "1"}
        ) from exc
    headers = {
        "x-adapter-id": adapter_id,
        "x-adapter-tier": rec.tier or "ram",
        "x-request-id": rec.request_id,
    }
    if body.stream:
        stream = _sse(online, rec, upstream, body.model, body.wants_usage_chunk())
        return EventSourceResponse(stream, headers=headers, ping=15)
    return await _complete(online, rec, upstream, body.model, headers)


def _chunk(rec: RequestRecord, model: str, delta: Delta, finish: str | None = None) -> str:
    choice = ChunkChoice(delta=delta, finish_reason=finish)
    return ChatCompletionChunk(
        id=rec.completion_id, created=rec.created, model=model, choices=[choice]
    ).model_dump_json(exclude_none=False)


def _error_event(code: str, message: str) -> dict[str, str]:
    err = {"message": message, "type": "server_error", "param": None, "code": code}
    return {"event": "error", "data": json.dumps({"error": err})}


async def _sse(
    online: Online, rec: RequestRecord, upstream: UpstreamStream, model: str, usage_chunk: bool
) -> AsyncIterator[dict[str, str] | str]:
    status, code = "error", "replica_lost"
    first = True
    try:
        async for ev in upstream.events():
            kind = ev.get("type")
            if kind == "token":
                rec.token_seen()
                text = ev.get("text") or ""
                if first or text:
                    yield _chunk(
                        rec, model, Delta(role="assistant", content=text) if first else Delta(content=text)
                    )
                    first = False
            elif kind == "done":
                rec.usage = Usage(**ev["usage"])
                tail = ev.get("text") or ""
                if tail or first:
                    yield _chunk(
                        rec, model, Delta(role="assistant", content=tail) if first else Delta(content=tail)
                    )
                yield _chunk(rec, model, Delta(), ev.get("finish_reason") or "stop")
                if usage_chunk:
                    yield ChatCompletionChunk(
                        id=rec.completion_id, created=rec.created, model=model, choices=[], usage=rec.usage
                    ).model_dump_json()
                yield "[DONE]"
                status, code = "ok", None
                return
            elif kind == "error":
                err = ev.get("error") or {}
                status, code = "error", err.get("code") or "generation_failed"
                yield _error_event(code, err.get("message") or "generation failed")
                return
        yield _error_event("replica_lost", "the replica stopped before the completion finished")
    except httpx.HTTPError as exc:
        log.warning("request %s: replica %s lost mid-stream: %r", rec.request_id, rec.replica_id, exc)
        yield _error_event("replica_lost", "the replica stopped before the completion finished")
    except BaseException:
        status, code = "cancelled", "client_disconnected"
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
            await online.finish(rec, status, code)


async def _complete(
    online: Online, rec: RequestRecord, upstream: UpstreamStream, model: str, headers: dict[str, str]
) -> Response:
    parts: list[str] = []
    try:
        async for ev in upstream.events():
            kind = ev.get("type")
            if kind == "token":
                rec.token_seen()
                parts.append(ev.get("text") or "")
            elif kind == "done":
                parts.append(ev.get("text") or "")
                rec.usage = Usage(**ev["usage"])
                message = AssistantMessage(content="".join(parts))
                choice = Choice(message=message, finish_reason=ev.get("finish_reason") or "stop")
                result = ChatCompletion(
                    id=rec.completion_id, created=rec.created, model=model, choices=[choice], usage=rec.usage
                )
                await online.finish(rec, "ok", None)
                return JSONResponse(result.model_dump(), headers=headers)
            elif kind == "error":
                err = ev.get("error") or {}
                await online.finish(rec, "error", err.get("code") or "generation_failed")
                raise ServiceUnavailable("generation_failed", err.get("message") or "generation failed")
    except httpx.HTTPError:
        pass
    except BaseException:
        with anyio.CancelScope(shield=True):
            await online.finish(rec, "cancelled", "client_disconnected")
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
    await online.finish(rec, "error", "replica_lost")
    raise ServiceUnavailable(
        "replica_lost", "the replica stopped before the completion finished", None, {"Retry-After": "1"}
    )
