"""What the local stack's Prometheus scrapes: each process's /metrics at the address it listens on.

The control-plane workers, the stats stream and the public gateway listen on fixed ports (their settings'
defaults, or the port variable set in the environment; 0 turns a listener off). Replicas come and go, so
they are file_sd targets: `services up` writes its fixed replicas and the autoscaler the ones it starts,
each to its own JSON file in the targets folder, which Prometheus re-reads on change.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPLICA_JOB = "replica"
HOST = "127.0.0.1"


@dataclass(frozen=True)
class MetricsListener:
    """A stack process that serves /metrics on a port of its own settings."""

    job: str
    process: str  # its name in the stack's process table
    port_env: str
    default_port: int
    bearer: bool = False  # scraped with the service token (the gateway's per-tenant listener)


LISTENERS: tuple[MetricsListener, ...] = (
    MetricsListener("control-plane", "relay", "LORAFLEET_RELAY_METRICS_PORT", 9460),
    MetricsListener("control-plane", "registry-validator", "LORAFLEET_GATEWAY_VALIDATOR_METRICS_PORT", 9461),
    MetricsListener("control-plane", "placement-worker", "LORAFLEET_PLACEMENT_METRICS_PORT", 9462),
    MetricsListener("stats-stream", "stats-stream", "LORAFLEET_STATS_METRICS_PORT", 9466),
    MetricsListener("gateway", "public-gateway", "LORAFLEET_GATEWAY_PUBLIC_PORT", 18080),
    MetricsListener("gateway-tenants", "public-gateway", "LORAFLEET_GATEWAY_TENANT_METRICS_PORT", 0, True),
)
TOKEN_ENV = "LORAFLEET_GATEWAY_SERVICE_TOKEN"  # what the tenant listener checks

# The local stack's own listeners: the public gateway's per-tenant metrics, behind the service token (the
# public /metrics names no tenant). `services up` gives them to its processes, and Prometheus scrapes them.
LOCAL_ENV: dict[str, str] = {"LORAFLEET_GATEWAY_TENANT_METRICS_PORT": "18082"}


@dataclass(frozen=True)
class ReplicaTarget:
    """One replica's HTTP address (its /metrics is there) and the pool the KEDA queries filter on."""

    replica_id: str
    host: str
    port: int
    pool: str  # "default" for the scaled fleet, "merged" for dedicated merged replicas


def static_jobs(env: Mapping[str, str], processes: Collection[str]) -> dict[str, list[dict[str, Any]]]:
    """job -> static target groups of the listed processes, at the ports env gives them."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    for listener in LISTENERS:
        port = int(env.get(listener.port_env, listener.default_port))
        if listener.process in processes and port:
            group = {"targets": [f"{HOST}:{port}"], "labels": {"process": listener.process}}
            jobs.setdefault(listener.job, []).append(group)
    return jobs


def render(
    env: Mapping[str, str],
    processes: Collection[str],
    rules: Path,
    targets_dir: Path,
    interval_s: int,
    token_file: Path | None = None,
) -> dict[str, Any]:
    """The whole Prometheus config: the static jobs, the replicas' file_sd job and the alert rules. The
    bearer jobs read the service token from token_file; without one they are left out."""
    jobs = static_jobs(env, processes)
    bearer = {listener.job for listener in LISTENERS if listener.bearer}
    scrape: list[dict[str, Any]] = []
    for job, groups in jobs.items():
        if job not in bearer:
            scrape.append({"job_name": job, "static_configs": groups})
        elif token_file is not None:
            auth = {"type": "Bearer", "credentials_file": str(token_file)}
            scrape.append({"job_name": job, "static_configs": groups, "authorization": auth})
    replica_files = {"files": [str(targets_dir / "*.json")], "refresh_interval": f"{interval_s}s"}
    scrape.append({"job_name": REPLICA_JOB, "file_sd_configs": [replica_files]})
    interval = f"{interval_s}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rules)],
        "scrape_configs": scrape,
    }


def write_replica_targets(targets_dir: Path, name: str, replicas: list[ReplicaTarget]) -> None:
    """Replace targets_dir/name.json with these replicas, atomically, only when they changed."""
    groups = [
        {"targets": [f"{r.host}:{r.port}"], "labels": {"pool": r.pool, "replica": r.replica_id}}
        for r in sorted(replicas, key=lambda r: r.port)
    ]
    text = json.dumps(groups, indent=1)
    path = targets_dir / f"{name}.json"
    try:
        if path.read_text() == text:
            return
    except FileNotFoundError:
        targets_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")  # not *.json: Prometheus never reads a half-written file
    tmp.write_text(text)
    os.replace(tmp, path)
