"""The gateway's Prometheus metrics (names as infra/prometheus/README.md lists them).

Two registries. `registry` is served on the public listener's /metrics and carries no tenant id: anyone
who reaches the public port can read it. `tenant_registry` holds the same families per tenant, under
gateway_tenant_* names; it is served only on the tenant-metrics listener, behind the service token
(gateway/public/tenant_metrics.py). Its tenant label takes at most max_tenants distinct values: the first
tenants seen keep their own series, every later one is counted as "other".
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from lorafleet.dead_letters import dead_letter_counter

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
OTHER_TENANTS = "other"


class TenantLabels:
    """tenant_id -> its label value: itself for the first max_tenants tenants seen, else "other"."""

    def __init__(self, max_tenants: int = 50) -> None:
        self.max_tenants = max_tenants
        self._kept: set[str] = set()

    def __call__(self, tenant_id: str) -> str:
        if tenant_id in self._kept:
            return tenant_id
        if len(self._kept) < self.max_tenants:
            self._kept.add(tenant_id)
            return tenant_id
        return OTHER_TENANTS


class GatewayMetrics:
    """One set per app, in its own registries (so tests can build several apps)."""

    def __init__(self, max_tenants: int = 50) -> None:
        self.registry = CollectorRegistry()
        self.tenant_registry = CollectorRegistry()
        self.tenant_label = TenantLabels(max_tenants)
        self.requests = Counter(
            "gateway_requests",
            "Chat completion requests by HTTP status (streams that fail midway count as error).",
            ["status"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from request arrival to the first token sent to the client.",
            ["tier"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "Whole request time.",
            buckets=TTFT_BUCKETS + (30.0, 60.0),
            registry=self.registry,
        )
        self.output_tokens = Counter(
            "gateway_output_tokens", "Output tokens streamed.", registry=self.registry
        )
        self.inflight_tokens = Gauge(
            "gateway_inflight_tokens",
            "Tokens in flight (prompt + max tokens).",
            ["pool"],
            registry=self.registry,
        )
        self.inflight_requests = Gauge(
            "gateway_inflight_requests", "Requests in flight.", registry=self.registry
        )
        self.rate_limited = Counter(
            "gateway_rate_limited", "Requests refused by a tenant limit.", ["limit"], registry=self.registry
        )
        self.replica_states_rejected = Counter(
            "gateway_replica_states_rejected",
            "replica.state messages ignored: their (replica_id, url) is not in replica_registrations.",
            ["reason"],
            registry=self.registry,
        )
        self.dead_letters = dead_letter_counter(self.registry)
        self.routes = Counter(
            "gateway_routes",
            "Requests routed, by why the router chose its first replica (owner, spill, random, merged) and"
            " whether that replica served (first), a later one did (fallback) or none did (failed).",
            ["reason", "choice"],
            registry=self.registry,
        )
        self.replicas_routable = Gauge(
            "gateway_replicas_routable",
            "Replicas this gateway routes to: registered, ready, reported within the staleness bound, and not"
            " failed since their last report.",
            registry=self.registry,
        )
        self.rate_limit_fallback = Gauge(
            "gateway_rate_limit_fallback",
            "1 while this gateway admits from its local share of each limit (Redis unreachable or off).",
            registry=self.registry,
        )
        self.replica_failures = Counter(
            "gateway_replica_failures",
            "Replicas given up on (no first token in time, silent mid-stream, connection lost), by replica.",
            ["replica"],
            registry=self.registry,
        )
        self.alias_lookups = Counter(
            "gateway_alias_cache_lookups",
            "Alias resolutions by outcome: hit (cached), miss (read from PostgreSQL) or stale (the store was "
            "unreachable and an expired entry answered).",
            ["outcome"],
            registry=self.registry,
        )
        self.cache_refreshes = Counter(
            "gateway_cache_refreshes",
            "Background reads that keep a cache fresh in one statement, by cache (aliases: every alias; "
            "keys: the API keys in use) and outcome (ok, failed).",
            ["cache", "outcome"],
            registry=self.registry,
        )
        self.streams_cut = Counter(
            "gateway_streams_cut",
            "SSE streams cut because the client stopped reading (buffer full or a send timed out).",
            registry=self.registry,
        )
        self.auth_refused = Counter(
            "gateway_auth_refused",
            "Requests refused (429): their source address is past its limit of failed authentications.",
            registry=self.registry,
        )
        self.usage_spooled = Counter(
            "gateway_usage_events_spooled",
            "requests.completed events committed to the local spool.",
            registry=self.registry,
        )
        self.usage_sent = Counter(
            "gateway_usage_events_sent",
            "requests.completed events the broker acknowledged (and the spool forgot).",
            registry=self.registry,
        )
        self.usage_dropped = Counter(
            "gateway_usage_events_dropped",
            "requests.completed events lost before reaching the spool: spool_full (past "
            "LORAFLEET_GATEWAY_USAGE_SPOOL_MAX_EVENTS) or spool_error (the write failed).",
            ["reason"],
            registry=self.registry,
        )
        self.usage_waiting = Gauge(
            "gateway_usage_spool_events",
            "requests.completed events in the local spool, not yet acknowledged by Kafka.",
            registry=self.registry,
        )
        self.tenant_requests = Counter(
            "gateway_tenant_requests",
            "Chat completion requests by tenant and HTTP status.",
            ["tenant", "status"],
            registry=self.tenant_registry,
        )
        self.tenant_ttft = Histogram(
            "gateway_tenant_time_to_first_token_seconds",
            "Time to first token by tenant and tier.",
            ["tenant", "tier"],
            buckets=TTFT_BUCKETS,
            registry=self.tenant_registry,
        )
        self.tenant_output_tokens = Counter(
            "gateway_tenant_output_tokens",
            "Output tokens streamed, by tenant.",
            ["tenant"],
            registry=self.tenant_registry,
        )
        self.tenant_rate_limited = Counter(
            "gateway_tenant_rate_limited",
            "Requests refused by a tenant limit, by tenant.",
            ["tenant", "limit"],
            registry=self.tenant_registry,
        )

    def request_done(
        self, tenant_id: str, status: str, total_s: float, output_tokens: int, ttft: tuple[str, float] | None
    ) -> None:
        """Count one finished request: the public series, and the tenant's behind the token."""
        tenant = self.tenant_label(tenant_id)
        self.requests.labels(status).inc()
        self.tenant_requests.labels(tenant, status).inc()
        self.duration.observe(total_s)
        self.output_tokens.inc(output_tokens)
        self.tenant_output_tokens.labels(tenant).inc(output_tokens)
        if ttft is not None:
            tier, seconds = ttft
            self.ttft.labels(tier).observe(seconds)
            self.tenant_ttft.labels(tenant, tier).observe(seconds)

    def refused(self, tenant_id: str, limit: str) -> None:
        """Count one request a tenant limit refused (answered 429)."""
        tenant = self.tenant_label(tenant_id)
        self.rate_limited.labels(limit).inc()
        self.tenant_rate_limited.labels(tenant, limit).inc()
        self.requests.labels("429").inc()
        self.tenant_requests.labels(tenant, "429").inc()
