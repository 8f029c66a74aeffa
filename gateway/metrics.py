"""The gateway's Prometheus metrics (names as infra/prometheus/README.md lists them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


class GatewayMetrics:
    """One set per app, in its own registry (so tests can build several apps)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "gateway_requests",
            "Chat completion requests by tenant and HTTP status (streams that fail midway count as error).",
            ["tenant", "status"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from request arrival to the first token sent to the client.",
            ["tenant", "tier"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "Whole request time.",
            ["tenant"],
            buckets=TTFT_BUCKETS + (30.0, 60.0),
            registry=self.registry,
        )
        self.output_tokens = Counter(
            "gateway_output_tokens", "Output tokens streamed.", ["tenant"], registry=self.registry
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
        self.replica_states_rejected = Counter(
            "gateway_replica_states_rejected",
            "replica.state messages ignored: their (replica_id, url) is not in replica_registrations.",
            ["reason"],
            registry=self.registry,
        )
        self.rate_limit_fallback = Gauge(
            "gateway_rate_limit_fallback",
            "1 while this gateway admits from its local share of each limit (Redis unreachable or off).",
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "gateway_rate_limited",
            "Requests refused by a tenant limit.",
            ["tenant", "limit"],
            registry=self.registry,
        )
        self.replica_failures = Counter(
            "gateway_replica_failures",
            "Replicas given up on (no first token in time, silent mid-stream, connection lost), by replica.",
            ["replica"],
            registry=self.registry,
        )
        self.streams_cut = Counter(
            "gateway_streams_cut",
            "SSE streams cut because the client stopped reading (buffer full or a send timed out).",
            registry=self.registry,
        )
