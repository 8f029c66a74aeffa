"""Running deployment files natively changes only addresses, listeners and volume paths: every other value,
secrets and sizes included, is passed as the files give it."""

from __future__ import annotations

from pathlib import Path

from harness.deploy.k8s import Cluster, Doc
from harness.deploy.network import Network, listen_locally

NET = Network(
    namespace="lorafleet",
    database="throwaway_1",
    ports={("gateway", 18081): 30001, ("lora-replica-pool-default-1.lora-replica", 8100): 30002},
    backing={("kafka", 9092): ("127.0.0.1", 40001), ("postgres", 5432): ("127.0.0.1", 15432)},
)


def test_names_move_to_loopback_and_nothing_else_changes() -> None:
    own = {8100: 30003}
    volumes = {"/data": Path("/run/pod/data"), "/models": Path("/run/pod/models")}
    cases = {
        "http://gateway:18081": "http://127.0.0.1:30001",
        "http://gateway.lorafleet.svc:18081/internal": "http://127.0.0.1:30001/internal",
        "kafka.lorafleet.svc:9092": "127.0.0.1:40001",
        "http://lora-replica-pool-default-1.lora-replica:8100": "http://127.0.0.1:30002",
        "http://127.0.0.1:8100": "http://127.0.0.1:30003",  # the pod's own port (a preStop hook's URL)
        "postgresql://lf_replica:s3cr:et@postgres.lorafleet.svc:5432/lorafleet": (
            "postgresql://lf_replica:s3cr:et@127.0.0.1:15432/throwaway_1"
        ),
        "import s; s.create_connection(('127.0.0.1', 8100), 2)": "import s; s.create_connection(('127.0.0.1', 30003), 2)",
        "/models/smollm2": "/run/pod/models/smollm2",
        "/data": "/run/pod/data",
        "/database": "/database",  # not under a volume
        "http://elsewhere:18081": "http://elsewhere:18081",  # not a name the files define
        '{"16": 250, "32": 8}': '{"16": 250, "32": 8}',
        "a-secret-token": "a-secret-token",
    }
    for given, expected in cases.items():
        assert NET.rewrite(given, own, volumes) == expected, given


def test_a_listener_moves_to_its_loopback_port_and_interface() -> None:
    env = {"X_HOST": "0.0.0.0", "X_PORT": "8100", "Y_PORT": "9999", "Z_GATEWAYS": "8100", "W_HOST": "db"}
    assert listen_locally(env, {8100: 30003}) == {
        "X_HOST": "127.0.0.1",
        "X_PORT": "30003",
        "Y_PORT": "9999",
        "Z_GATEWAYS": "8100",
        "W_HOST": "db",
    }


def test_a_container_env_is_built_as_the_kubelet_builds_it(tmp_path: Path) -> None:
    workload = Doc(
        "x.yaml",
        {
            "kind": "StatefulSet",
            "metadata": {"name": "pool"},
            "spec": {
                "template": {
                    "metadata": {"labels": {"app": "r"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "replica",
                                "args": ["replica", "serve"],
                                "ports": [{"name": "http", "containerPort": 8100}],
                                "envFrom": [{"configMapRef": {"name": "cfg"}}],
                                "env": [
                                    {"name": "ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                    {"name": "URL", "value": "http://$(ID).svc-r:8100"},
                                    {
                                        "name": "TOKEN",
                                        "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}},
                                    },
                                    {"name": "SHARED", "value": "mine"},
                                ],
                            }
                        ]
                    },
                }
            },
        },
    )
    config = Doc(
        "c.yaml", {"kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"SHARED": "map", "A": "1"}}
    )
    service = Doc(
        "s.yaml",
        {
            "kind": "Service",
            "metadata": {"name": "svc-r"},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "r"},
                "ports": [{"port": 8100, "targetPort": "http"}],
            },
        },
    )
    cluster = Cluster([workload, config, service], {"t": "the-secret"}, Network(), tmp_path)
    pod = cluster.pod("pool", 1)
    env = cluster.env(pod, pod.container())
    loopback = pod.ports[8100]
    assert env == {
        "SHARED": "mine",  # an env entry wins over envFrom
        "A": "1",
        "ID": "pool-1",
        "URL": f"http://127.0.0.1:{loopback}",  # $(ID) expanded, then the pod's name moved to loopback
        "TOKEN": "the-secret",
    }
