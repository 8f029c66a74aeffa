"""POST /internal/replicas/{replica_id}/generate: one request streamed back as NDJSON events, its adapter
held in a GPU slot until the response ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from replica.arrival import arrived
from replica.choices import ChoiceRequest, choice_outputs
from replica.engine.sampler import SamplingParams
from replica.engine.trace import AdmissionTrace
from replica.errors import InvalidRequestError, ReplicaDrainingError
from replica.metrics import RequestTimer
from replica.routes.deps import Authorized, ServingReplica
from replica.runtime import AdapterUse, Replica
from replica.stream_events import Spell, spell_id, stream_events
from replica.structured.compiler import PARAM
from replica.structured.matcher import GrammarMatcher
from schemas.replica_api import ErrorEvent, GenerateRequest, encode_event
from schemas.response_format import constraint_schema

# the request log line keeps the server's logger name: operators and the lifecycle test match on it
log = logging.getLogger("replica.server")

router = APIRouter()


@router.post("/internal/replicas/{replica_id}/generate")
async def generate(
    request: Request, replica_id: str, body: GenerateRequest, _: Authorized, replica: ServingReplica
) -> StreamingResponse:
    trace = AdmissionTrace(arrived(request.scope), parsed=time.perf_counter())
    if not replica.lifecycle.accepting:
        raise ReplicaDrainingError("this replica is draining; send the request to another one")
    # the template and the tokenizer run on a worker thread: a long prompt never stalls the event loop
    prompt = await asyncio.to_thread(replica.prompt_ids, body, trace)
    params = _sampling_params(body, len(prompt), replica.settings.max_model_len)
    replica.engine.engine.check_request(prompt, params, "prompt" if body.prompt is not None else "messages")
    grammar = await _grammar(replica, body)
    timer = replica.metrics.request()
    with replica.admitting.holding(len(prompt)):  # waiting for the batch, as the router should see it
        use = await replica.acquire(body.adapter_id, body.tenant_id)
    if use.header_adapter_id is not None:
        replica.metrics.hit(use.tier or "gpu")
    request_id = body.request_id or replica.engine.next_request_id()
    log.info(
        "request %s adapter=%s tier=%s prompt=%d", request_id, use.header_adapter_id, use.tier, len(prompt)
    )
    replica.running.add(request_id)

    def done() -> None:
        replica.running.discard(request_id)
        replica.release(use)

    return LeasedStream(
        _stream(replica, prompt, params, use, request_id, timer, trace, body, grammar),
        done,
        media_type="application/x-ndjson",
        headers=_headers(use, request_id),
    )


def _sampling_params(body: GenerateRequest, prompt_tokens: int, max_model_len: int) -> SamplingParams:
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return SamplingParams(
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=tuple((int(token_id), bias) for token_id, bias in (body.logit_bias or {}).items()),
        max_tokens=_completion_budget(body, prompt_tokens, max_model_len),
        stop=stop,
        ignore_eos=body.ignore_eos,
        logprobs=body.logprobs,
    )


async def _grammar(replica: Replica, body: GenerateRequest) -> Callable[[], GrammarMatcher] | None:
    """A maker of grammar states for the request's response_format, one per choice (None: plain text),
    the schema compiled once off the event loop within the compile time limit; a schema over a limit is
    refused before any GPU work."""
    schema = constraint_schema(body.response_format)
    if schema is None:
        return None
    param = "tools" if body.tool_requirement() else PARAM  # a required call's schema is its tools'
    compiler = replica.grammars
    if compiler is None:
        raise InvalidRequestError("structured output needs the model's tokenizer", param=param)
    timeout = compiler.limits.compile_timeout_s
    try:
        compiler.check(schema)
        first = await asyncio.wait_for(asyncio.to_thread(compiler.matcher, schema), timeout)
    except TimeoutError:
        raise InvalidRequestError(f"the schema did not compile within {timeout:g} s", param=param) from None
    except InvalidRequestError as exc:
        if param == PARAM:
            raise
        raise InvalidRequestError(str(exc), param=param) from None
    made = [first]  # choice 0 takes this one; the others' come from the cache, compiled by now
    return lambda: made.pop() if made else compiler.matcher(schema)


def _completion_budget(body: GenerateRequest, prompt_tokens: int, max_model_len: int) -> int:
    """max_tokens; a default one (left out, or the gateway's) shrinks to what the context leaves after the
    prompt. The caller's own is kept, and the engine refuses it when it does not fit."""
    if body.max_tokens_is_default or "max_tokens" not in body.model_fields_set:
        return max(1, min(body.max_tokens, max_model_len - prompt_tokens))
    return body.max_tokens


def _headers(use: AdapterUse, request_id: str) -> dict[str, str]:
    headers = {"x-request-id": request_id}
    if use.header_adapter_id is not None:
        headers |= {"x-adapter-id": use.header_adapter_id, "x-adapter-tier": use.tier or "gpu"}
    return headers


class LeasedStream(StreamingResponse):
    """A streamed response that ends its request's adapter hold however the response ends."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


async def _stream(
    replica: Replica,
    prompt: list[int],
    params: SamplingParams,
    use: AdapterUse,
    request_id: str,
    timer: RequestTimer,
    trace: AdmissionTrace,
    body: GenerateRequest,
    grammar: Callable[[], GrammarMatcher] | None,
) -> AsyncIterator[bytes]:
    """NDJSON lines for one request; if the client goes away, closing this generator aborts the request."""
    if replica.lifecycle.expired:  # accepted, but the drain's deadline passed before it started
        err = ReplicaDrainingError("the replica is shutting down; retry the request")
        yield encode_event(ErrorEvent(error=err.to_body().error))
        return
    choices = ChoiceRequest(
        prompt,
        params,
        body.n,
        use.engine_adapter_id,
        request_id,
        trace,
        body.tenant_id,
        body.cache_salt,
        grammar,
    )
    spell = _speller(replica)
    gen = choice_outputs(replica.engine, choices)
    first, open_choices, generated = True, body.n, 0
    reason: str | None = None
    async with contextlib.aclosing(gen):
        async for index, out in gen:
            if out.token_id is not None and index == 0:  # TTFT and ITL follow choice 0
                timer.token()
                if first:
                    trace.delivered = time.perf_counter()
                    replica.metrics.admitted(trace)
                first = False
            ended = out.finished or out.error is not None
            if ended and out.error is None:
                open_choices -= 1
                generated += out.completion_tokens
                reason = out.finish_reason if index == 0 else reason
                if not open_choices:  # the prompt once, every choice's tokens
                    timer.finished(reason, out.prompt_tokens, generated)
            for event in stream_events(out, index, spell):
                yield encode_event(event)
            if out.error is not None or not open_choices:
                return


def _speller(replica: Replica) -> Spell:
    """Token ids' bytes for logprobs: the tokenizer's, or vLLM's token_id:N without one."""
    return spell_id if replica.tokenizer is None else replica.tokenizer.token_bytes
