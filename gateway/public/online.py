"""The public gateway's per-process state and the steps every chat request goes through around the relay:
admission (rate limit), upstream choice (router + replica client) and the one completion record."""

from __future__ import annotations

import logging
import math
import random
import secrets
import time
from dataclasses import dataclass, field

from gateway.config import GatewaySettings
from gateway.public.admission.auth import KeyAuthenticator
from gateway.public.admission.auth_failures import AuthFailureLimiter
from gateway.public.admission.rate_limit import Decision, Limits
from gateway.public.admission.shared_rate_limit import SharedRateLimiter, Store
from gateway.public.idempotency import IdempotencyStore
from gateway.public.metrics import GatewayMetrics
from gateway.public.routing.alias_cache import AliasCache
from gateway.public.routing.merged_first import merged_first
from gateway.public.routing.policy import ROUTING_MODES, RouterPolicy
from gateway.public.routing.replica_view import ReplicaView
from gateway.public.upstream.replica_client import ReplicaClient, UpstreamStream
from gateway.public.usage_events import CompletionPublisher
from gateway.tenants import Caller
from schemas.events import RequestCompleted, RequestStatus, Tier, request_completed_id
from schemas.openai import Usage
from schemas.replica_api import GenerateRequest

log = logging.getLogger(__name__)


@dataclass
class RequestRecord:
    """Everything known about one request, filled in as it goes; finished exactly once."""

    request_id: str
    tenant_id: str
    started: float
    alias: str = ""
    adapter_id: str | None = None
    replica_id: str | None = None
    tier: Tier | None = None
    route: str | None = None  # why the router chose its first replica (RoutePlan.reason)
    reserved_tokens: int = 0
    reserved_in: Store = "local"
    holds_concurrency: bool = False  # it counts among its tenant's open requests until finished
    prompt_tokens_estimate: int = 0  # what the gateway counted the prompt as, before the replica says
    completion_tokens_seen: int = 0
    ttft_s: float | None = None
    usage: Usage | None = None
    finished: bool = False
    completion_id: str = field(default_factory=lambda: "chatcmpl-" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))

    def token_seen(self) -> None:
        self.completion_tokens_seen += 1
        if self.ttft_s is None:
            self.ttft_s = time.perf_counter() - self.started


