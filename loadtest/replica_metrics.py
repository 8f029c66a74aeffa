"""Loads and evictions per replica, from the replicas' own Prometheus /metrics before and after a rate."""

from __future__ import annotations

from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

LOADS = "lorafleet_replica_adapter_loads"  # labels from_tier, to_tier
EVICTIONS = "lorafleet_replica_adapter_evictions"  # label tier


def parse_replicas(specs: list[str]) -> dict[str, str]:
    """["replica-0=http://...", "http://..."] -> {name: url}; a bare URL is its own name."""
    out = {}
    for spec in specs:
        name, sep, url = spec.partition("=")
        out[name if sep else spec] = url if sep else spec
    return out


def parse(text: str) -> dict[str, float]:
    """{"gpu_loads": n, "gpu_evictions": n, "ram_evictions": n, ...} from one scrape."""
    out: defaultdict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            if family.name == LOADS:
                out[f"{sample.labels.get('to_tier', '')}_loads"] += sample.value
            elif family.name == EVICTIONS:
                out[f"{sample.labels.get('tier', '')}_evictions"] += sample.value
    return dict(out)


def scrape(replicas: dict[str, str], timeout_s: float = 5.0) -> dict[str, dict[str, float]]:
    """replica name -> counters; a replica that does not answer is left out."""
    out: dict[str, dict[str, float]] = {}
    for name, url in replicas.items():
        try:
            resp = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout_s)
            resp.raise_for_status()
        except httpx.HTTPError:
            continue
        out[name] = parse(resp.text)
    return out


def per_minute(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], seconds: float
) -> dict[str, dict[str, float]]:
    """replica -> counter increase per minute over the interval."""
    minutes = max(seconds, 1e-9) / 60
    return {
        name: {
            k: round((v - before.get(name, {}).get(k, 0.0)) / minutes, 3)
            for k, v in sorted(after[name].items())
        }
        for name in after
        if name in before
    }
