"""Build the public OpenAI-compatible app (chat and legacy completions, models, the tenants' console page;
the health probes and a tenant-free /metrics) and serve it with uvicorn.

Its own listener, separate from /internal: tenants authenticate with API keys here, services with the
service token there, and nothing here takes the service token (the operator console and its admin API are
on the internal listener). Kafka feeds it replica.state (the router's view) and aliases.changed (the cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from fastapi import FastAPI
from pydantic import SecretStr
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config import GatewayConfig, GatewaySettings
from gateway.console import routes as console
from gateway.errors import install_error_handlers
from gateway.openapi_doc import install_openapi
from gateway.public.admission.auth import KeyAuthenticator
from gateway.public.admission.auth_failures import AuthFailureLimiter, failure_prefix
from gateway.public.admission.shared_rate_limit import SharedRateLimiter, bucket_prefix
from gateway.public.idempotency import IdempotencyStore, idempotency_prefix
from gateway.public.listener import bind_listener
from gateway.public.metrics import GatewayMetrics
from gateway.public.online import Online
from gateway.public.routes import chat, completions, health, models
from gateway.public.routing.alias_cache import AliasCache, consume_alias_changes
from gateway.public.routing.replica_view import ReplicaView, consume_states
from gateway.public.store_guard import REFRESH_FAILED, StoreGuard, keep_fresh
from gateway.public.tenant_metrics import build_tenant_metrics_app, serve_tenant_metrics
from gateway.public.upstream.replica_client import ReplicaClient
from gateway.public.usage_events import CompletionPublisher
from lorafleet.db.pool import create_pool
from lorafleet.dead_letters import DeadLetters
from lorafleet.profile import REDIS_URL_SETTING, refuse_dev_tokens, url_password
from lorafleet.replica_registry import ReplicaRegistry, StateRejections
from schemas import principals

log = logging.getLogger(__name__)


class RequestIdMiddleware:
    """Give every request an id (request.state.request_id) and answer it in x-request-id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = "req_" + secrets.token_hex(12)
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message["headers"] = [*headers, (b"x-request-id", request_id.encode())]
            await send(message)

        await self.app(scope, receive, send_with_id)


async def _start_consumers(
    online: Online, config: GatewayConfig, registry: ReplicaRegistry, pool: asyncpg.Pool
) -> list[asyncio.Task]:
    """Follow replica.state (registered addresses only) and aliases.changed; wait (briefly) until both are
    positioned."""
    ready_states, ready_aliases = asyncio.Event(), asyncio.Event()
    rejected = StateRejections(lambda reason: online.metrics.replica_states_rejected.labels(reason).inc())

    def letters(consumer: str) -> DeadLetters:
        return DeadLetters(consumer, pool, online.metrics.dead_letters)

    states = consume_states(
        config.platform, online.view, ready_states, letters("gateway-replica-state"), registry, rejected
    )
    tasks = [
        asyncio.create_task(registry.run(), name="replica-registry"),
        asyncio.create_task(states, name="replica-state"),
        asyncio.create_task(
            consume_alias_changes(config.platform, online.aliases, ready_aliases, letters("gateway-aliases")),
            name="aliases-changed",
        ),
    ]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(ready_states.wait(), ready_aliases.wait()), 20)
    return tasks


async def _keep_caches_fresh(online: Online, settings: GatewaySettings) -> list[asyncio.Task]:
    """Every alias read once before the first request, then again each period; the API keys in use read
    again each period. Each period is half its TTL at most, so that entries in use never lapse while the
    store answers and no request waits on a read; none where the TTL caches nothing."""
    tasks = []
    refreshes = online.metrics.cache_refreshes
    aliases = online.aliases
    alias_period = min(settings.alias_cache_refresh_s, settings.alias_cache_ttl_s / 2)
    if alias_period > 0:
        limit = settings.alias_cache_bulk_max
        with contextlib.suppress(*REFRESH_FAILED):
            await aliases.refresh_all(limit, timeout_s=10.0)  # else the loop below tries again
        loop = keep_fresh(
            "aliases",
            alias_period,
            lambda: aliases.refresh_all(limit, timeout_s=alias_period),
            lambda outcome: refreshes.labels("aliases", outcome).inc(),
        )
        tasks.append(asyncio.create_task(loop, name="aliases-fresh"))
    key_period = settings.key_cache_ttl_s / 2
    if key_period > 0:
        loop = keep_fresh(
            "API keys",
            key_period,
            lambda: online.auth.refresh_known(timeout_s=key_period),
            lambda outcome: refreshes.labels("keys", outcome).inc(),
        )
        tasks.append(asyncio.create_task(loop, name="keys-fresh"))
    return tasks


