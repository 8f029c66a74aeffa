"""infra/k8s runs as written: every workload `kubectl apply -k` creates is started natively with exactly the
command, arguments and environment its manifest gives it, its Secret the example shipped beside the
manifests (infra/k8s/secret.example.yaml), its probes, preStop hook and termination grace as the kubelet
runs them. Then a registration, an alias move, chats through the public gateway, a second replica joining
and a drain (the replica drains on the SIGTERM of its scale-down).

What running pods natively on one machine changes (harness/deploy/network.py): each pod's ports and every
name for it move to loopback, a volume is a folder, and the backing services are the ones this test runs:
a Kafka broker of its own whose SCRAM users are the Secret's, the local PostgreSQL (a throwaway database,
named where the files name `lorafleet`), an S3 store and a Redis of its own on the Secret's keys and
password. The example Secret's values are filled in: each <secret> (the object store's keys included) a
random value of this run's own, each <sha256 of KEY> the hex digest of KEY's value, the database owner
that of the local PostgreSQL, and each process's database login named with this run's id (PostgreSQL roles
belong to the whole cluster, which other runs share).

Kafka's replication factor and min.insync.replicas (3 and 2 in the ConfigMap) are 1 for the processes that
create topics (the init Job and the stats stream): the run's broker is one broker.

Sizes the test overrides, for the replica only, because the manifest's are a GPU's and this is a CPU
(nothing here is a credential, an address or a setting whose absence the run would catch):
LORAFLEET_REPLICA_DEVICE and _DTYPE (the hardware), and _LORA_SLOTS and _KV_CACHE_BYTES (memory only: the
production profile's 262 slots and 2 GiB of KV would take several GB per replica on this machine).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import asyncpg
import httpx
import pytest
import yaml

from harness.databases import drop_roles, throwaway_database
from harness.deploy import run
from harness.deploy.k8s import Cluster, Pod, applied_documents, secret_data, seed_from_cache
from harness.deploy.network import LOOPBACK, Network, backing_services
from harness.env import QUIET_ENV
from harness.ports import free_port
from harness.processes import stop
from harness.running import Running
from lorafleet.config import PlatformSettings
from lorafleet.model.base_hash import base_model_hash
from lorafleet.model.prepare import ensure_default_model
from ops.stack import kafka, objectstore
from schemas import principals
from tests.integration import deployment_scenario as scenario
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

K8S = Path(__file__).resolve().parents[2] / "infra" / "k8s"
PLACEHOLDER = re.compile(r"<([^>]+)>")
DIGEST_OF = re.compile(r"sha256 of (\S+)")
REPLICAS = "lora-replica-pool-default"
ONE_BROKER = {"LORAFLEET_KAFKA_REPLICATION_FACTOR": "1", "LORAFLEET_KAFKA_MIN_INSYNC_REPLICAS": "1"}
# the test's overrides for the replica: the hardware and two sizes that only matter for memory (see above)
REPLICA_SIZES = {
    "LORAFLEET_REPLICA_DEVICE": "cpu",
    "LORAFLEET_REPLICA_DTYPE": "float32",
    "LORAFLEET_REPLICA_LORA_SLOTS": json.dumps({"16": 4, "32": 1, "64": 1}),
    "LORAFLEET_REPLICA_KV_CACHE_BYTES": str(256 << 20),
}


def filled_secret(run_id: str, owner_url: str) -> dict[str, str]:
    """The example Secret with each <...> filled in for this run (the module docstring says how)."""
    (doc,) = [d for d in yaml.safe_load_all((K8S / "secret.example.yaml").read_text()) if d]
    owner = urlparse(owner_url)
    known = {
        "owner": owner.username or "",
        "owner-password": owner.password or "",
    }
    out: dict[str, str] = {}

    def fill(placeholder: re.Match[str]) -> str:
        digest_of = DIGEST_OF.fullmatch(placeholder[1])
        if digest_of is not None:
            return hashlib.sha256(out[digest_of[1]].encode()).hexdigest()
        return known.get(placeholder[1]) or secrets.token_urlsafe(24)

    for key, value in secret_data(doc).items():
        filled = PLACEHOLDER.sub(fill, value)
        if key.startswith("database-url-"):  # a login of this run's own: roles are the cluster's
            url = urlparse(filled)
            filled = url._replace(
                netloc=f"{url.username}_{run_id}:{url.password}@{url.hostname}:{url.port}"
            ).geturl()
        out[key] = filled
    return out


@dataclass
class Deployment:
    cluster: Cluster
    secret: dict[str, str]
    owner_url: str  # the throwaway database, as its owner
    work: Path
    running: dict[str, Running] = field(default_factory=dict)  # pod name -> its main container

    def url(self, service: str, port: int) -> str:
        return f"http://{LOOPBACK}:{self.cluster.network.ports[(service, port)]}"

    async def start_pod(self, workload: str, ordinal: int = 0) -> Pod:
        """A pod as the kubelet runs it: init containers to completion, then its container until ready."""
        pod = self.cluster.pod(workload, ordinal)
        for init in self.cluster.init_commands(pod):
            if init.args[:2] == ("model", "prepare"):  # the node's image cache holds the prepared base
                out = Path(init.args[init.args.index("--out") + 1])
                seed_from_cache(out, ensure_default_model())
            await run.run_to_end(init, self.work, 300)
        self.running[pod.name] = await run.start(self.cluster.spec(pod), self.work)
        return pod

    async def stop_pod(self, pod: Pod) -> None:
        """A scale-down: the preStop hook (if any) to its end, then SIGTERM, and SIGKILL at the end of the
        termination grace period."""
        grace = float(pod.spec.get("terminationGracePeriodSeconds", 30))
        started = time.monotonic()
        hook = self.cluster.pre_stop(pod)
        if hook is not None:
            await run.run_to_end(hook, self.work, grace)
        left = max(1.0, grace - (time.monotonic() - started))
        await asyncio.to_thread(self.running.pop(pod.name).stop, left)

    def tails(self) -> str:
        return "\n".join(f"--- {name}\n{p.tail(2000)}" for name, p in self.running.items())


@pytest.fixture(scope="module")
async def deployment(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:
    run_id = uuid.uuid4().hex[:8]
    work = tmp_path_factory.mktemp("k8s-run")
    secret = filled_secret(run_id, services.database_url)
    # Kafka: a broker of this run's own, its SCRAM users the Secret's
    users = {p: secret[f"kafka-{p}-password"] for p in principals.ALL if f"kafka-{p}-password" in secret}
    broker = PlatformSettings(
        data_dir=work / "kafka",
        kafka_bootstrap=f"{LOOPBACK}:{free_port()}",
        kafka_controller_port=free_port(),
    )
    with ThreadPoolExecutor(1) as pool:
        pool.submit(kafka.up, broker, 240.0, users).result()
    # The object store: one of this run's own, on the Secret's keys
    store = PlatformSettings(
        data_dir=work / "objectstore",
        s3_endpoint=f"http://{LOOPBACK}:{free_port()}",
        s3_access_key=secret["s3-access-key"],
        s3_secret_key=secret["s3-secret-key"],
    )
    with ThreadPoolExecutor(1) as pool:
        pool.submit(objectstore.up, store, 120.0).result()
    # Redis: one of this run's own, on the Secret's password
    redis, redis_port = await run.start_redis(work, urlparse(secret["redis-url"]).password or "")
    db_name = f"k8srun_{run_id}"
    backing = backing_services(broker.kafka_bootstrap, services.database_url, store.s3_endpoint, redis_port)
    network = Network(namespace="lorafleet", database=db_name, backing=backing)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("LORAFLEET_")} | QUIET_ENV
    cluster = Cluster(
        applied_documents(K8S),
        secret,
        network,
        work,
        overrides={
            "replica serve": REPLICA_SIZES,
            # the run's Kafka is one broker: its topics can have one copy, not the cluster's three
            **dict.fromkeys(("services init", "stats-stream"), ONE_BROKER),
        },
        base_env=base_env,
    )
    logins = [urlparse(v).username or "" for k, v in secret.items() if k.startswith("database-url-")]
    try:
        async with throwaway_database(services.database_url, db_name) as owner_url:
            deployment = Deployment(cluster, secret, owner_url, work)
            try:
                # the init Job: migrations and the logins, topics and ACLs, the bucket
                job = cluster.pod("lorafleet-init")
                await run.run_to_end(cluster.spec(job), work, 300)
                for workload in ("relay", "registry-validator", "placement-worker", "stats-stream"):
                    await deployment.start_pod(workload)
                await deployment.start_pod("gateway")
                await deployment.start_pod("public-gateway")
                await deployment.start_pod(REPLICAS, 0)
                yield deployment
            finally:
                for process in reversed(list(deployment.running.values())):
                    await asyncio.to_thread(process.stop)
                await drop_roles(services.database_url, logins)
    finally:
        stop(redis)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(kafka.down, broker).result()
            pool.submit(objectstore.down, store).result()


async def _placed_on(d: Deployment, replica_id: str) -> set[str]:
    conn = await asyncpg.connect(d.owner_url)
    try:
        rows = await conn.fetch("SELECT adapter_id FROM placements WHERE replica_id = $1", replica_id)
        return {r["adapter_id"] for r in rows}
    finally:
        await conn.close()


async def _routed(d: Deployment) -> list[str]:
    """The replicas the public gateway routes to now."""
    async with httpx.AsyncClient() as c:
        return list(
            (await c.get(f"{d.url('public-gateway', 18080)}/ready", timeout=5)).json().get("replicas", [])
        )


async def test_the_manifests_serve_a_registration_an_alias_move_a_join_and_a_drain(d: Deployment) -> None:
    internal, public = d.url("gateway", 18081), d.url("public-gateway", 18080)
    token = d.secret["gateway-service-token"]
    run_id = uuid.uuid4().hex[:6]
    v1, v2 = f"acme-k8s-{run_id}-v1", f"acme-k8s-{run_id}-v2"
    alias = "acme/k8s:prod"
    model_dir = ensure_default_model()
    key = await scenario.tenant_with_key(d.owner_url, "acme")
    store = PlatformSettings(
        s3_endpoint=d.cluster.network.rewrite("http://objectstore.lorafleet.svc:9000", {}, {}),
        s3_access_key=d.secret["s3-access-key"],
        s3_secret_key=d.secret["s3-secret-key"],
        s3_bucket="lorafleet-adapters",
    )
    base_hash = await asyncio.to_thread(base_model_hash, model_dir)
    await scenario.register_versions(internal, token, store, model_dir, base_hash, d.work, "acme", [v1, v2])

    async def routed_to(replica: str) -> bool:
        return replica in await _routed(d)

    async def not_routed_to(replica: str) -> bool:
        return replica not in await _routed(d)

    await scenario.move_alias(internal, token, alias, v1)
    first = f"{REPLICAS}-0"
    await wait_until(lambda: routed_to(first), "the public gateway to route to replica 0", 120)
    for _ in range(3):
        answer = await scenario.served_by(public, key, alias, v1, 60)
        assert answer.status == 200

    await scenario.move_alias(internal, token, alias, v2)
    await scenario.served_by(public, key, alias, v2, 60)

    # a second replica joins, as a scale-up starts ordinal 1: it warms what it owns and is routed to
    second = await d.start_pod(REPLICAS, 1)
    await wait_until(lambda: routed_to(second.name), "the public gateway to route to replica 1", 180)
    assert await _placed_on(d, second.name) >= {v2}, "the placement worker placed nothing on the new replica"
    for _ in range(3):
        await scenario.served_by(public, key, alias, v2, 60)

    # a scale-down drains the highest ordinal in its preStop hook: placements move away, chats go on
    await d.stop_pod(second)
    await wait_until(lambda: not_routed_to(second.name), "the drained replica to leave the router", 60)

    async def nothing_placed() -> bool:
        return not await _placed_on(d, second.name)

    await wait_until(nothing_placed, "its placements to move away", 60)
    for _ in range(3):
        await scenario.served_by(public, key, alias, v2, 60)


@pytest.fixture
def d(deployment: Deployment) -> Deployment:
    return deployment


def _secret_variables() -> list[tuple[str, str]]:
    """(workload, variable): each variable a long-running workload's container takes from the Secret."""
    out = []
    for doc in applied_documents(K8S):
        if doc.kind in ("Deployment", "StatefulSet"):
            for container in doc.body["spec"]["template"]["spec"]["containers"]:
                env = container.get("env", [])
                out += [(doc.name, e["name"]) for e in env if "secretKeyRef" in e.get("valueFrom", {})]
    return out


