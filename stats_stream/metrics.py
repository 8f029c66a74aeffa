"""Prometheus metrics of the stats stream process, and the fleet picture it computes per closed window.

Labels are bounded: tenant (hundreds at most), replica (the fleet size), tier, kind. Adapters (thousands)
are never a label; their numbers go to adapter.stats and PostgreSQL.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import Counter, Gauge, Histogram, make_wsgi_app

from stats_stream.closing import WindowReport

EVENTS = Counter(
    "lorafleet_stats_events",
    "Events seen by the stats stream, by source topic and outcome",
    ["topic", "outcome"],
)
TICKS = Counter(
    "lorafleet_stats_ticks",
    "Clock ticks the window agent has handled with the sources' backlog read (it is live once > 0)",
)
WINDOWS_CLOSED = Counter("lorafleet_stats_windows_closed", "Windows the stats stream has closed")
CLOSE_SECONDS = Histogram(
    "lorafleet_stats_window_close_seconds", "Time to close a window and write its outputs"
)
OPEN_EVENTS = Gauge("lorafleet_stats_open_window_events", "Events held in windows not yet closed")
LAST_CLOSED = Gauge("lorafleet_stats_last_closed_window_start_seconds", "Start of the newest closed window")
ALERTS = Counter("lorafleet_stats_alerts", "Alerts published", ["kind"])

TENANT_TTFT = Gauge(
    "lorafleet_tenant_ttft_seconds", "Per-tenant TTFT over the last window", ["tenant", "quantile"]
)
TENANT_COST = Gauge(
    "lorafleet_tenant_cost_usd_per_million_tokens",
    "Per-tenant cost per million tokens, last window",
    ["tenant"],
)
REPLICA_EVICTIONS = Gauge(
    "lorafleet_replica_evictions_per_minute", "Adapter evictions per minute, last window", ["replica"]
)
REPLICA_LOADS = Gauge(
    "lorafleet_replica_loads_per_minute", "Adapter loads per minute, last window", ["replica"]
)
TIER_HIT_RATE = Gauge(
    "lorafleet_fleet_tier_hit_ratio", "Share of requests whose adapter was found in each tier", ["tier"]
)
TOKENS_PER_S = Gauge("lorafleet_fleet_output_tokens_per_second", "Fleet output tokens/s, last window")
QUEUE_DEPTH = Gauge("lorafleet_fleet_queue_depth", "Sum of replicas' mean queue depth, last window")
TOKENS_IN_FLIGHT = Gauge(
    "lorafleet_fleet_tokens_in_flight", "Sum of replicas' mean tokens in flight, last window"
)
CURRENT_REPLICAS = Gauge("lorafleet_autoscale_current_replicas", "Replicas serving in the last window")
DESIRED_REPLICAS = Gauge("lorafleet_autoscale_desired_replicas", "Replicas the autoscaler wants")
HOT_ADAPTERS = Gauge("lorafleet_autoscale_hot_adapters", "Adapters that need more owners")
SLOT_DEMAND = Gauge(
    "lorafleet_autoscale_slot_demand", "Replicas the last window's active adapters need for a GPU slot each"
)


def serve(port: int, host: str = "127.0.0.1", token: str | None = None) -> None:
    """Expose /metrics on host:port (port 0: not at all), in a daemon thread; with a token, only to a
    request that presents it as a bearer token."""
    if not port:
        return
    metrics = make_wsgi_app()
    expected = f"Bearer {token}".encode() if token else None

    def guarded(environ: dict, start_response: Callable) -> Iterable[bytes]:
        given = environ.get("HTTP_AUTHORIZATION", "").encode()
        if expected is not None and not hmac.compare_digest(given, expected):
            start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"a valid metrics token is required\n"]
        return metrics(environ, start_response)

    server = make_server(host, port, guarded, ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """One thread per scrape, none left behind at exit."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Scrapes are not logged."""


def record(report: WindowReport, close_seconds: float) -> None:
    """Set the per-window gauges from a closed window."""
    WINDOWS_CLOSED.inc()
    CLOSE_SECONDS.observe(close_seconds)
    LAST_CLOSED.set(report.window_ms / 1000)
    for alert in report.alerts:
        ALERTS.labels(alert.kind).inc()
    for tenant, lat in report.latencies.items():
        TENANT_TTFT.labels(tenant, "0.5").set(lat.p50_ttft_s)
        TENANT_TTFT.labels(tenant, "0.95").set(lat.p95_ttft_s)
    for tenant, cost in report.costs.items():
        if cost.usd_per_million_tokens is not None:
            TENANT_COST.labels(tenant).set(cost.usd_per_million_tokens)
    for replica, churn in report.churn.items():
        REPLICA_EVICTIONS.labels(replica).set(churn.evictions_per_min)
        REPLICA_LOADS.labels(replica).set(churn.loads_per_min)
    for tier, share in report.tier_shares.items():
        TIER_HIT_RATE.labels(tier).set(share)
    TOKENS_PER_S.set(report.tokens_per_s)
    QUEUE_DEPTH.set(report.load.queue_depth)
    TOKENS_IN_FLIGHT.set(report.load.tokens_in_flight)
    CURRENT_REPLICAS.set(report.autoscale.current_replicas)
    DESIRED_REPLICAS.set(report.autoscale.desired_replicas)
    HOT_ADAPTERS.set(len(report.autoscale.hot_adapters))
    SLOT_DEMAND.set(report.autoscale.slot_demand)
