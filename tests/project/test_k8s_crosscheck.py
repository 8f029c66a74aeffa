"""infra/k8s agrees with the code: commands resolve in the CLI, variables are settings of the process that
reads them, ports are the ones the settings listen on, URLs name shipped Services, secrets come only from the
Secret, replicas drain within their grace period, and the KEDA queries read series that carry their labels."""

from __future__ import annotations

import re
import shlex
from urllib.parse import urlparse

import pytest
from pydantic import SecretStr

from replica.config import SHUTDOWN_GRACE_S, ReplicaSettings
from replica.metrics import EngineLoad, ReplicaMetrics
from schemas import principals
from tests.project.deploy_files import (
    ALL_SETTINGS,
    KAFKA_PRINCIPALS,
    LISTENERS,
    NO_KAFKA,
    PROCESS_SETTINGS,
    env_names,
    process_of,
    resolve_cli,
    settings_from,
)
from tests.project.k8s_files import (
    Container,
    Doc,
    config_map,
    containers,
    documents,
    of_kind,
    one,
    readme,
    selects,
)

SECRET_NAME = "lorafleet-secrets"
# Secrets each process cannot run without (a missing one would fall back to a single-machine default).
REQUIRED_SECRETS: dict[str, set[str]] = {
    "gateway": {
        "LORAFLEET_DATABASE_URL",
        "LORAFLEET_GATEWAY_SERVICE_TOKEN",
        "LORAFLEET_GATEWAY_REGISTRY_READ_TOKEN",
        "LORAFLEET_KAFKA_PASSWORD",
    },
    "public-gateway": {
        "LORAFLEET_DATABASE_URL",
        "LORAFLEET_REDIS_URL",
        "LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN",
        "LORAFLEET_KAFKA_PASSWORD",
    },
    "registry-validator": {
        "LORAFLEET_DATABASE_URL",
        "LORAFLEET_S3_ACCESS_KEY",
        "LORAFLEET_S3_SECRET_KEY",
        "LORAFLEET_KAFKA_PASSWORD",
    },
    "placement-worker": {"LORAFLEET_DATABASE_URL", "LORAFLEET_KAFKA_PASSWORD"},
    "relay": {"LORAFLEET_DATABASE_URL", "LORAFLEET_KAFKA_PASSWORD"},
    "stats-stream": {"LORAFLEET_DATABASE_URL", "LORAFLEET_KAFKA_PASSWORD"},
    "services init": {
        "LORAFLEET_DATABASE_URL",
        "LORAFLEET_S3_ACCESS_KEY",
        "LORAFLEET_S3_SECRET_KEY",
        "LORAFLEET_KAFKA_PASSWORD",
    },
    "replica serve": {
        "LORAFLEET_DATABASE_URL",
        "LORAFLEET_KAFKA_PASSWORD",
        "LORAFLEET_REPLICA_SERVICE_TOKEN_SHA256",
        "LORAFLEET_REPLICA_REGISTRY_TOKEN",
        "LORAFLEET_S3_ACCESS_KEY",
        "LORAFLEET_S3_SECRET_KEY",
    },
}
# The same secret on both ends of a call: (caller's variable, caller), (callee's variable, callee).
TOKEN_PAIRS = [
    (
        ("LORAFLEET_REPLICA_REGISTRY_TOKEN", "replica serve"),
        ("LORAFLEET_GATEWAY_REGISTRY_READ_TOKEN", "gateway"),
    ),
]
# The callee holds only the digest of the caller's secret, under the caller's key + "-sha256".
DIGEST_PAIRS = [
    (
        ("LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN", "public-gateway"),
        ("LORAFLEET_REPLICA_SERVICE_TOKEN_SHA256", "replica serve"),
    ),
]
# URL settings -> the process that must answer behind them.
URL_TARGETS = {
    "LORAFLEET_REPLICA_REGISTRY_URL": "gateway",
    "LORAFLEET_GATEWAY_INTERNAL_URL": "gateway",
    "LORAFLEET_GATEWAY_PUBLIC_URL": "public-gateway",
}


def app_containers() -> list[Container]:
    return list(containers(include_init=False))


def secret_settings() -> set[str]:
    """Variables whose values are secrets: SecretStr fields, tokens, keys and the database URL."""
    out = set()
    for cls in ALL_SETTINGS:
        prefix = str(cls.model_config.get("env_prefix", ""))
        for name, field in cls.model_fields.items():
            secret = field.annotation in (SecretStr, SecretStr | None)
            if secret or name.endswith(("token", "token_sha256", "secret_key", "access_key", "password")):
                out.add((prefix + name).upper())
    return out | {"LORAFLEET_DATABASE_URL", "LORAFLEET_REDIS_URL"}