# Needed only beyond loopback, where this run never listens (it moves every listener to loopback); there the
# stats stream refuses to start without it: tests/stats_stream/test_metrics_listener.py.
LOOPBACK_ONLY_HERE = {"LORAFLEET_STATS_METRICS_TOKEN"}


def _address_variables() -> list[tuple[str, str]]:
    """(workload, variable): a backing service's address each long-running workload takes from the
    ConfigMap (envFrom): Kafka's for every one, the object store's for those given its keys."""
    out = []
    for doc in applied_documents(K8S):
        if doc.kind in ("Deployment", "StatefulSet"):
            for container in doc.body["spec"]["template"]["spec"]["containers"]:
                if not any("configMapRef" in source for source in container.get("envFrom", [])):
                    continue
                names = {e["name"] for e in container.get("env", [])}
                out.append((doc.name, "LORAFLEET_KAFKA_BOOTSTRAP"))
                if "LORAFLEET_S3_ACCESS_KEY" in names:
                    out.append((doc.name, "LORAFLEET_S3_ENDPOINT"))
    return out


@pytest.mark.parametrize(
    ("workload", "variable"),
    [c for c in _secret_variables() if c[1] not in LOOPBACK_ONLY_HERE] + _address_variables(),
    ids=str,
)
async def test_a_process_missing_a_secret_or_address_its_manifest_gives_it_refuses_to_start(
    d: Deployment, workload: str, variable: str
) -> None:
    """Delete one variable from the container's environment as the manifest builds it (from the Secret, or a
    backing service's address from the ConfigMap): the process exits at start, naming it, instead of
    falling back to a default (a dev secret, the local stack's address)."""
    pod = d.cluster.pod(workload, ordinal=90)
    spec = d.cluster.spec(pod)
    assert variable in spec.env, f"{workload} has no {variable}"
    without = dataclasses.replace(spec, env={k: v for k, v in spec.env.items() if k != variable}, ready=())
    process = run.running(without, d.work).start()
    try:
        assert process.proc is not None

        async def exited() -> bool:
            return process.proc is not None and process.proc.poll() is not None

        await wait_until(exited, f"{workload} without {variable} to exit", 90)
        assert process.proc.returncode != 0 and variable in process.tail(), process.tail()
    finally:
        if process.alive:
            process.kill()
