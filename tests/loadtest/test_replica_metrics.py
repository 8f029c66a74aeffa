"""Loads and evictions per minute from the replica's real Prometheus registry."""

from __future__ import annotations

from prometheus_client import generate_latest

from loadtest.replica_metrics import parse, per_minute
from replica.metrics import ReplicaMetrics


def test_loads_and_evictions_are_read_from_the_replica_metrics() -> None:
    metrics = ReplicaMetrics("smollm2")
    before = parse(generate_latest(metrics.registry).decode())
    metrics.loads.labels("ram", "gpu").inc(3)
    metrics.loads.labels("remote", "gpu").inc(1)
    metrics.loads.labels("disk", "ram").inc(2)
    metrics.evictions.labels("gpu").inc(2)
    after = parse(generate_latest(metrics.registry).decode())
    assert after["gpu_loads"] == 4 and after["ram_loads"] == 2 and after["gpu_evictions"] == 2
    rates = per_minute({"r1": before}, {"r1": after}, seconds=30)
    assert rates["r1"]["gpu_loads"] == 8.0 and rates["r1"]["gpu_evictions"] == 4.0