def _limiter(config: GatewayConfig) -> SharedRateLimiter:
    """The tenants' buckets in Redis (fallback share: one of public_gateways), or in this process only."""
    settings = config.gateway
    if settings.rate_limit_store == "local":
        return SharedRateLimiter(None, "")
    client = Redis.from_url(
        config.platform.redis_url,
        socket_timeout=settings.redis_timeout_s,
        socket_connect_timeout=settings.redis_timeout_s,
        retry=Retry(NoBackoff(), 0),  # a failure switches to the fallback at once; retry_s paces the next try
    )
    return SharedRateLimiter(
        client,
        bucket_prefix(config.platform.database_url),
        fallback_share=settings.public_gateways,
        retry_s=settings.redis_retry_s,
    )


def build_public_app(config: GatewayConfig) -> FastAPI:
    """The public app; its state is built in the lifespan (pool, caches, consumers, clients)."""
    settings = config.gateway

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await create_pool(config.platform, min_size=1, max_size=10)
        guard = StoreGuard(config.platform.db_read_deadline_s, config.platform.db_read_pause_s)
        metrics = GatewayMetrics(settings.tenant_metrics_max)
        publisher = CompletionPublisher(
            config.platform,
            config.usage_spool_path(),
            metrics,
            max_events=settings.usage_spool_max_events,
            drain_timeout_s=settings.usage_drain_timeout_s,
        )
        await publisher.start()
        limiter = _limiter(config)
        online = Online(
            settings=settings,
            auth=KeyAuthenticator(pool, settings.key_cache_ttl_s, guard=guard),
            aliases=AliasCache(
                pool,
                settings.alias_cache_ttl_s,
                guard=guard,
                counted=lambda outcome: metrics.alias_lookups.labels(outcome).inc(),
            ),
            view=ReplicaView(settings.replica_stale_s, replica_id_prefix=settings.replica_id_prefix),
            replicas=ReplicaClient(
                settings.replica_service_token.get_secret_value(),
                settings.replica_connect_timeout_s,
                settings.replica_read_timeout_s,
                max_connections=settings.replica_max_connections,
                pool_timeout_s=min(settings.replica_pool_timeout_s, settings.first_token_timeout_s / 2),
            ),
            publisher=publisher,
            metrics=metrics,
            limiter=limiter,
            idempotency=IdempotencyStore(
                limiter.redis,
                idempotency_prefix(config.platform.database_url),
                settings.idempotency_ttl_s,
                settings.idempotency_lock_s,
            ),
            auth_failures=AuthFailureLimiter(
                limiter.redis,
                failure_prefix(config.platform.database_url),
                settings.auth_failure_limit,
                settings.auth_failure_window_s,
                fallback_share=settings.public_gateways,
                retry_s=settings.redis_retry_s,
            ),
        )
        app.state.online = online
        metrics.replicas_routable.set_function(lambda: len(online.view.live()))
        registry = ReplicaRegistry(pool, settings.replica_id_prefix)
        await registry.refresh()
        tasks = await _start_consumers(online, config, registry, pool)
        tasks += await _keep_caches_fresh(online, settings)
        tenant_server = None
        if settings.tenant_metrics_port:
            token = settings.service_token.get_secret_value()
            task, tenant_server = await serve_tenant_metrics(
                build_tenant_metrics_app(online.metrics, token),
                settings.tenant_metrics_host,
                settings.tenant_metrics_port,
                config.platform.listener_options(),
            )
            tasks.append(task)
        profiler = cProfile.Profile(time.process_time) if settings.profile_path is not None else None
        if profiler is not None:
            profiler.enable()
        try:
            yield
        finally:
            if profiler is not None and settings.profile_path is not None:
                profiler.disable()
                profiler.dump_stats(settings.profile_path)
            if tenant_server is not None:
                tenant_server.should_exit = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await online.replicas.aclose()
            if online.limiter.redis is not None:
                await online.limiter.redis.aclose()
            await publisher.stop()
            await pool.close()

    app = FastAPI(title="lorafleet", lifespan=lifespan)
    app.state.base_model_name = settings.served_model_dir.name
    install_error_handlers(app)
    install_openapi(app)
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.include_router(models.router)
    app.include_router(health.router)
    app.include_router(console.page_router(console.TENANT_VIEWS))
    app.add_middleware(RequestIdMiddleware)
    return app


def serve_public() -> None:
    """Serve the public OpenAI-compatible API (chat completions, models) for tenants."""
    import uvicorn

    config = GatewayConfig.from_env(principals.GATEWAY)
    tokens: dict[str, str | SecretStr] = {
        "LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN": config.gateway.replica_service_token
    }
    if config.gateway.rate_limit_store == "redis":  # it holds tenants' answers: a password of its own
        tokens[REDIS_URL_SETTING] = url_password(config.platform.redis_url)
    if config.gateway.tenant_metrics_port:  # the tenant-metrics listener checks the service token
        tokens["LORAFLEET_GATEWAY_SERVICE_TOKEN"] = config.gateway.service_token
    refuse_dev_tokens(config.platform, "public-gateway", tokens)
    settings = config.gateway
    sock = bind_listener(settings.public_host, settings.public_port, settings.socket_send_buffer_bytes)
    app = build_public_app(config)
    options = config.platform.listener_options(public=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, **options))
    server.run(sockets=[sock])