class Online:
    """One per public app: the caches, the limiter, the router's view and the clients."""

    def __init__(
        self,
        settings: GatewaySettings,
        auth: KeyAuthenticator,
        aliases: AliasCache,
        view: ReplicaView,
        replicas: ReplicaClient,
        publisher: CompletionPublisher,
        metrics: GatewayMetrics,
        limiter: SharedRateLimiter | None = None,
        auth_failures: AuthFailureLimiter | None = None,
        idempotency: IdempotencyStore | None = None,
    ) -> None:
        self.settings = settings
        self.auth = auth
        self.aliases = aliases
        self.view = view
        self.replicas = replicas
        self.publisher = publisher
        self.metrics = metrics
        self.limiter = limiter or SharedRateLimiter(None, "")
        self.idempotency = idempotency or IdempotencyStore(
            None, "", settings.idempotency_ttl_s, settings.idempotency_lock_s
        )
        self.auth_failures = auth_failures or AuthFailureLimiter(
            None, "", settings.auth_failure_limit, settings.auth_failure_window_s
        )
        self.route = merged_first(ROUTING_MODES[settings.routing_mode])
        self.policy = RouterPolicy(
            settings.owners_k,
            settings.spill_threshold_tokens,
            settings.gpu_preference_tokens,
            drain_tokens_per_s=settings.drain_tokens_per_s,
            slot_cost_s=settings.slot_cost_s,
            spill_wait_s=settings.spill_wait_s,
            prefill_tokens_per_s=settings.prefill_tokens_per_s,
            row_wait_s=settings.row_wait_s,
        )
        self.rng = random.Random()
        self._open: dict[str, int] = {}  # tenant -> requests open on this gateway
        self.concurrency_cap = math.ceil(
            settings.max_concurrent_requests_per_tenant / settings.public_gateways
        )

    def open_request(self, caller: Caller, rec: RequestRecord) -> bool:
        """Count rec among its tenant's open requests, unless the tenant is at this gateway's share of
        max_concurrent_requests_per_tenant (then False). finish() or close_request() gives it back."""
        held = self._open.get(caller.tenant_id, 0)
        if held >= self.concurrency_cap:
            self.metrics.refused(caller.tenant_id, "concurrent_requests")
            return False
        self._open[caller.tenant_id] = held + 1
        rec.holds_concurrency = True
        return True

    def close_request(self, rec: RequestRecord) -> None:
        if rec.holds_concurrency:
            rec.holds_concurrency = False
            left = self._open.get(rec.tenant_id, 1) - 1
            if left > 0:
                self._open[rec.tenant_id] = left
            else:
                self._open.pop(rec.tenant_id, None)

    async def admit(self, caller: Caller, rec: RequestRecord, tokens: int) -> Decision:
        limits = Limits(caller.requests_per_s, caller.tokens_per_min)
        reservation = await self.limiter.reserve(caller.tenant_id, limits, tokens)
        decision = reservation.decision
        self.metrics.rate_limit_fallback.set(1 if reservation.store == "local" else 0)
        if decision.admitted:
            rec.reserved_tokens = tokens
            rec.reserved_in = reservation.store
            self.metrics.inflight_tokens.labels("default").inc(tokens)
            self.metrics.inflight_requests.inc()
        else:
            self.metrics.refused(caller.tenant_id, decision.limit or "unknown")
        return decision

    async def charge_request(self, caller: Caller) -> Decision:
        """One request of the caller's requests-per-second bucket, no tokens: what a route that serves no
        completion (a model lookup, an unknown model) costs, so that none of them goes unlimited."""
        limits = Limits(caller.requests_per_s, caller.tokens_per_min)
        decision = (await self.limiter.reserve(caller.tenant_id, limits, 0)).decision
        if not decision.admitted:
            self.metrics.refused(caller.tenant_id, decision.limit or "unknown")
        return decision

    def replica_failed(self, replica_id: str) -> None:
        """A replica was given up on: count it and keep the router off it until it reports again."""
        self.metrics.replica_failures.labels(replica_id).inc()
        self.view.mark_failed(replica_id)

    async def open_upstream(self, rec: RequestRecord, body: GenerateRequest) -> UpstreamStream:
        assert rec.adapter_id is not None
        plan = self.route(rec.adapter_id, self.view.live(), self.policy, self.rng)
        rec.route = plan.reason
        try:
            upstream = await self.replicas.open(
                plan.replicas,
                body,
                self.replica_failed,
                first_token_s=self.settings.first_token_timeout_s,
                stall_s=self.settings.stall_timeout_s,
            )
        except Exception:  # no replica took it; a caller gone meanwhile (cancelled) is not counted
            self.metrics.routes.labels(plan.reason, "failed").inc()
            raise
        rec.replica_id = upstream.replica.replica_id
        self.metrics.routes.labels(plan.reason, "fallback" if upstream.retried else "first").inc()
        rec.tier = upstream.adapter_tier
        self.view.add_inflight(rec.replica_id, rec.reserved_tokens, rec.prompt_tokens_estimate)
        self.view.record_tier(rec.replica_id, rec.tier)
        return upstream

    async def finish(self, rec: RequestRecord, status: RequestStatus, error_code: str | None) -> None:
        """Refund unused tokens, release the replica, count, log and publish requests.completed. Once."""
        if rec.finished:
            return
        rec.finished = True
        self.close_request(rec)
        total = time.perf_counter() - rec.started
        prompt = rec.usage.prompt_tokens if rec.usage else 0
        completion = rec.usage.completion_tokens if rec.usage else rec.completion_tokens_seen
        if rec.reserved_tokens:
            # Keep what was really used (prompt + generated); estimate the prompt when the replica never said.
            used = prompt + completion if rec.usage else min(rec.reserved_tokens, completion + 16)
            await self.limiter.refund(rec.tenant_id, rec.reserved_tokens - used, rec.reserved_in)
            self.metrics.inflight_tokens.labels("default").dec(rec.reserved_tokens)
            self.metrics.inflight_requests.dec()
        if rec.replica_id is not None:
            self.view.add_inflight(rec.replica_id, -rec.reserved_tokens)
        http_status = {"ok": "200", "cancelled": "499"}.get(status, "error")
        ttft = (rec.tier or "unknown", rec.ttft_s) if rec.ttft_s is not None else None
        self.metrics.request_done(rec.tenant_id, http_status, total, completion, ttft)
        log.info(
            "request %s tenant=%s alias=%s adapter=%s replica=%s route=%s tier=%s status=%s code=%s "
            "prompt=%d completion=%d ttft=%s total=%.3f",
            rec.request_id,
            rec.tenant_id,
            rec.alias,
            rec.adapter_id,
            rec.replica_id,
            rec.route,
            rec.tier,
            status,
            error_code,
            prompt,
            completion,
            f"{rec.ttft_s:.4f}" if rec.ttft_s is not None else None,
            total,
        )
        if rec.adapter_id is None:
            return
        self.publisher.publish(
            RequestCompleted(
                event_id=request_completed_id(rec.tenant_id, rec.request_id),
                request_id=rec.request_id,
                tenant_id=rec.tenant_id,
                alias=rec.alias,
                adapter_id=rec.adapter_id,
                replica_id=rec.replica_id,
                tier=rec.tier,
                status=status,
                error_code=error_code,
                prompt_tokens=prompt,
                completion_tokens=completion,
                ttft_s=rec.ttft_s,
                total_s=total,
            )
        )
