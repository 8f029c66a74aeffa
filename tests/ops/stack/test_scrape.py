"""The local Prometheus config: each listener at the port its process uses, replicas from file_sd files."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.config import GatewaySettings
from lorafleet.config import RelaySettings
from ops.stack.scrape import (
    LISTENERS,
    LOCAL_ENV,
    ReplicaTarget,
    render,
    static_jobs,
    write_replica_targets,
)
from placement_worker.config import PlacementSettings
from stats_stream.config import StatsStreamSettings

DEFAULT_PORTS = {
    "relay": RelaySettings().metrics_port,
    "registry-validator": GatewaySettings().validator_metrics_port,
    "placement-worker": PlacementSettings().metrics_port,
    "stats-stream": StatsStreamSettings().metrics_port,
    "public-gateway": GatewaySettings().public_port,
}


def test_each_listener_defaults_to_its_process_settings_port() -> None:
    plain = {listener.process: listener.default_port for listener in LISTENERS if not listener.bearer}
    assert plain == DEFAULT_PORTS
    (tenants,) = [listener for listener in LISTENERS if listener.bearer]
    assert (tenants.process, tenants.default_port) == (
        "public-gateway",
        GatewaySettings().tenant_metrics_port,
    )
    assert LOCAL_ENV[tenants.port_env] != "0"  # off by default, on in the local stack


def test_the_tenant_listener_is_scraped_with_the_token_file_and_left_out_without_one(tmp_path: Path) -> None:
    env = {**LOCAL_ENV}
    token = tmp_path / "token"
    jobs = {
        j["job_name"]: j
        for j in render(env, ["public-gateway"], tmp_path / "a.yml", tmp_path, 5, token)["scrape_configs"]
    }
    assert jobs["gateway-tenants"]["authorization"] == {"type": "Bearer", "credentials_file": str(token)}
    assert jobs["gateway-tenants"]["static_configs"][0]["targets"] == ["127.0.0.1:18082"]
    assert "authorization" not in jobs["gateway"]
    without = render(env, ["public-gateway"], tmp_path / "a.yml", tmp_path, 5)["scrape_configs"]
    assert "gateway-tenants" not in {j["job_name"] for j in without}


def test_the_environment_moves_a_listener_and_port_zero_or_a_missing_process_drops_it() -> None:
    jobs = static_jobs(
        {"LORAFLEET_RELAY_METRICS_PORT": "29460", "LORAFLEET_STATS_METRICS_PORT": "0"}, ["relay"]
    )
    assert jobs == {"control-plane": [{"targets": ["127.0.0.1:29460"], "labels": {"process": "relay"}}]}


def test_the_config_loads_the_rules_and_reads_replica_targets_from_the_folder(tmp_path: Path) -> None:
    config = render({}, list(DEFAULT_PORTS), tmp_path / "alerts.yml", tmp_path / "t", 5)
    assert config["rule_files"] == [str(tmp_path / "alerts.yml")]
    (replica,) = [job for job in config["scrape_configs"] if "file_sd_configs" in job]
    assert replica["file_sd_configs"][0]["files"] == [str(tmp_path / "t" / "*.json")]


def test_replica_targets_are_rewritten_only_when_they_change(tmp_path: Path) -> None:
    folder = tmp_path / "targets"
    replicas = [
        ReplicaTarget("replica-3", "127.0.0.1", 18103, "default"),
        ReplicaTarget("replica-2", "h", 1, "merged"),
    ]
    write_replica_targets(folder, "autoscaler", replicas)
    path = folder / "autoscaler.json"
    groups = json.loads(path.read_text())
    assert groups[0] == {"targets": ["h:1"], "labels": {"pool": "merged", "replica": "replica-2"}}
    assert groups[1]["targets"] == ["127.0.0.1:18103"]
    before = path.stat().st_mtime_ns
    write_replica_targets(folder, "autoscaler", list(reversed(replicas)))
    assert path.stat().st_mtime_ns == before
    write_replica_targets(folder, "autoscaler", [])
    assert json.loads(path.read_text()) == [] and sorted(p.name for p in folder.iterdir()) == [
        "autoscaler.json"
    ]
