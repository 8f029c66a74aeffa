"""Prometheus metrics shared by the control-plane processes (relay, registry validator, placement worker).

The replica, the gateway and the stats stream expose their own families; these count what every
event-driven worker does: events handled per topic and outcome, and the outbox's progress.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge, start_http_server

log = logging.getLogger(__name__)

EVENTS_HANDLED = Counter(
    "lorafleet_events_handled_total",
    "Kafka records a worker handled, by process, topic and outcome "
    "(handled, invalid, rejected: a replica.state not signed by its registered replica).",
    ["process", "topic", "outcome"],
)
OUTBOX_PUBLISHED = Counter("lorafleet_outbox_published_total", "Outbox rows published to Kafka.")
OUTBOX_DEAD_LETTERED = Counter(
    "lorafleet_outbox_dead_lettered_total", "Outbox rows that failed validation and were never published."
)
OUTBOX_UNSENT = Gauge("lorafleet_outbox_unsent", "Outbox rows committed but not yet published (relay lag).")
REGISTRY_CHECKS_DEFERRED = Counter(
    "lorafleet_registry_checks_deferred_total",
    "Registration checks the object store failed; the version stays pending and is checked again later.",
)
REGISTRY_CHECKS_REQUESTED = Counter(
    "lorafleet_registry_checks_requested_total",
    "adapters.registered events the reconciler published again for a pending version whose check was due.",
)
REGISTRY_PENDING = Gauge(
    "lorafleet_registry_pending_versions",
    "Adapter versions still pending, by whether a check failed on them (retrying) or not yet (waiting).",
    ["state"],
)
REGISTRY_OLDEST_PENDING = Gauge(
    "lorafleet_registry_oldest_pending_seconds", "Age of the oldest pending adapter version (0 when none)."
)


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Expose /metrics on host:port in a background thread; port 0 disables it."""
    if port:
        start_http_server(port, addr=host)
        log.info("metrics on http://%s:%d/metrics", host, port)
