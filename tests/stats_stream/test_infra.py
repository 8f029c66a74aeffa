"""The Prometheus rules, Grafana dashboard and KEDA object read the names and numbers the stream has."""

import json
import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY

import stats_stream.metrics  # noqa: F401 - registers the stream's metrics
from gateway.public.metrics import GatewayMetrics
from replica.metrics import EngineLoad, ReplicaMetrics
from stats_stream.config import StatsStreamSettings

INFRA = Path(__file__).resolve().parents[2] / "infra"
STREAM_PREFIXES = ("lorafleet_stats_", "lorafleet_tenant_", "lorafleet_fleet_", "lorafleet_autoscale_")


def _stream_names_in(text: str) -> set[str]:
    names = set(re.findall(r"\blorafleet_[a-z_]+", text))
    return {n for n in names if n.startswith(STREAM_PREFIXES) or n.endswith("_per_minute")}


def _exposed() -> set[str]:
    out: set[str] = set()
    for family in REGISTRY.collect():  # labelled metrics have no samples until first set
        out |= {family.name + suffix for suffix in ("", "_total", "_bucket", "_count", "_sum")}
    return out


def test_every_stream_metric_the_rules_and_dashboard_use_is_exposed() -> None:
    used = _stream_names_in((INFRA / "prometheus/alerts.yml").read_text())
    used |= _stream_names_in((INFRA / "grafana/lorafleet.json").read_text())
    assert used, "the rules and dashboard read some stream metric"
    assert used <= _exposed(), used - _exposed()


def _process_names_in(text: str) -> set[str]:
    """Names the replicas and the gateway own: vllm:*, lorafleet_replica_* (not the stream's), gateway_*."""
    names = set(re.findall(r"\b(?:vllm:[a-z_]+|lorafleet_replica_[a-z_]+|gateway_[a-z_]+)", text))
    return {n for n in names if not n.endswith("_per_minute")}


def _process_exposed() -> set[str]:
    replica = ReplicaMetrics("base")
    replica.watch_engine(4, lambda: EngineLoad(0, 0, 0.0, 0, (), ()))
    out: set[str] = set()
    gateway = GatewayMetrics()
    for registry in (replica.registry, gateway.registry, gateway.tenant_registry):
        for family in registry.collect():
            out |= {family.name + suffix for suffix in ("", "_total", "_bucket", "_count", "_sum")}
    return out


def test_every_replica_and_gateway_metric_the_infra_reads_is_exposed() -> None:
    used: set[str] = set()
    for f in ("prometheus/alerts.yml", "grafana/lorafleet.json", "k8s/keda-scaledobject.yaml"):
        used |= _process_names_in((INFRA / f).read_text())
    assert {"vllm:num_requests_waiting", "lorafleet_replica_tokens_in_flight"} <= used
    assert used <= _process_exposed(), used - _process_exposed()


def test_the_metrics_readme_lists_only_exposed_replica_and_gateway_names() -> None:
    listed = _process_names_in((INFRA / "prometheus/README.md").read_text())
    assert listed <= _process_exposed(), listed - _process_exposed()


def test_alert_rules_have_the_documented_shape() -> None:
    rules = [
        r for g in yaml.safe_load((INFRA / "prometheus/alerts.yml").read_text())["groups"] for r in g["rules"]
    ]
    names = {r["alert"] for r in rules}
    assert {"TenantTTFTOverTarget", "ReplicaThrashing", "GPUHitRateLow"} <= names
    assert all(r["expr"] and r["annotations"]["summary"] for r in rules)


def test_the_dashboard_is_valid_json_with_unique_panel_ids() -> None:
    dash = json.loads((INFRA / "grafana/lorafleet.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 8


def test_keda_thresholds_match_the_stream_autoscaler_defaults() -> None:
    obj = yaml.safe_load((INFRA / "k8s/keda-scaledobject.yaml").read_text())
    triggers = {t["name"]: t for t in obj["spec"]["triggers"]}
    defaults = StatsStreamSettings()
    assert float(triggers["queue-depth"]["metadata"]["threshold"]) == defaults.queue_per_replica
    assert (
        float(triggers["tokens-in-flight"]["metadata"]["threshold"]) == defaults.tokens_in_flight_per_replica
    )
    assert all(t["metricType"] == "AverageValue" for t in triggers.values())
    assert obj["spec"]["minReplicaCount"] == defaults.min_replicas
    assert obj["spec"]["maxReplicaCount"] == defaults.max_replicas
