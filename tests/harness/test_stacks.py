"""The gateway and scale-up stacks as specs: which processes in which order, the environment each gets,
and seeds that insert cleanly; nothing is started."""

from __future__ import annotations

from pathlib import Path

from harness.env import stack_env
from harness.spec import CheckReady, HttpReady
from harness.stacks.gateway import ADMIN_TOKEN, TOKEN, gateway_spec
from harness.stacks.scaleup import ScaleupConfig, scaleup_spec
from lorafleet.config import PlatformSettings


def test_the_gateway_stack_starts_its_replicas_then_the_gateway_routing_to_their_prefix() -> None:
    spec = gateway_spec(
        Path("/adapters"), "h" * 64, ("gwtx-a", "gwtx-b"), {"LORAFLEET_REPLICA_MAX_NUM_SEQS": "2"}
    )
    *replicas, gateway = spec.processes
    assert [r.name for r in replicas] == ["gwtx-a", "gwtx-b"] and gateway.name == "public-gateway"
    assert all(r.ready == (HttpReady(f"{r.url}/health", 120),) for r in replicas)
    assert gateway.ready == (HttpReady(f"{gateway.url}/health", 60), HttpReady(f"{gateway.url}/ready", 30))
    assert gateway.env == {"LORAFLEET_GATEWAY_PUBLIC_PORT": str(gateway.port)}
    env = stack_env(spec, PlatformSettings())
    assert (
        env["LORAFLEET_GATEWAY_REPLICA_ID_PREFIX"] == "gwtx-"
        and env["LORAFLEET_REPLICA_SERVICE_TOKEN"] == TOKEN
    )
    assert env["LORAFLEET_GATEWAY_SERVICE_TOKEN"] == ADMIN_TOKEN
    assert env["LORAFLEET_REPLICA_MAX_NUM_SEQS"] == "2"  # the caller's settings win
    assert env["LORAFLEET_DATABASE_URL"].endswith(f"/{spec.database}")
    assert "LORAFLEET_GATEWAY_PUBLIC_PORT" not in env


def test_the_gateway_stacks_seed_is_sound_and_gives_a_v2_adapter_version_two() -> None:
    seed = gateway_spec(Path("/adapters"), "h").seed
    assert seed.problems() == []
    assert {a.adapter_id: a.version for a in seed.adapters} == {
        "acme-support-v1": 1,
        "acme-support-v2": 2,
        "globex-sales-v1": 1,
    }


def test_by_default_each_gateway_stack_gets_replica_ids_of_its_own() -> None:
    one, two = gateway_spec(Path("/a"), "h"), gateway_spec(Path("/a"), "h")
    assert one.prefix.startswith("gwt") and one.prefix != two.prefix and one.database != two.database
    assert all(p.name.startswith(one.prefix) for p in one.processes[:2])


def test_the_scaleup_stack_puts_replica_zero_on_the_first_port_and_the_rest_after_the_replicas() -> None:
    cfg = ScaleupConfig(max_replicas=3, env={"LORAFLEET_STATS_WINDOW_S": "9"}, run="r1")
    spec = scaleup_spec(cfg, "r1", Path("/w"), Path("/m"), "h", 30_000)
    assert [p.name for p in spec.processes] == [
        "replica-0",
        "stats-stream",
        "relay",
        "placement-worker",
        "gateway",
    ]
    replica = spec.processes[0]
    assert replica.args[-4:] == ("--replica-id", "asr1-0", "--port", "30000")
    assert [type(p) for p in replica.ready] == [CheckReady]
    env = stack_env(spec, PlatformSettings())
    assert env["LORAFLEET_GATEWAY_PUBLIC_PORT"] == "30004"  # after replicas 0-2 and one spare port
    assert env["LORAFLEET_AUTOSCALE_FIRST_PORT"] == "30000" and env["LORAFLEET_DATA_DIR"] == "/w/data"
    assert env["LORAFLEET_STATS_WINDOW_S"] == "9" and env["LORAFLEET_STATS_REPLICA_ID_PREFIX"] == "asr1-"
    assert spec.processes[-1].ready == (HttpReady("http://127.0.0.1:30004/ready", 60),)
    assert spec.database == "scale_r1" and spec.seed.problems() == []
    assert [t.tenant_id for t in spec.seed.tenants] == ["acme"]


def test_a_scaleup_stack_without_a_gateway_starts_none() -> None:
    spec = scaleup_spec(ScaleupConfig(gateway=False), "r2", Path("/w"), Path("/m"), "h", 30_000)
    assert "gateway" not in [p.name for p in spec.processes]