def secret_ref(container: Container, variable: str) -> tuple[str, str] | None:
    entry = container.env_entries().get(variable, {})
    ref = entry.get("valueFrom", {}).get("secretKeyRef")
    return (ref["name"], ref["key"]) if ref else None


@pytest.mark.parametrize("container", list(containers()), ids=str)
def test_each_container_runs_a_command_the_cli_resolves(container: Container) -> None:
    assert container.spec["image"].startswith("lorafleet/lorafleet:"), "every process runs the one image"
    assert "command" not in container.spec, "the image's entrypoint is `lorafleet`; args pick the command"
    resolve_cli(container.argv)
    assert process_of(container.argv) in PROCESS_SETTINGS


@pytest.mark.parametrize("container", list(containers()), ids=str)
def test_each_lorafleet_variable_is_a_setting_of_its_process(container: Container) -> None:
    classes = PROCESS_SETTINGS[process_of(container.argv)]
    names = {n for n in container.env_entries() if n.startswith("LORAFLEET_")}
    assert sorted(names - env_names(classes)) == []
    env = container.settings_env()
    for cls in classes:  # the values parse as the settings' types
        settings_from(cls, env)


def test_the_config_map_holds_only_settings() -> None:
    assert sorted(set(config_map()) - env_names(ALL_SETTINGS)) == []


@pytest.mark.parametrize(
    "container", [c for c in app_containers() if process_of(c.argv) in LISTENERS], ids=str
)
def test_each_listener_exposes_the_port_its_settings_listen_on(container: Container) -> None:
    listener = LISTENERS[process_of(container.argv)]
    settings = settings_from(listener.settings, container.settings_env())
    (port,) = container.spec["ports"]
    assert port["containerPort"] == getattr(settings, listener.port)
    if listener.host:
        assert getattr(settings, listener.host) == "0.0.0.0", "a loopback listener is unreachable in a pod"


@pytest.mark.parametrize("container", app_containers(), ids=str)
def test_probes_name_ports_the_container_has(container: Container) -> None:
    names = {p["name"] for p in container.spec.get("ports", [])}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if spec := container.spec.get(probe):
            action = spec.get("httpGet") or spec.get("tcpSocket")
            assert action["port"] in names, probe


def service_backends() -> dict[str, tuple[Container, dict[int, int]]]:
    """Service name -> (a container behind it, service port -> container port). A Service selects one
    process; the replicas' headless Service selects every replica workload (the pool and merged ones), each
    on the same named port."""
    out = {}
    for svc in of_kind("Service"):
        backends = [
            c
            for c in app_containers()
            if selects({"matchLabels": svc.body["spec"]["selector"]}, c.pod_labels)
        ]
        assert len({process_of(c.argv) for c in backends}) == 1, svc.name
        maps = [{p["port"]: c.port(p["targetPort"]) for p in svc.body["spec"]["ports"]} for c in backends]
        assert all(m == maps[0] for m in maps), svc.name
        out[svc.name] = (backends[0], maps[0])
    return out


def test_each_service_selects_one_process_on_its_named_ports() -> None:
    backends = service_backends()
    assert {"gateway", "public-gateway", "lora-replica"} <= set(backends)


def test_in_cluster_urls_name_a_shipped_service_on_its_port() -> None:
    backends = service_backends()
    values = dict(config_map())
    for c in app_containers():
        values.update(c.literal_env())
    for variable, process in URL_TARGETS.items():
        url = urlparse(values[variable])
        backend, ports = backends[url.hostname or ""]
        assert process_of(backend.argv) == process, variable
        listener = LISTENERS[process]
        listen_port = getattr(settings_from(listener.settings, backend.settings_env()), listener.port)
        assert ports[url.port or 80] == listen_port, variable


def readme_secret_keys() -> set[str]:
    """The keys the README's `kubectl create secret generic lorafleet-secrets` command creates."""
    (command,) = re.findall(
        r"kubectl [^\n]*create secret generic " + SECRET_NAME + r"(?:[^\n]*\\\n)*[^\n]*", readme()
    )
    words = shlex.split(command.replace("\\\n", " "))
    return {w.split("=", 1)[1].split("=", 1)[0] for w in words if w.startswith("--from-literal=")}


def example_secret_keys() -> set[str]:
    """The keys of the example Secret shipped beside the manifests."""
    (doc,) = [d for d in of_kind("Secret") if d.file == "secret.example.yaml"]
    assert doc.name == SECRET_NAME
    return set(doc.body["stringData"])


def test_the_example_secret_and_the_readmes_command_hold_every_key_the_manifests_read() -> None:
    used = {ref[1] for c in containers() for name in c.env_entries() if (ref := secret_ref(c, name))}
    assert example_secret_keys() == readme_secret_keys() == used


