"""Prometheus, started by the code `services up` uses, scrapes every process of a real small stack: each
target is up (the autoscaler's replica too, through its file_sd targets), the alert rules are loaded, and
every metric name the dashboard, the rules and the KEDA object read is one the processes export.

The stack is harness/stacks/scaleup.py's (replica 0, the public gateway, the relay, the placement worker, the
stats stream, the autoscaler, which starts replica 1 at once) plus the registry validator, every metrics
listener on a free port, the replicas on the local profile.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from harness.ports import free_port
from harness.spec import ProcessSpec, app_args
from harness.stacks.scaleup import ScaleupConfig, scaleup_stack
from lorafleet.profile import DEV_TOKEN
from ops.stack import prometheus
from ops.stack.profile import LOCAL_REPLICA_ENV
from ops.stack.scrape import LISTENERS, REPLICA_JOB, ReplicaTarget, write_replica_targets
from ops.stack.stack import APP_PROCESSES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INFRA = Path(__file__).resolve().parents[2] / "infra"
QUERY_FILES = ("grafana/lorafleet.json", "prometheus/alerts.yml", "k8s/keda-scaledobject.yaml")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created")}


def test_the_rules_pass_promtool() -> None:
    result = subprocess.run(
        ["promtool", "check", "rules", str(INFRA / "prometheus/alerts.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_metrics_listener_is_a_process_of_the_stack() -> None:
    assert {listener.process for listener in LISTENERS} <= set(APP_PROCESSES)


def names_used() -> set[str]:
    text = "\n".join((INFRA / f).read_text() for f in QUERY_FILES)
    return set(re.findall(r"\b(?:vllm:[a-z_]+|lorafleet_[a-z_]+|gateway_[a-z_]+)", text))


def exported(exposition: str) -> set[str]:
    """Every sample name a text exposition can carry: each family's name and its type's suffixes."""
    out = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.M):
        out |= {name, *(name + suffix for suffix in SUFFIXES.get(kind, ()))}
    return out


async def _targets(client: httpx.AsyncClient, url: str) -> list[dict]:
    resp = await client.get(f"{url}/api/v1/targets", params={"state": "active"}, timeout=5)
    return resp.json()["data"]["activeTargets"]


async def test_prometheus_scrapes_every_process_of_a_real_stack(services, tmp_path: Path) -> None:
    assert shutil.which("prometheus"), "Debian's prometheus package (make deps installs it)"
    run = uuid.uuid4().hex[:6]
    ports = {
        listener.port_env: str(free_port())
        for listener in LISTENERS
        if "GATEWAY_PUBLIC" not in listener.port_env
    }
    env = {**LOCAL_REPLICA_ENV, **ports, "LORAFLEET_GATEWAY_VALIDATOR_GROUP": f"registry-validator-{run}"}
    cfg = ScaleupConfig(unmanaged=1, max_replicas=2, stats_min_replicas=2, cooldown_s=2.0, env=env)
    async with scaleup_stack(services.settings(), tmp_path, cfg) as stack:
        stack.add(ProcessSpec("registry-validator", app_args("registry-validator"), log="v")).start()
        stack.autoscaler().start()
        platform = stack.platform.model_copy(update={"prometheus_port": free_port()})
        # what `services up` writes for the replicas of its process table: here the stack's replica 0
        zero = ReplicaTarget(stack.replica_id(0), "127.0.0.1", stack.first_port, "default")
        write_replica_targets(prometheus.targets_dir(platform), "stack", [zero])
        processes = ["relay", "registry-validator", "placement-worker", "stats-stream", "public-gateway"]
        assert await asyncio.to_thread(prometheus.up, platform, 60.0, stack.env, processes) == "started"
        url = prometheus.address(platform)
        try:
            config = prometheus.config_file(platform)
            check = subprocess.run(
                ["promtool", "check", "config", str(config)], capture_output=True, text=True
            )
            assert check.returncode == 0, check.stdout + check.stderr
            # every listener of the listed processes (the gateway's tenant listener too, behind the token)
            static = sum(1 for listener in LISTENERS if listener.process in processes)
            async with httpx.AsyncClient() as client:
                deadline = asyncio.get_running_loop().time() + 300
                while True:
                    targets = await _targets(client, url)
                    replicas = [t for t in targets if t["labels"]["job"] == REPLICA_JOB]
                    if len(targets) == static + 2 and all(t["health"] == "up" for t in targets):
                        break
                    if asyncio.get_running_loop().time() > deadline:
                        raise AssertionError(f"targets: {targets}\n{stack.tails()}")
                    await asyncio.sleep(1)
                assert {t["labels"]["replica"] for t in replicas} == {
                    stack.replica_id(0),
                    stack.replica_id(1),
                }
                assert {t["labels"]["pool"] for t in replicas} == {"default"}
                rules = (await client.get(f"{url}/api/v1/rules", timeout=5)).json()["data"]["groups"]
                loaded = {r["name"] for g in rules for r in g["rules"]}
                assert {"TenantTTFTOverTarget", "ReplicaThrashing", "GPUHitRateLow"} <= loaded
                names: set[str] = set()
                token = stack.env.get("LORAFLEET_GATEWAY_SERVICE_TOKEN", DEV_TOKEN)
                for t in targets:
                    bearer = t["labels"]["job"] == "gateway-tenants"
                    headers = {"Authorization": f"Bearer {token}"} if bearer else {}
                    resp = await client.get(t["scrapeUrl"], headers=headers, timeout=10)
                    assert resp.status_code == 200, (t["scrapeUrl"], resp.status_code)
                    names |= exported(resp.text)
                assert "gateway-tenants" in {t["labels"]["job"] for t in targets}
            used = names_used()
            assert {"vllm:num_requests_waiting", "gateway_time_to_first_token_seconds_bucket"} <= used
            assert used <= names, sorted(used - names)
        finally:
            prometheus.down(platform)
