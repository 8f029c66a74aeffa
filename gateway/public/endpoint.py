"""The request path every OpenAI completion endpoint shares: read the body, parse it, authenticate (the
route's PublicCaller), resolve the alias, admit under the tenant's limits, route, relay.

An Endpoint says only what differs between POST /v1/chat/completions and POST /v1/completions: the body
model, how its prompt reaches the replica (chat messages or raw text), its admission estimate, its id
prefix, the response shape and the name of its token-limit field. The alias is resolved here only; the
replica gets the immutable adapter id. A client that goes away closes the upstream stream, which aborts the
generation on the replica. A request with an Idempotency-Key runs once and its 200 is replayed to retries
(gateway.public.idempotency): the key is the tenant's, so one reused on the other endpoint is a different
body.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
from fastapi import Request, Response
from pydantic import ValidationError

from gateway.errors import BadRequest, NotFound, PayloadTooLarge, RequestTimeout
from gateway.public.admission.refusals import refuse_concurrency, refuse_if_limited
from gateway.public.idempotency import HEADER as IDEMPOTENCY_HEADER
from gateway.public.idempotent_chat import begin
from gateway.public.online import Online, RequestRecord
from gateway.public.upstream.chat_response import ResponseShape, completion_response, sse_chunks
from gateway.public.upstream.errors import public_error
from gateway.public.upstream.replica_client import ReplicaRejected, ReplicaUnavailable
from gateway.public.upstream.tool_answer import ToolAnswer
from gateway.sse_response import SseResponse
from gateway.tenants import Caller
from schemas.openai import SamplingRequest
from schemas.openai_params import request_error
from schemas.replica_api import GenerateRequest

MODEL_NOT_FOUND = "The model does not exist or you do not have access to it."

# The body fields the replica takes as they are; a field left out keeps the replica's default.
_SAMPLING = {
    "temperature",
    "top_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "cache_salt",
}

Body = TypeVar("Body", bound=SamplingRequest)


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


@dataclass(frozen=True)
class Endpoint(Generic[Body]):
    """What one completion endpoint adds to the shared path (see the module doc)."""

    body: type[Body]
    prompt: Callable[[Body], dict[str, Any]]  # GenerateRequest's prompt field: messages= or prompt=
    estimate_prompt_tokens: Callable[[Body], int]  # an upper-side estimate, for admission
    shape: ResponseShape
    id_prefix: str  # chatcmpl- or cmpl-, as OpenAI names each endpoint's completions
    limit_param: str  # the field a 400 for a request over the token limit names
    # how each choice's calls are read out of its text; None: the body shows the model no tools
    tool_answers: Callable[[Body], Callable[[], ToolAnswer] | None] = lambda _body: None

    def parse(self, raw: bytes) -> Body:
        """The body, or a 400 naming the first parameter refused (the replica would name the same)."""
        try:
            return self.body.model_validate_json(raw)
        except ValidationError as exc:
            error = request_error(exc.errors(include_url=False))
            raise BadRequest(error.code or "invalid_parameter", error.message, error.param) from exc

    def replica_body(
        self, body: Body, adapter_id: str, request_id: str, max_tokens: int, tenant_id: str
    ) -> GenerateRequest:
        """The replica's generate request; sampling fields the caller left out keep the replica's defaults."""
        return GenerateRequest(
            **self.prompt(body),
            adapter_id=adapter_id,
            tenant_id=tenant_id,
            request_id=request_id,
            max_tokens=max_tokens,
            max_tokens_is_default=body.caller_limit() is None,
            n=body.choices(),
            logprobs=body.logprob_alternatives(),
            response_format=body.json_format(),
            **body.model_dump(include=_SAMPLING, exclude_none=True),
        )


async def serve(request: Request, caller: Caller, endpoint: Endpoint[Body]) -> Response:
    """Read, parse and serve one request to endpoint, once per Idempotency-Key when it has one."""
    online: Online = request.app.state.online
    raw = await read_body(request, online.settings.max_body_bytes, online.settings.body_read_timeout_s)
    body = endpoint.parse(raw)
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return await _serve(request, online, caller, endpoint, body)
    canonical = body.model_dump_json().encode()  # the same request whatever its JSON spacing or key order
    claimed = await begin(online.idempotency, caller.tenant_id, key, canonical, bool(body.stream))
    if isinstance(claimed, Response):
        return claimed  # the stored answer: not run, not billed
    try:
        response = await _serve(request, online, caller, endpoint, body)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await claimed.release()
        raise
    await claimed.complete(response)
    return response


async def _admit(online: Online, caller: Caller, rec: RequestRecord, tokens: int, limit_param: str) -> None:
    """Count the request among its tenant's open ones, then reserve its rate; either refused raises its 429
    (or 400 for a request larger than the token limit itself) with nothing held."""
    if not online.open_request(caller, rec):
        refuse_concurrency(caller, online.concurrency_cap)
    try:
        decision = await online.admit(caller, rec, tokens)
        if not decision.admitted and decision.retry_after_s == float("inf"):
            raise BadRequest(
                "tokens_exceed_limit",
                f"prompt plus {limit_param} is more than your tokens-per-minute limit",
                limit_param,
            )
        refuse_if_limited(decision, caller)
    except BaseException:
        online.close_request(rec)  # refused before anything was reserved: nothing else to give back
        raise


async def _serve(
    request: Request, online: Online, caller: Caller, endpoint: Endpoint[Body], body: Body
) -> Response:
    """Resolve, admit, route and relay one parsed request."""
    settings = online.settings
    rec = RequestRecord(
        request_id=request.state.request_id,
        tenant_id=caller.tenant_id,
        started=time.perf_counter(),
        completion_id=endpoint.id_prefix + secrets.token_hex(12),
    )
    rec.alias = body.model
    target = await online.aliases.resolve(caller.tenant_id, body.model)
    if target is None:  # no completion to admit, yet the lookup counts against the tenant's request rate
        refuse_if_limited(await online.charge_request(caller), caller)
        raise NotFound("model_not_found", MODEL_NOT_FOUND, "model")
    adapter_id = target.pick(body.model, body.user or rec.request_id)  # a canary takes its weight
    rec.adapter_id = adapter_id
    max_tokens = body.completion_limit(settings.default_max_tokens)
    n = body.choices()
    # every choice may generate max_tokens; the prompt is prefilled and billed once
    rec.prompt_tokens_estimate = endpoint.estimate_prompt_tokens(body)
    await _admit(online, caller, rec, rec.prompt_tokens_estimate + n * max_tokens, endpoint.limit_param)
    try:
        upstream = await online.open_upstream(
            rec, endpoint.replica_body(body, adapter_id, rec.request_id, max_tokens, caller.tenant_id)
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
        stream = sse_chunks(
            rec,
            upstream,
            body.model,
            body.wants_usage_chunk(),
            online.finish,
            endpoint.shape,
            n,
            endpoint.tool_answers(body),
        )
        return SseResponse(
            stream,
            headers=headers,
            ping_s=15,
            buffer_bytes=settings.stream_buffer_bytes,
            send_timeout_s=settings.client_send_timeout_s,
            on_cut=online.metrics.streams_cut.inc,
        )
    logprobs = body.logprob_alternatives() is not None
    return await completion_response(
        rec,
        upstream,
        body.model,
        headers,
        online.finish,
        endpoint.shape,
        n,
        logprobs,
        endpoint.tool_answers(body),
    )
