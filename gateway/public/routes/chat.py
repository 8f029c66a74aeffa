"""POST /v1/chat/completions: authenticate, resolve the alias, admit under the tenant's limits, route, relay.

The alias is resolved here only; the replica gets the immutable adapter id. The response over the
replica's stream is gateway.public.upstream.chat_response's. A client that goes away closes the
upstream stream, which aborts the generation on the replica. A request with an Idempotency-Key runs
once and its 200 is replayed to retries (gateway.public.idempotency).
"""

from __future__ import annotations

import asyncio
import logging
import time

import anyio
from fastapi import APIRouter, Request, Response
from pydantic import ValidationError

from gateway.deps import PublicCaller
from gateway.errors import BadRequest, NotFound, PayloadTooLarge, RequestTimeout
from gateway.public.admission.refusals import refuse_concurrency, refuse_if_limited
from gateway.public.idempotency import HEADER as IDEMPOTENCY_HEADER
from gateway.public.idempotent_chat import begin
from gateway.public.online import Online, RequestRecord
from gateway.public.upstream.chat_response import completion_response, sse_chunks
from gateway.public.upstream.errors import public_error
from gateway.public.upstream.replica_client import ReplicaRejected, ReplicaUnavailable
from gateway.sse_response import SseResponse
from gateway.tenants import Caller
from schemas.openai import ChatCompletionRequest
from schemas.openai_params import request_error
from schemas.replica_api import ChatMessage, GenerateRequest

log = logging.getLogger(__name__)
router = APIRouter()

MODEL_NOT_FOUND = "The model does not exist or you do not have access to it."


async def read_body(request: Request, limit: int, timeout_s: float = 30.0) -> bytes:
    """The raw body, refused with 413 past limit bytes (declared or actually streamed), and with 408 when it
    has not all arrived within timeout_s (a client trickling it holds no connection for long)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge("request_too_large", f"the request body is over {limit} bytes")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge("request_too_large", f"the request body is over {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(
            "request_timeout", f"the request body did not arrive within {timeout_s:g} s"
        ) from None
    return b"".join(chunks)


def parse_request(raw: bytes) -> ChatCompletionRequest:
    """The body, or a 400 naming the first parameter refused (the replica would name the same)."""
    try:
        return ChatCompletionRequest.model_validate_json(raw)
    except ValidationError as exc:
        error = request_error(exc.errors(include_url=False))
        raise BadRequest(error.code or "invalid_parameter", error.message, error.param) from exc


def estimate_prompt_tokens(body: ChatCompletionRequest) -> int:
    """An upper-side estimate for admission (about 3 bytes a token plus template overhead per message)."""
    return sum(len(m.text().encode()) // 3 + 8 for m in body.messages) + 16


def replica_body(
    body: ChatCompletionRequest, adapter_id: str, request_id: str, max_tokens: int, tenant_id: str
) -> GenerateRequest:
    """The replica's generate request; sampling fields the caller left out keep the replica's defaults."""
    # The replica's chat template knows system/user/assistant/tool; developer is OpenAI's new name for system.
    messages = [
        ChatMessage(role="system" if m.role == "developer" else m.role, content=m.text())
        for m in body.messages
    ]
    sampling = body.model_dump(
        include={
            "temperature",
            "top_p",
            "seed",
            "stop",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "cache_salt",
        },
        exclude_none=True,
    )
    return GenerateRequest(
        messages=messages,
        adapter_id=adapter_id,
        tenant_id=tenant_id,
        request_id=request_id,
        max_tokens=max_tokens,
        max_tokens_is_default=body.max_completion_tokens is None and body.max_tokens is None,
        **sampling,
    )


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, caller: PublicCaller) -> Response:
    online: Online = request.app.state.online
    raw = await read_body(request, online.settings.max_body_bytes, online.settings.body_read_timeout_s)
    body = parse_request(raw)
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return await _serve(request, online, caller, body)
    canonical = body.model_dump_json().encode()  # the same request whatever its JSON spacing or key order
    claimed = await begin(online.idempotency, caller.tenant_id, key, canonical, bool(body.stream))
    if isinstance(claimed, Response):
        return claimed  # the stored answer: not run, not billed
    try:
        response = await _serve(request, online, caller, body)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await claimed.release()
        raise
    await claimed.complete(response)
    return response


async def _admit(online: Online, caller: Caller, rec: RequestRecord, tokens: int) -> None:
    """Count the request among its tenant's open ones, then reserve its rate; either refused raises its 429
    (or 400 for a request larger than the token limit itself) with nothing held."""
    if not online.open_request(caller, rec):
        refuse_concurrency(caller, online.concurrency_cap)
    try:
        decision = await online.admit(caller, rec, tokens)
        if not decision.admitted and decision.retry_after_s == float("inf"):
            raise BadRequest(
                "tokens_exceed_limit",
                "prompt plus max_completion_tokens is more than your tokens-per-minute limit",
                "max_completion_tokens",
            )
        refuse_if_limited(decision, caller)
    except BaseException:
        online.close_request(rec)  # refused before anything was reserved: nothing else to give back
        raise


async def _serve(request: Request, online: Online, caller: Caller, body: ChatCompletionRequest) -> Response:
    """Resolve, admit, route and relay one parsed request."""
    settings = online.settings
    rec = RequestRecord(
        request_id=request.state.request_id, tenant_id=caller.tenant_id, started=time.perf_counter()
    )
    rec.alias = body.model
    target = await online.aliases.resolve(caller.tenant_id, body.model)
    if target is None:  # no completion to admit, yet the lookup counts against the tenant's request rate
        refuse_if_limited(await online.charge_request(caller), caller)
        raise NotFound("model_not_found", MODEL_NOT_FOUND, "model")
    adapter_id = target.pick(body.model, body.user or rec.request_id)  # a canary takes its weight
    rec.adapter_id = adapter_id
    max_tokens = body.completion_limit(settings.default_max_tokens)
    await _admit(online, caller, rec, estimate_prompt_tokens(body) + max_tokens)
    try:
        upstream = await online.open_upstream(
            rec, replica_body(body, adapter_id, rec.request_id, max_tokens, caller.tenant_id)
        )
    except (ReplicaRejected, ReplicaUnavailable) as exc:
        error = public_error(exc)
        await online.finish(rec, "error", error.code)
        raise error from exc
    except BaseException:  # cancelled while waiting for the first token: the reservation still comes back
        with anyio.CancelScope(shield=True):
            await online.finish(rec, "cancelled", "client_disconnected")
        raise
    headers = {
        "x-adapter-id": adapter_id,
        "x-adapter-tier": rec.tier or "ram",
        "x-request-id": rec.request_id,
    }
    if upstream.replica.merged is not None:  # the adapter folded into that replica's weights served it
        headers["x-lorafleet-merged"] = "true"
    if body.stream:
        stream = sse_chunks(rec, upstream, body.model, body.wants_usage_chunk(), online.finish)
        return SseResponse(
            stream,
            headers=headers,
            ping_s=15,
            buffer_bytes=settings.stream_buffer_bytes,
            send_timeout_s=settings.client_send_timeout_s,
            on_cut=online.metrics.streams_cut.inc,
        )
    return await completion_response(rec, upstream, body.model, headers, online.finish)