def test_secret_values_come_only_from_the_secret() -> None:
    secrets = secret_settings()
    assert sorted(secrets & set(config_map())) == []
    used_keys = set()
    for c in containers():
        for name, entry in c.env_entries().items():
            if name in secrets:
                assert "value" not in entry, f"{c}: {name} is a literal"
                ref = secret_ref(c, name)
                assert ref and ref[0] == SECRET_NAME, f"{c}: {name}"
                used_keys.add(ref[1])
    assert used_keys == readme_secret_keys()


@pytest.mark.parametrize("container", app_containers(), ids=str)
def test_each_process_gets_the_secrets_it_needs(container: Container) -> None:
    needed = REQUIRED_SECRETS.get(process_of(container.argv), set())
    assert sorted(n for n in needed if secret_ref(container, n) is None) == []


@pytest.mark.parametrize(
    "container", [c for c in containers() if process_of(c.argv) not in NO_KAFKA], ids=str
)
def test_each_kafka_client_logs_in_as_its_own_principal_with_its_own_secret(container: Container) -> None:
    principal = KAFKA_PRINCIPALS[process_of(container.argv)]
    assert container.literal_env().get("LORAFLEET_KAFKA_USERNAME") == principal
    assert secret_ref(container, "LORAFLEET_KAFKA_PASSWORD") == (SECRET_NAME, f"kafka-{principal}-password")


def test_both_ends_of_each_authenticated_call_read_the_same_secret() -> None:
    def keys(variable: str, process: str) -> set[tuple[str, str] | None]:
        return {secret_ref(c, variable) for c in app_containers() if process_of(c.argv) == process}

    for (caller_var, caller), (callee_var, callee) in TOKEN_PAIRS:
        (caller_key,) = keys(caller_var, caller)
        assert keys(callee_var, callee) == {caller_key}
    for (caller_var, caller), (callee_var, callee) in DIGEST_PAIRS:
        (caller_key,) = keys(caller_var, caller)
        assert caller_key is not None
        assert keys(callee_var, callee) == {(caller_key[0], f"{caller_key[1]}-sha256")}


def test_no_replica_holds_a_token_another_replicas_routes_accept() -> None:
    for c in replicas():
        assert "LORAFLEET_REPLICA_SERVICE_TOKEN" not in c.env_entries(), c
        assert secret_ref(c, "LORAFLEET_REPLICA_SERVICE_TOKEN_SHA256") is not None, c


def replicas() -> list[Container]:
    return [c for c in app_containers() if process_of(c.argv) == "replica serve"]


