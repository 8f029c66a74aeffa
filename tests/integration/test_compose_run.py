"""docker-compose.yml runs as written: `services init` and every long-running service built from the project
(the relay, the stats stream, both gateways, the registry validator, the placement worker, two replicas and
the autoscaler) start natively with exactly the command and environment the file gives them, ready on
their health checks. Then a registration, an alias and its move to a new version, chats through the
public gateway, the second replica joining and draining while chats go on, and an idempotent replay, which
only Redis (with its password) can give.

What running containers natively changes is harness/deploy/network.py's: each container's listeners and
every `<service>:<port>` in the file move to loopback ports of their own, and the `data` volume is a
folder. The backing services are the ones the file describes: a Kafka broker of this run's own with the
SCRAM users KAFKA_SCRAM_USERS names, a Redis of its own on the password its command sets, and the local
PostgreSQL (a throwaway database) and S3 store, whose owner and keys are the ones the file gives
postgres and objectstore. The one-shots `prepare` and `demo` are not run: the data volume starts with the
prepared base model, as `prepare` leaves it (`demo` and its preparation are tested on their own).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import asyncpg
import httpx
import pytest

from harness.databases import throwaway_database
from harness.deploy import run
from harness.deploy.compose import Project
from harness.deploy.k8s import seed_from_cache
from harness.deploy.network import LOOPBACK, Network, backing_services
from harness.env import QUIET_ENV
from harness.ports import free_port
from harness.processes import stop
from harness.running import Running
from lorafleet.config import PlatformSettings
from lorafleet.model.base_hash import base_model_hash
from lorafleet.model.prepare import DEFAULT_MODEL_NAME, ensure_default_model
from lorafleet.profile import DEV_TOKEN
from ops.stack import kafka
from tests.integration import deployment_scenario as scenario
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
LONG_RUNNING = (
    "relay",
    "stats-stream",
    "registry-validator",
    "placement-worker",
    "gateway",
    "public-gateway",
    "replica-0",
    "autoscaler",
)
JOINS_LATER = "replica-1"  # started by the test, as a second replica joining, then drained


@dataclass
class ComposeRun:
    project: Project
    owner_url: str
    work: Path
    running: dict[str, Running] = field(default_factory=dict)

    def url(self, service: str, port: int) -> str:
        return f"http://{LOOPBACK}:{self.project.network.ports[(service, port)]}"

    def env(self, service: str) -> dict[str, str]:
        return {k: str(v) for k, v in (self.project.service(service).get("environment") or {}).items()}


@pytest.fixture(scope="module")
async def compose(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ComposeRun]:
    work = tmp_path_factory.mktemp("compose-run")
    doc_env = Project.load(COMPOSE, Network(), work)
    kafka_env = {k: str(v) for k, v in doc_env.service("kafka")["environment"].items()}
    users = dict(u.split(":", 1) for u in kafka_env["KAFKA_SCRAM_USERS"].split())
    assert users["admin"] == kafka_env["KAFKA_ADMIN_PASSWORD"]
    broker = PlatformSettings(
        data_dir=work / "kafka",
        kafka_bootstrap=f"{LOOPBACK}:{free_port()}",
        kafka_controller_port=free_port(),
    )
    with ThreadPoolExecutor(1) as pool:
        pool.submit(kafka.up, broker, 240.0, users).result()
    redis_argv = [str(a) for a in doc_env.service("redis")["command"]]
    redis, redis_port = await run.start_redis(work, redis_argv[redis_argv.index("--requirepass") + 1])
    # the file's PostgreSQL and object store are the local ones: their owner and keys must be the file's
    pg_env = doc_env.service("postgres")["environment"]
    owner = urlparse(services.database_url)
    assert (owner.username, owner.password) == (pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"])
    store = services.settings()
    minio = doc_env.service("objectstore")["environment"]
    assert (store.s3_access_key, store.s3_secret_key) == (
        minio["MINIO_ROOT_USER"],
        minio["MINIO_ROOT_PASSWORD"],
    )
    db_name = f"composerun_{uuid.uuid4().hex[:8]}"
    backing = backing_services(broker.kafka_bootstrap, services.database_url, store.s3_endpoint, redis_port)
    network = Network(database=db_name, backing=backing)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("LORAFLEET_")} | QUIET_ENV
    project = Project.load(COMPOSE, network, work, base_env=base_env)
    project.prepare()
    # what `prepare` leaves in the data volume: the prepared base model
    seed_from_cache(project.volume("data") / "models" / DEFAULT_MODEL_NAME, ensure_default_model())
    try:
        async with throwaway_database(services.database_url, db_name) as owner_url:
            deployment = ComposeRun(project, owner_url, work)
            try:
                await run.run_to_end(project.spec("init"), work, 300)
                for name in LONG_RUNNING:
                    deployment.running[name] = await run.start(project.spec(name), work)
                yield deployment
            finally:
                for process in reversed(list(deployment.running.values())):
                    await asyncio.to_thread(process.stop)
    finally:
        stop(redis)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(kafka.down, broker).result()


async def _routed(public_url: str) -> list[str]:
    """The replicas the public gateway routes to now."""
    async with httpx.AsyncClient() as c:
        return list((await c.get(f"{public_url}/ready", timeout=5)).json().get("replicas", []))


async def _placed_on(owner_url: str, replica_id: str) -> set[str]:
    conn = await asyncpg.connect(owner_url)
    try:
        rows = await conn.fetch("SELECT adapter_id FROM placements WHERE replica_id = $1", replica_id)
        return {r["adapter_id"] for r in rows}
    finally:
        await conn.close()


async def test_the_compose_file_serves_a_registration_an_alias_move_a_join_a_drain_and_a_replay(
    compose: ComposeRun,
) -> None:
    internal, public = compose.url("gateway", 18081), compose.url("public-gateway", 18080)
    token = compose.env("gateway").get("LORAFLEET_GATEWAY_SERVICE_TOKEN", DEV_TOKEN)  # the dev profile's
    run_id = uuid.uuid4().hex[:6]
    adapter, v2 = f"globex-compose-{run_id}-v1", f"globex-compose-{run_id}-v2"
    alias = "globex/compose:prod"
    key = await scenario.tenant_with_key(compose.owner_url, "globex")
    model_dir = ensure_default_model()
    env = compose.env("gateway")
    store = PlatformSettings(
        s3_endpoint=compose.project.network.rewrite(env["LORAFLEET_S3_ENDPOINT"], {}, {}),
        s3_access_key=env["LORAFLEET_S3_ACCESS_KEY"],
        s3_secret_key=env["LORAFLEET_S3_SECRET_KEY"],
    )
    base_hash = await asyncio.to_thread(base_model_hash, model_dir)
    await scenario.register_versions(
        internal, token, store, model_dir, base_hash, compose.work, "globex", [adapter, v2]
    )
    await scenario.move_alias(internal, token, alias, adapter)
    for _ in range(3):
        await scenario.served_by(public, key, alias, adapter, 120)
    await scenario.move_alias(internal, token, alias, v2)
    await scenario.served_by(public, key, alias, v2, 60)

    # the second replica joins: it warms what placement gives it and is routed to
    compose.running[JOINS_LATER] = await run.start(compose.project.spec(JOINS_LATER), compose.work)

    async def joined() -> bool:
        return JOINS_LATER in await _routed(public)

    await wait_until(joined, "the public gateway to route to replica-1", 180)
    assert await _placed_on(compose.owner_url, JOINS_LATER) >= {v2}, "nothing was placed on the new replica"
    for _ in range(3):
        await scenario.served_by(public, key, alias, v2, 60)

    # `docker compose stop replica-1` (SIGTERM): it drains, its placements move away, chats go on
    await asyncio.to_thread(compose.running.pop(JOINS_LATER).stop)

    async def left() -> bool:
        return JOINS_LATER not in await _routed(public) and not await _placed_on(
            compose.owner_url, JOINS_LATER
        )

    await wait_until(left, "the drained replica to leave the router and the placements", 60)
    for _ in range(3):
        await scenario.served_by(public, key, alias, v2, 60)

    # Idempotency-Key: the answer is kept in Redis (behind its password) and replayed to the retry
    retry_key = f"compose-{uuid.uuid4().hex}"
    first = await scenario.chat(public, key, alias, idempotency_key=retry_key)
    again = await scenario.chat(public, key, alias, idempotency_key=retry_key)
    assert first.status == again.status == 200, (first.text[:300], again.text[:300])
    assert not first.replayed and again.replayed and again.text == first.text
