"""The replica's HTTP service: streaming generate, adapter load/unload, state and drain, behind a service
token; GET /ready (no token) says whether it may be routed to."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from lorafleet.private_openapi import CLOSED_DOCS, serve_private_openapi
from replica.arrival import StampArrival, arrived
from replica.control.drain import Drain
from replica.control.merged_mode import merge_until_done, publish_forever
from replica.control.placements import PlacementsTable
from replica.control.registration import register_until_done
from replica.control.supervisor import supervise_control
from replica.control.warming import warm_up
from replica.engine.sampler import SamplingParams
from replica.engine.trace import AdmissionTrace
from replica.errors import (
    InvalidRequestError,
    ReplicaDrainingError,
    ReplicaError,
    ReplicaNotReadyError,
    UnauthorizedError,
    WrongReplicaError,
)
from replica.metrics import RequestTimer
from replica.runtime import AdapterUse, Replica
from replica.stream_events import stream_events
from schemas.api import ErrorBody, ErrorDetail
from schemas.ids import AdapterId
from schemas.replica_api import (
    DrainRequest,
    DrainResponse,
    ErrorEvent,
    GenerateRequest,
    LoadRequest,
    LoadResponse,
    StateResponse,
    UnloadResponse,
    encode_event,
)

log = logging.getLogger(__name__)


def service_authorized(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """A valid service token."""
    settings = request.app.state.replica.settings
    expected = f"Bearer {settings.service_token}"
    if authorization is None or not hmac.compare_digest(authorization.encode(), expected.encode()):
        raise UnauthorizedError("missing or invalid service token")


def authorized(
    request: Request, replica_id: str, authorization: Annotated[str | None, Header()] = None
) -> None:
    """Every per-replica internal route: a valid service token, addressed to this replica."""
    service_authorized(request, authorization)
    settings = request.app.state.replica.settings
    if replica_id != settings.replica_id:
        raise WrongReplicaError(f"this is replica {settings.replica_id!r}, not {replica_id!r}")


Authorized = Annotated[None, Depends(authorized)]
ServiceAuthorized = Annotated[None, Depends(service_authorized)]


def create_app(replica: Replica, on_drained: Callable[[], None] | None = None) -> FastAPI:
    """Build the FastAPI app around an assembled Replica (the engine thread starts with the app).

    With a control plane (Kafka control loop and adapter cache) the replica warms before it turns ready;
    without one it is ready at once. on_drained runs when a drain has finished (it stops the server)."""
    settings = replica.settings
    controlled = settings.control_enabled and replica.gpu is not None  # a merged replica has no cache
    table = PlacementsTable(settings.platform, settings.replica_id) if controlled else None
    drain = Drain(replica, table, on_drained or (lambda: log.info("drained; the process may stop now")))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await replica.start()
        shutdown = asyncio.Event()
        control: asyncio.Task[None] | None = None
        warming: asyncio.Task[None] | None = None
        if table is not None and replica.cache is not None:
            replica.lifecycle.begin_warming()  # before the first replica.state goes out
            since = datetime.now(UTC)
            control = asyncio.create_task(
                supervise_control(
                    settings.platform,
                    settings.replica_id,
                    replica.cache,
                    replica.replica_state,
                    shutdown,
                    settings.state_interval_s,
                    nudge=replica.state_changed,
                    dead_letters=replica.metrics.dead_letters,
                ),
                name="replica-control",
            )
            warming = asyncio.create_task(
                warm_up(
                    replica.lifecycle,
                    table,
                    replica.cache.tier_of,
                    since,
                    settings.warming_timeout_s,
                    settings.lifecycle_poll_s,
                    replica.state_changed.set,
                ),
                name="replica-warming",
            )
        elif replica.merged_adapter_id is not None:
            replica.lifecycle.begin_warming()  # ready once its adapter is folded in (_merge)
        else:
            replica.lifecycle.become_ready()
        background: list[asyncio.Task[None]] = []
        if settings.control_enabled:  # it announces itself on replica.state: the gateway checks this row
            registration = register_until_done(
                settings.platform.database_url, settings.replica_id, settings.url(), shutdown
            )
            background.append(asyncio.create_task(registration, name="replica-registration"))
        if replica.merged_adapter_id is not None:
            background.append(asyncio.create_task(_merge(replica, shutdown), name="replica-merge"))
            if settings.control_enabled:
                state = publish_forever(
                    settings.platform,
                    replica.replica_state,
                    shutdown,
                    settings.state_interval_s,
                    nudge=replica.state_changed,
                )
                background.append(asyncio.create_task(state, name="replica-merged-state"))
        try:
            yield
        finally:
            shutdown.set()
            for task in (warming, drain.task):
                if task is not None and not task.done():
                    task.cancel()
            await asyncio.gather(*(t for t in (control, warming) if t is not None), return_exceptions=True)
            await asyncio.gather(*background, return_exceptions=True)
            if table is not None:
                await table.close()
            await replica.stop()

    app = FastAPI(title="lorafleet replica", lifespan=lifespan, **CLOSED_DOCS)
    serve_private_openapi(app, service_authorized)
    app.state.replica = replica
    app.add_middleware(StampArrival)
    app.state.drain = drain

    @app.exception_handler(ReplicaError)
    async def replica_error(request: Request, exc: ReplicaError) -> JSONResponse:
        return JSONResponse(exc.to_body().model_dump(), status_code=exc.status, headers=exc.headers())

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        err = InvalidRequestError(f"invalid request: {first.get('msg', 'malformed body')}", param=param)
        return JSONResponse(err.to_body().model_dump(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else "http_error"
        err = ErrorDetail(message=str(exc.detail), type="invalid_request_error", code=code)
        return JSONResponse(ErrorBody(error=err).model_dump(), status_code=exc.status_code)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        # no token: the Kubernetes readiness probe; ready means the router may send requests here
        life = replica.lifecycle
        if life.status == "ready":
            return JSONResponse({"status": "ready"})
        progress = f" ({life.warm_adapters}/{life.owned_adapters} owned adapters warm)"
        err = ReplicaNotReadyError(
            f"replica is {life.status}" + (progress if life.status == "warming" else "")
        )
        return JSONResponse(err.to_body().model_dump(), status_code=err.status)

    @app.post("/internal/drain")
    async def start_drain(_: ServiceAuthorized, body: DrainRequest | None = None) -> DrainResponse:
        return drain.start(body.deadline_s if body is not None else None)

    @app.get("/metrics")
    async def metrics() -> Response:
        # no token: Prometheus scrapes it like vLLM's; it shows load and adapter ids, never prompts
        return Response(generate_latest(replica.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/internal/replicas/{replica_id}/generate")
    async def generate(
        request: Request, replica_id: str, body: GenerateRequest, _: Authorized
    ) -> StreamingResponse:
        trace = AdmissionTrace(arrived(request.scope), parsed=time.perf_counter())
        if not replica.lifecycle.accepting:
            raise ReplicaDrainingError("this replica is draining; send the request to another one")
        messages = [m.model_dump() for m in body.messages] if body.messages is not None else None
        prompt = replica.prompt_ids(messages, body.prompt_token_ids, trace)
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        params = SamplingParams(
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            max_tokens=_completion_budget(body, len(prompt), replica.settings.max_model_len),
            stop=stop,
            ignore_eos=body.ignore_eos,
        )
        replica.engine.engine.check_request(prompt, params)
        timer = replica.metrics.request()
        use = await replica.acquire(body.adapter_id, body.tenant_id)
        if use.header_adapter_id is not None:
            replica.metrics.hit(use.tier or "gpu")
        request_id = body.request_id or replica.engine.next_request_id()
        headers = {"x-request-id": request_id}
        if use.header_adapter_id is not None:
            headers |= {"x-adapter-id": use.header_adapter_id, "x-adapter-tier": use.tier or "gpu"}
        log.info(
            "request %s adapter=%s tier=%s prompt=%d",
            request_id,
            use.header_adapter_id,
            use.tier,
            len(prompt),
        )
        replica.running.add(request_id)

        def done() -> None:
            replica.running.discard(request_id)
            replica.release(use)

        return LeasedStream(
            _stream(replica, prompt, params, use, request_id, timer, trace, body.tenant_id),
            done,
            media_type="application/x-ndjson",
            headers=headers,
        )

    @app.post("/internal/replicas/{replica_id}/adapters/{adapter_id}/load")
    async def load(
        replica_id: str, adapter_id: AdapterId, _: Authorized, body: LoadRequest | None = None
    ) -> LoadResponse:
        trained_on = body.base_model_hash if body is not None else None
        bucket, ms = await replica.load_adapter(adapter_id, trained_on)
        return LoadResponse(adapter_id=adapter_id, tier="gpu", rank_bucket=bucket, load_ms=round(ms, 3))

    @app.post("/internal/replicas/{replica_id}/adapters/{adapter_id}/unload")
    async def unload(replica_id: str, adapter_id: AdapterId, _: Authorized) -> UnloadResponse:
        await replica.unload_adapter(adapter_id)
        return UnloadResponse(adapter_id=adapter_id, unloaded=True)

    @app.get("/internal/replicas/{replica_id}/state")
    async def state(replica_id: str, _: Authorized) -> StateResponse:
        return replica.state()

    return app


def _completion_budget(body: GenerateRequest, prompt_tokens: int, max_model_len: int) -> int:
    """max_tokens; a default one (left out, or the gateway's) shrinks to what the context leaves after the
    prompt. The caller's own is kept, and the engine refuses it when it does not fit."""
    if body.max_tokens_is_default or "max_tokens" not in body.model_fields_set:
        return max(1, min(body.max_tokens, max_model_len - prompt_tokens))
    return body.max_tokens


async def _merge(replica: Replica, shutdown: asyncio.Event) -> None:
    def merged() -> None:
        if replica.lifecycle.become_ready():  # not once a drain has begun
            replica.state_changed.set()

    await merge_until_done(replica.merge, shutdown, merged, retry_s=2.0)


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
    tenant_id: str | None,
) -> AsyncIterator[bytes]:
    """NDJSON lines for one request; if the client goes away, closing this generator aborts the request."""
    if replica.lifecycle.expired:  # accepted, but the drain's deadline passed before it started
        err = ReplicaDrainingError("the replica is shutting down; retry the request")
        yield encode_event(ErrorEvent(error=err.to_body().error))
        return
    gen = replica.engine.generate(prompt, params, use.engine_adapter_id, request_id, trace, tenant_id)
    first = True
    async with contextlib.aclosing(gen):
        async for out in gen:
            if out.token_id is not None:
                timer.token()
                if first:
                    trace.delivered = time.perf_counter()
                    replica.metrics.admitted(trace)
            first = False
            ended = out.finished or out.error is not None
            if ended and out.error is None:
                timer.finished(out.finish_reason, out.prompt_tokens, out.completion_tokens)
            for event in stream_events(out):
                yield encode_event(event)
            if ended:
                return