@pytest.mark.parametrize("container", replicas(), ids=str)
def test_replicas_are_ready_only_when_ready_and_drain_on_sigterm_before_they_stop(
    container: Container,
) -> None:
    spec, settings = container.spec, settings_from(ReplicaSettings, container.literal_env())
    assert spec["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert spec["startupProbe"]["httpGet"]["path"] == spec["livenessProbe"]["httpGet"]["path"] == "/health"
    # The replica drains on SIGTERM (replica/main.py); a preStop drain would need the token it doesn't hold.
    assert "preStop" not in spec.get("lifecycle", {})
    # The kubelet kills at the grace period: after the drain deadline and the server's own shutdown.
    assert container.pod["terminationGracePeriodSeconds"] > settings.drain_deadline_s + SHUTDOWN_GRACE_S
    assert urlparse(settings.url()).port == settings.port
    assert (
        container.env_entries()["LORAFLEET_REPLICA_REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.name"
    )


def scaled_target() -> Doc:
    ref = scaled_object()["spec"]["scaleTargetRef"]
    return one(ref["kind"], ref["name"])


def test_the_merged_replica_template_serves_one_adapter_outside_the_scaled_pool() -> None:
    merged = [c for c in replicas() if resolve_cli(c.argv).get("merged_adapter_id")]
    assert merged
    target = scaled_target()
    pool = target.body["spec"]["template"]["metadata"]["labels"]["pool"]
    assert all(c.pod_labels["pool"] != pool for c in merged)


@pytest.mark.parametrize("container", [c for c in containers() if c.spec["name"] == "model-prepare"], ids=str)
def test_the_model_is_prepared_where_the_process_reads_it(container: Container) -> None:
    out = resolve_cli(container.argv)["out"]
    (main,) = [c for c in app_containers() if c.doc == container.doc]
    env = main.literal_env()
    if process_of(main.argv) == "replica serve":
        model_dir = settings_from(ReplicaSettings, env).model_dir
    else:
        from gateway.config import GatewaySettings

        model_dir = settings_from(GatewaySettings, env).served_model_dir
    assert model_dir == out

    def mounts(c: Container) -> dict[str, str]:
        return {m["mountPath"]: m["name"] for m in c.spec.get("volumeMounts", [])}

    shared = {p: n for p, n in mounts(container).items() if mounts(main).get(p) == n}
    assert any(out.is_relative_to(p) for p in shared)


def scaled_object() -> dict:
    (doc,) = of_kind("ScaledObject")
    return doc.body


def replica_series_labels() -> dict[str, set[str]]:
    """metric name -> its label names, from the replica's real registry."""
    metrics = ReplicaMetrics("base")
    metrics.watch_engine(4, lambda: EngineLoad(1, 1, 0.5, 10, ("a",), ("b",)))
    out: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
        out.setdefault(family.name, set())
    return out


def test_keda_queries_read_replica_series_with_the_labels_they_filter_on() -> None:
    obj = scaled_object()
    target = scaled_target()
    pod_labels = target.body["spec"]["template"]["metadata"]["labels"]
    attached: set[str] = set()
    for monitor in of_kind("PodMonitor"):
        if selects(monitor.body["spec"]["selector"], pod_labels):
            ports = {
                p["name"] for c in target.body["spec"]["template"]["spec"]["containers"] for p in c["ports"]
            }
            assert {e["port"] for e in monitor.body["spec"]["podMetricsEndpoints"]} <= ports
            attached |= set(monitor.body["spec"].get("podTargetLabels", []))
    exposed = replica_series_labels()
    for trigger in obj["spec"]["triggers"]:
        selectors = re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", trigger["metadata"]["query"])
        assert selectors, trigger["name"]
        for name, matchers in selectors:
            assert name in exposed, name
            for label, value in re.findall(r'(\w+)\s*=\s*"([^"]*)"', matchers):
                if label not in exposed[name]:
                    assert label in attached, f"{name}: nothing gives it a {label} label"
                    assert pod_labels[label] == value, (
                        f"{name}: the scaled pods have {label}={pod_labels[label]}"
                    )


def test_every_workload_document_is_in_the_lorafleet_namespace_by_kustomize() -> None:
    assert all("namespace" not in d.body["metadata"] for d in documents() if d.kind != "Namespace")
    assert {d.name for d in of_kind("Namespace")} == {"lorafleet"}


@pytest.mark.parametrize("container", replicas(), ids=str)
def test_replicas_are_statefulsets_with_a_stable_id_address_and_disk(container: Container) -> None:
    """The id is the pod's name, the address its name under a headless Service, and /data (the disk tier
    and the identity key) a volume claimed per pod: all three survive a reschedule."""
    assert container.doc.kind == "StatefulSet"
    spec = container.doc.body["spec"]
    service = one("Service", spec["serviceName"]).body["spec"]
    assert service["clusterIP"] == "None"
    assert selects({"matchLabels": service["selector"]}, container.pod_labels)
    entries = container.env_entries()
    assert entries["LORAFLEET_REPLICA_REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    settings = settings_from(ReplicaSettings, container.literal_env())
    advertised = entries["LORAFLEET_REPLICA_ADVERTISE_URL"]["value"]
    assert advertised == f"http://$(LORAFLEET_REPLICA_REPLICA_ID).{spec['serviceName']}:{settings.port}"
    claims = {c["metadata"]["name"] for c in spec["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in container.spec["volumeMounts"]}
    data_dir = str(settings.platform.data_dir)
    assert mounts.get(data_dir) in claims, "the data folder is a volume of the pod's own"
    assert settings.cache_path().is_relative_to(data_dir)
    assert all(v["name"] != mounts[data_dir] for v in container.pod.get("volumes", []))


DATABASE_PROCESSES = {
    "gateway": principals.GATEWAY,
    "public-gateway": principals.PUBLIC_GATEWAY,
    "registry-validator": principals.REGISTRY_VALIDATOR,
    "placement-worker": principals.PLACEMENT_WORKER,
    "relay": principals.RELAY,
    "stats-stream": principals.STATS_STREAM,
    "replica serve": principals.REPLICA,
}


def test_each_process_logs_in_to_the_database_as_its_own_login_which_the_init_job_makes() -> None:
    (init,) = [c for c in app_containers() if process_of(c.argv) == "services init"]
    keys: dict[str, set[str]] = {}
    for c in app_containers():
        process = process_of(c.argv)
        if process in DATABASE_PROCESSES:
            ref = secret_ref(c, "LORAFLEET_DATABASE_URL")
            assert ref is not None, str(c)
            keys.setdefault(DATABASE_PROCESSES[process], set()).add(ref[1])
    assert secret_ref(init, "LORAFLEET_DATABASE_URL") == (SECRET_NAME, "database-url")  # the owner
    for login, found in keys.items():
        (key,) = found  # one login per process, the pool and merged replicas alike
        assert key == f"database-url-{login}"
        variable = "LORAFLEET_DB_LOGIN_" + login.upper().replace("-", "_")
        assert secret_ref(init, variable) == (SECRET_NAME, key), variable
    assert len({k for found in keys.values() for k in found}) == len(keys)  # no two share a login
