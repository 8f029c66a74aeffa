"""docker-compose.yml runs what `make up` runs, and agrees with the code.

No Docker engine runs here, so the file is read: checked against a closed schema of the Compose fields it
uses, then cross-checked against the stack's process table, the Makefile, the CLI, the settings classes and
the Prometheus config.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import pytest

from gateway.config import GatewaySettings
from lorafleet.config import DatabaseLoginSettings, PlatformSettings
from lorafleet.model.prepare import DEFAULT_MODEL_NAME
from lorafleet.sizing import PRODUCTION
from ops.autoscale.config import AutoscaleSettings
from ops.autoscale.local import LocalFleet
from ops.autoscale.merged_local import MergedFleet
from ops.stack import scrape
from ops.stack.env import FLEET_ENV, dev_login_url, kafka_env
from ops.stack.stack import APP_DATABASE_LOGINS, APP_PROCESSES, stack_replicas
from replica.config import ReplicaSettings
from schemas import principals
from tests.project.compose_files import (
    ANCHOR_ENV,
    Service,
    built,
    compose,
    gpu_override,
    merge,
    services,
)
from tests.project.deploy_files import (
    ALL_SETTINGS,
    KAFKA_PRINCIPALS,
    LISTENERS,
    NO_KAFKA,
    PROCESS_SETTINGS,
    env_names,
    resolve_cli,
    settings_from,
)
from tests.project.project_files import ROOT

SCHEMA = json.loads((Path(__file__).parent / "schemas/compose.json").read_text())
# The processes that serve /metrics on their listener (the internal gateway serves none).
METRICS_PROCESSES = set(LISTENERS) - {"gateway"}
URL_TARGETS = {
    "LORAFLEET_REPLICA_REGISTRY_URL": "gateway",
    "LORAFLEET_GATEWAY_INTERNAL_URL": "gateway",
    "LORAFLEET_GATEWAY_PUBLIC_URL": "public-gateway",
}


def validate(doc: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)


def test_the_compose_file_and_its_gpu_override_match_the_schema() -> None:
    validate(compose())
    validate(merge(compose(), gpu_override()))


def test_the_schema_rejects_a_misspelt_field() -> None:
    doc = compose()
    doc["services"]["relay"]["enviroment"] = {}
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def make_up_commands() -> list[list[str]]:
    """The `lorafleet` command lines of the Makefile's `up` recipe."""
    recipe = re.search(r"^up:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe
    return [shlex.split(line.split("$(LF)", 1)[1]) for line in recipe[1].splitlines() if "$(LF)" in line]


def test_every_process_the_stack_starts_is_a_service_with_the_same_command() -> None:
    svcs = services()
    for name, argv in APP_PROCESSES.items():
        assert name in svcs, name
        assert svcs[name].argv == argv, name
        assert svcs[name].spec.get("restart") == "unless-stopped", name


def test_make_ups_preparation_and_demo_are_one_shot_services_in_order() -> None:
    steps = make_up_commands()
    assert ["demo", "--prepare-only"] in steps and ["demo"] in steps
    svcs = built()
    by_command = {tuple(s.argv): s for s in svcs.values()}
    prepare, demo = by_command["demo", "--prepare-only"], by_command["demo",]
    init = by_command["services", "init"]
    assert prepare.one_shot() and demo.one_shot() and init.one_shot()
    for s in svcs.values():
        if s.name in APP_PROCESSES:
            deps = s.spec["depends_on"]
            assert (
                deps[init.name]["condition"]
                == deps[prepare.name]["condition"]
                == "service_completed_successfully"
            )
    demo_deps = demo.spec["depends_on"]
    for process in ("gateway", "public-gateway", "registry-validator", "replica serve"):
        assert any(svcs[d].process == process for d in demo_deps), process


def test_the_autoscaler_runs_as_a_service_and_its_replicas_are_reachable() -> None:
    (scaler,) = [s for s in built().values() if s.process == "autoscale"]
    assert resolve_cli(scaler.argv)["local"] is True
    replica = settings_from(ReplicaSettings, scaler.env())
    # Its replica processes listen on, and advertise, the container's name on the compose network, where
    # the autoscaler itself calls them.
    assert replica.host == scaler.name and urlparse(replica.url()).hostname == scaler.name
    assert settings_from(AutoscaleSettings, scaler.env()).host == scaler.name
    assert scaler.env()["LORAFLEET_DATA_DIR"] != compose()[ANCHOR_ENV]["LORAFLEET_DATA_DIR"]


def test_shared_variables_are_settings_and_include_the_fleet_prefixes() -> None:
    shared = {k: str(v) for k, v in compose()[ANCHOR_ENV].items()}
    assert sorted(set(shared) - env_names(ALL_SETTINGS)) == []
    assert FLEET_ENV.items() <= shared.items()


@pytest.mark.parametrize("service", list(built().values()), ids=lambda s: s.name)
def test_each_service_sets_only_settings_its_process_reads(service: Service) -> None:
    resolve_cli(service.argv)
    classes = PROCESS_SETTINGS[service.process]
    assert sorted(set(service.own_env()) - env_names(classes)) == []
    for cls in classes:
        settings_from(cls, service.env())


@pytest.mark.parametrize(
    "service", [s for s in built().values() if s.process in LISTENERS], ids=lambda s: s.name
)
def test_each_listener_binds_beyond_loopback_and_publishes_and_probes_its_port(service: Service) -> None:
    listener = LISTENERS[service.process]
    if listener.host:
        assert getattr(settings_from(listener.settings, service.env()), listener.host) == "0.0.0.0"
    port = service.listen_port()
    for mapping in service.spec.get("ports", []):
        assert int(mapping.rsplit(":", 1)[1]) == port
    if check := service.spec.get("healthcheck"):
        assert f", {port})" in check["test"][-1] or f":{port}/" in check["test"][-1]
    if service.process == "replica serve":
        advertised = urlparse(settings_from(ReplicaSettings, service.env()).url())
        assert (advertised.hostname, advertised.port) == (service.name, port)


def test_urls_in_the_environment_name_services_on_their_ports() -> None:
    svcs = services()
    shared = {k: str(v) for k, v in compose()[ANCHOR_ENV].items()}
    for variable, process in URL_TARGETS.items():
        url = urlparse(shared[variable])
        target = svcs[url.hostname or ""]
        assert target.process == process and target.listen_port() == url.port, variable


def test_depends_on_names_services_that_exist() -> None:
    svcs = services()
    for s in svcs.values():
        assert set(s.spec.get("depends_on", [])) <= set(svcs), s.name


def test_services_that_read_the_model_share_the_volume_it_is_prepared_in() -> None:
    svcs = built()
    prepare = next(s for s in svcs.values() if s.argv == ["demo", "--prepare-only"])
    # `demo --prepare-only` prepares the default model under its data folder; the services read it there.
    data_dir = settings_from(PlatformSettings, prepare.env()).data_dir
    prepared = data_dir / "models" / DEFAULT_MODEL_NAME
    assert settings_from(ReplicaSettings, prepare.env()).model_dir == prepared
    assert settings_from(GatewaySettings, prepare.env()).served_model_dir == prepared
    for s in svcs.values():
        if s.process in ("gateway", "registry-validator", "replica serve", "autoscale", "demo"):
            assert set(s.spec["volumes"]) == set(prepare.spec["volumes"]) == {"data:/data"}, s.name


def test_the_gpu_override_reserves_a_gpu_for_every_replica_and_cuda_runs_there() -> None:
    base, gpu = services(), services(merge(compose(), gpu_override()))
    runs_replicas = {n for n, s in base.items() if s.process in ("replica serve", "autoscale")}
    assert set(gpu_override()["services"]) == runs_replicas
    assert not any("deploy" in s.spec for s in base.values()), "the GPU is optional: only the override asks"
    for name in runs_replicas:
        (device,) = gpu[name].spec["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["count"] == 1 and "gpu" in device["capabilities"]
        assert settings_from(ReplicaSettings, gpu[name].env()).device == "cuda"
        # the override adds, and replaces only the local profile's sizes with the production profile's
        changed = {k for k, v in base[name].env().items() if gpu[name].env().get(k) != v}
        assert changed <= set(PRODUCTION.replica_env()), changed


def prometheus_targets(path: str) -> dict[str, list[tuple[str, int, dict]]]:
    """job -> (host, port, labels) of each static target."""
    import yaml

    config = yaml.safe_load((ROOT / "infra/prometheus" / path).read_text())
    out: dict[str, list[tuple[str, int, dict]]] = {}
    for job in config["scrape_configs"]:
        for group in job["static_configs"]:
            for target in group["targets"]:
                host, port = target.rsplit(":", 1)
                out.setdefault(job["job_name"], []).append((host, int(port), group.get("labels", {})))
    return out


def autoscaled_ports(env: dict[str, str]) -> set[int]:
    """The ports of the fleet replicas `lorafleet autoscale --local` may start: first_port + index."""
    s = settings_from(AutoscaleSettings, env)
    return {s.first_port + i for i in range(s.unmanaged_replicas, s.max_replicas)}


def merged_ports(env: dict[str, str]) -> set[int]:
    """The ports of the merged replicas it may start: merged_first_port + index."""
    s = settings_from(AutoscaleSettings, env)
    return {s.merged_first_port + i for i in range(s.merged_max_replicas)} if s.merged_enabled else set()


def test_compose_prometheus_scrapes_every_metrics_listener_by_service_name() -> None:
    svcs = services()
    targets = prometheus_targets("prometheus.compose.yml")
    scraped = {(host, port) for job in targets.values() for host, port, _ in job}
    (scaler,) = [s for s in svcs.values() if s.process == "autoscale"]
    expected = {(s.name, s.listen_port()) for s in built().values() if s.process in METRICS_PROCESSES}
    expected |= {(scaler.name, port) for port in autoscaled_ports(scaler.env()) | merged_ports(scaler.env())}
    assert scraped == expected


def test_local_prometheus_scrapes_every_metrics_listener_the_stack_starts(tmp_path: Path) -> None:
    """The generated config's static targets and the stack's replica targets are the table's listeners."""
    ports = set()
    for argv in APP_PROCESSES.values():
        process = Service("", {"command": argv}).process
        if process in METRICS_PROCESSES:
            ports.add(Service("", {"command": argv}).listen_port())
    config = scrape.render({}, list(APP_PROCESSES), tmp_path / "alerts.yml", tmp_path / "targets", 5)
    static = [
        t for job in config["scrape_configs"] for g in job.get("static_configs", []) for t in g["targets"]
    ]
    static += [f"{r.host}:{r.port}" for r in stack_replicas()]
    assert {t.rsplit(":", 1)[0] for t in static} == {"127.0.0.1"}
    assert {int(t.rsplit(":", 1)[1]) for t in static} == ports


def _pools() -> tuple[str, str]:
    """The pool the KEDA queries filter on and the merged replicas' pool label in Kubernetes."""
    import yaml

    k8s = ROOT / "infra/k8s"
    keda = yaml.safe_load((k8s / "keda-scaledobject.yaml").read_text())
    (pool,) = {
        m for t in keda["spec"]["triggers"] for m in re.findall(r'pool="([^"]*)"', t["metadata"]["query"])
    }
    merged = yaml.safe_load((k8s / "replica-merged.yaml").read_text())["spec"]["template"]["metadata"][
        "labels"
    ]
    assert merged["pool"] != pool
    return pool, merged["pool"]


def test_replica_targets_carry_the_pool_labels_the_kubernetes_pods_have() -> None:
    """Fleet replicas in the pool the KEDA queries filter on; merged ones in the merged template's pool."""
    pool, merged = _pools()
    for _, port, labels in prometheus_targets("prometheus.compose.yml")["replica"]:
        assert labels.get("pool") == (merged if port in merged_ports({}) else pool), port
    # the local stack's file_sd targets: its own replicas, the autoscaler's, its merged ones
    assert {r.pool for r in stack_replicas()} == {LocalFleet.pool} == {pool}
    assert MergedFleet.pool == merged


@pytest.mark.parametrize(
    "service", [s for s in built().values() if s.process not in NO_KAFKA], ids=lambda s: s.name
)
def test_each_kafka_client_logs_in_as_its_own_principal(service: Service) -> None:
    """The login `lorafleet services up` gives the same process: its principal and that one's password."""
    assert service.env().items() >= kafka_env(KAFKA_PRINCIPALS[service.process]).items()


def test_the_broker_has_a_scram_user_for_every_principal_with_the_password_its_clients_send() -> None:
    kafka = services()["kafka"].env()
    users = dict(u.split(":", 1) for u in kafka["KAFKA_SCRAM_USERS"].split())
    assert users == {p: kafka_env(p)["LORAFLEET_KAFKA_PASSWORD"] for p in principals.ALL}
    assert kafka["KAFKA_ADMIN_PASSWORD"] == users[principals.ADMIN]


SECURITY_KEYS = (
    "inter.broker.listener.name",
    "listener.security.protocol.map",
    "sasl.enabled.mechanisms",
    "sasl.mechanism.inter.broker.protocol",
    "sasl.mechanism.controller.protocol",
    "listener.name.controller.sasl.enabled.mechanisms",
    "authorizer.class.name",
    "super.users",
    "allow.everyone.if.no.acl.found",
)


def _properties(text: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if "=" in line and not line.startswith(("#", " "))]
    return dict(line.split("=", 1) for line in lines)


def test_the_compose_broker_has_the_local_brokers_security_settings() -> None:
    (mount,) = services()["kafka"].spec["volumes"]
    script = (ROOT / mount.split(":")[0]).read_text()
    assert services()["kafka"].spec["entrypoint"][-1] == mount.split(":")[1]
    local = _properties((ROOT / "infra/kafka/server.properties.template").read_text())
    compose_broker = _properties(script)
    assert {k: compose_broker.get(k) for k in SECURITY_KEYS} == {k: local[k] for k in SECURITY_KEYS}


def test_redis_runs_with_the_password_the_gateways_log_in_with() -> None:
    redis = services()["redis"]
    argv = redis.spec["command"]
    password = argv[argv.index("--requirepass") + 1]
    url = urlparse(str(compose()[ANCHOR_ENV]["LORAFLEET_REDIS_URL"]))
    assert (url.hostname, url.port, url.password) == ("redis", 6379, password)
    assert password in redis.spec["healthcheck"]["test"]
    (public,) = [s for s in built().values() if s.process == "public-gateway"]
    assert public.spec["depends_on"]["redis"]["condition"] == "service_healthy"
    assert settings_from(GatewaySettings, public.env()).rate_limit_store == "redis"


def test_each_process_logs_in_to_the_database_as_the_login_init_makes_for_it() -> None:
    """What `lorafleet services up` gives the same process (ops/stack/env.py), made by `services init`."""
    owner = str(compose()[ANCHOR_ENV]["LORAFLEET_DATABASE_URL"])
    (init,) = [s for s in built().values() if s.process == "services init"]
    for s in built().values():
        if s.name in APP_PROCESSES:
            process = APP_DATABASE_LOGINS.get(s.name, principals.REPLICA)
            assert s.env()["LORAFLEET_DATABASE_URL"] == dev_login_url(owner, process), s.name
            variable = "LORAFLEET_DB_LOGIN_" + process.upper().replace("-", "_")
            assert init.env()[variable] == dev_login_url(owner, process), variable
    assert settings_from(DatabaseLoginSettings, init.env()).logins().keys() == set(principals.DATABASE_LOGINS)
