"""Every label the dashboard's and the rules' queries filter or group on is one their metrics carry.

Label names come from the metric objects the processes register (the stream's default registry, a
replica's and a gateway's own registries, the control plane's), plus the labels Prometheus attaches to
every target (job, instance) and those the local and compose configs add (pool, replica, process).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY, CollectorRegistry

import lorafleet.metrics  # noqa: F401 - registers the control plane's metrics
import stats_stream.metrics  # noqa: F401 - registers the stream's metrics
from gateway.public.metrics import GatewayMetrics
from replica.metrics import EngineLoad, ReplicaMetrics

INFRA = Path(__file__).resolve().parents[2] / "infra"
TARGET_LABELS = {"job", "instance", "pool", "replica", "process"}
METRIC = r"(?:vllm:[a-z_]+|lorafleet_[a-z_]+|gateway_[a-z_]+)"
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def _labels_by_name() -> dict[str, set[str]]:
    replica = ReplicaMetrics("base")
    replica.watch_engine(4, lambda: EngineLoad(0, 0, 0.0, 0, (), ()))
    gateway = GatewayMetrics()  # the public families and the per-tenant ones behind the token
    registries: list[CollectorRegistry] = [
        REGISTRY,
        replica.registry,
        gateway.registry,
        gateway.tenant_registry,
    ]
    out: dict[str, set[str]] = {}
    for registry in registries:
        for family in registry.collect():  # custom collectors (the replica's engine gauges) carry samples
            out.setdefault(family.name, set())
            for sample in family.samples:
                out.setdefault(sample.name, set()).update(sample.labels)
        for name, collector in registry._names_to_collectors.items():  # noqa: SLF001 - no public view
            labels = set(getattr(collector, "_labelnames", ()))
            if name.endswith("_bucket"):
                labels.add("le")
            out.setdefault(name, set()).update(labels)
    return out


def _queries() -> list[str]:
    dash = json.loads((INFRA / "grafana/lorafleet.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    rules = yaml.safe_load((INFRA / "prometheus/alerts.yml").read_text())
    return exprs + [r["expr"] for g in rules["groups"] for r in g["rules"]]


def _used(expr: str) -> tuple[set[str], set[str]]:
    """The metric names an expression reads and the labels it matches or groups on."""
    names = set(re.findall(rf"\b{METRIC}", expr))
    labels = set(re.findall(r"([a-z_]+)\s*(?:=~|!=|!~|=)\s*\"", expr))
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels |= {part.strip() for part in group.split(",") if part.strip()}
    return names, labels


def test_every_query_label_is_carried_by_a_metric_it_reads() -> None:
    carried = _labels_by_name()
    checked = 0
    for expr in _queries():
        names, labels = _used(expr)
        have = set(TARGET_LABELS)
        for name in names:
            assert name in carried, f"{name} in {expr!r} is registered by no process"
            have |= carried[name]
        assert labels <= have, f"{expr!r} uses {sorted(labels - have)}, its metrics carry {sorted(have)}"
        checked += bool(labels - TARGET_LABELS)
    assert checked >= 4  # tier, quantile, outcome, le are read somewhere


def test_the_label_extraction_sees_matchers_and_groupings() -> None:
    names, labels = _used('sum by (le, tier) (rate(gateway_x_bucket{tenant="a"}[5m]))')
    assert names == {"gateway_x_bucket"} and labels == {"le", "tier", "tenant"}
