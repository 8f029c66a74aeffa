"""Outside the dev profile every process refuses to start while any credential it holds (a token it checks
or sends, its database login, its Kafka password, Redis's password) is a well-known dev secret or missing,
and names each one; given real secrets, the internal gateway starts and accepts only them."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from harness.databases import drop_roles, throwaway_database
from harness.ports import free_port
from harness.processes import stop, wait_http
from lorafleet.db.logins import ensure_logins
from lorafleet.db.migrate import migrate
from lorafleet.profile import DEV_TOKEN, dev_kafka_password, token_digest
from schemas import principals

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
S3 = ("LORAFLEET_S3_ACCESS_KEY", "LORAFLEET_S3_SECRET_KEY")
# the init Job makes this login: a dev password for it is refused (the owner's own URL is not checked)
INIT_LOGIN = "LORAFLEET_DB_LOGIN_RELAY"
SETTING = re.compile(r"\bLORAFLEET_[A-Z0-9_]+\b")
DATABASE, KAFKA, REDIS = "LORAFLEET_DATABASE_URL", "LORAFLEET_KAFKA_PASSWORD", "LORAFLEET_REDIS_URL"

# process -> (argv, extra environment, every credential it holds)
PROCESSES: dict[str, tuple[list[str], dict[str, str], set[str]]] = {
    "gateway": (
        ["gateway"],
        {},
        {"LORAFLEET_GATEWAY_SERVICE_TOKEN", "LORAFLEET_GATEWAY_REGISTRY_READ_TOKEN", KAFKA, DATABASE},
    ),
    "public-gateway": (
        ["public-gateway"],
        {},
        {"LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN", REDIS, KAFKA, DATABASE},
    ),
    "public-gateway with tenant metrics": (
        ["public-gateway"],
        {"LORAFLEET_GATEWAY_TENANT_METRICS_PORT": "18082"},
        {
            "LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN",
            "LORAFLEET_GATEWAY_SERVICE_TOKEN",
            REDIS,
            KAFKA,
            DATABASE,
        },
    ),
    "replica": (
        ["replica", "serve", "--replica-id", "profile-test"],
        {},
        {"LORAFLEET_REPLICA_SERVICE_TOKEN_SHA256", "LORAFLEET_REPLICA_REGISTRY_TOKEN", *S3, KAFKA, DATABASE},
    ),
    "autoscaler": (
        ["autoscale", "--local"],
        {},
        {"LORAFLEET_AUTOSCALE_REPLICA_SERVICE_TOKEN", KAFKA, DATABASE},
    ),
    "relay": (["relay"], {}, {KAFKA, DATABASE}),
    "registry-validator": (["registry-validator"], {}, {*S3, KAFKA, DATABASE}),
    "placement-worker": (["placement-worker"], {}, {KAFKA, DATABASE}),
    "stats-stream": (["stats-stream"], {}, {KAFKA, DATABASE}),
    "services init": (
        ["services", "init"],
        {INIT_LOGIN: "postgresql://lf_relay:dev-db-relay@127.0.0.1:15432/lorafleet"},
        {INIT_LOGIN, *S3, KAFKA},
    ),
    "stats-stream beyond loopback": (
        ["stats-stream"],
        {"LORAFLEET_STATS_METRICS_HOST": "0.0.0.0"},
        {"LORAFLEET_STATS_METRICS_TOKEN", KAFKA, DATABASE},
    ),
}
TOKENS = {
    "LORAFLEET_GATEWAY_SERVICE_TOKEN",
    "LORAFLEET_GATEWAY_REGISTRY_READ_TOKEN",
    "LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN",
    "LORAFLEET_REPLICA_SERVICE_TOKEN",
    "LORAFLEET_REPLICA_SERVICE_TOKEN_SHA256",
    "LORAFLEET_REPLICA_REGISTRY_TOKEN",
    "LORAFLEET_AUTOSCALE_REPLICA_SERVICE_TOKEN",
    "LORAFLEET_STATS_METRICS_TOKEN",
    *S3,
}


def _without_password(url: str) -> str:
    parsed = urlparse(url)
    return parsed._replace(netloc=f"{parsed.username}@{parsed.netloc.rpartition('@')[2]}").geturl()


def _base_env(services) -> dict[str, str]:
    """The suite's environment with no credential of its own, outside the dev profile."""
    env = {k: v for k, v in os.environ.items() if k not in TOKENS | {KAFKA, REDIS, DATABASE}}
    return {**env, **services.env(), "LORAFLEET_PROFILE": "production"}


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lorafleet.cli", *argv],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _refused(done: subprocess.CompletedProcess[str]) -> set[str]:
    """The settings the refusal names: each credential that is dev or missing (and a metrics listener
    beyond loopback without its token, which its settings refuse in any profile)."""
    assert done.returncode != 0, done.stderr[-2000:]
    names: set[str] = set()
    for line in done.stderr.splitlines():
        if "well-known dev secret or none" in line:
            names |= set(SETTING.findall(line.partition(" still hold")[0]))
        elif "serves per-tenant series: set" in line:
            names |= set(SETTING.findall(line))
    assert names, done.stderr[-2000:]
    return names


@pytest.mark.parametrize("name", list(PROCESSES))
def test_a_process_refuses_each_dev_credential_it_holds(services, name: str) -> None:
    argv, extra, holds = PROCESSES[name]
    env = _base_env(services) | extra
    env |= dict.fromkeys(holds & TOKENS, DEV_TOKEN)  # each token it holds on the dev default
    env |= {n: token_digest(DEV_TOKEN) for n in holds & TOKENS if n.endswith("_SHA256")}  # or its digest
    env[KAFKA] = dev_kafka_password(principals.ADMIN)  # a well-known one, whoever logs in
    env[REDIS] = "redis://:dev-redis-password@127.0.0.1:16379/0"
    # services.env()'s database URL is the local owner's, on its dev password
    assert _refused(_run(argv, env)) == holds


@pytest.mark.parametrize("name", list(PROCESSES))
def test_a_process_refuses_each_credential_it_lacks(services, name: str) -> None:
    argv, extra, holds = PROCESSES[name]
    env = _base_env(services) | extra
    env |= dict.fromkeys(holds & TOKENS - {"LORAFLEET_STATS_METRICS_TOKEN"}, "")  # that one: unset
    env[REDIS] = "redis://127.0.0.1:16379/0"
    env[DATABASE] = _without_password(env[DATABASE])
    # a metrics listener beyond loopback without its token is refused by its settings, before the rest
    expected = {"LORAFLEET_STATS_METRICS_TOKEN"} if "LORAFLEET_STATS_METRICS_TOKEN" in holds else holds
    assert _refused(_run(argv, env)) == expected


async def test_the_gateway_starts_on_real_secrets_outside_the_dev_profile_and_guards_its_document(
    services, tmp_path
) -> None:
    port, run = free_port(), uuid.uuid4().hex[:8]
    async with throwaway_database(services.database_url, f"devprofile_{run}") as url:
        await migrate(url)
        owner = urlparse(url)
        user, password = f"dp_{run}_gateway", secrets.token_urlsafe(24)
        login = owner._replace(netloc=f"{user}:{password}@{owner.netloc.rpartition('@')[2]}").geturl()
        await ensure_logins(url, {"gateway": login})
        env = _base_env(services) | {
            DATABASE: login,
            "LORAFLEET_GATEWAY_SERVICE_TOKEN": "a-real-secret-of-its-own",
            "LORAFLEET_GATEWAY_REGISTRY_READ_TOKEN": "a-real-read-secret-of-its-own",
            "LORAFLEET_GATEWAY_INTERNAL_PORT": str(port),
            KAFKA: "a-real-kafka-secret",  # the broker refuses it: the console's feed waits, the API serves
        }
        with open(tmp_path / "gateway.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lorafleet.cli", "gateway"], env=env, cwd=REPO, stdout=log, stderr=log
            )
        real = {"Authorization": "Bearer a-real-secret-of-its-own"}
        try:
            await wait_http(f"http://127.0.0.1:{port}/openapi.json", 90, proc, real)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
                ok = await c.get("/internal/adapters", headers=real)
                dev = await c.get("/internal/adapters", headers={"Authorization": f"Bearer {DEV_TOKEN}"})
                doc = await c.get("/openapi.json", headers=real)
                bare_doc = await c.get("/openapi.json")
                pages = [(await c.get(p)).status_code for p in ("/docs", "/redoc")]
            assert ok.status_code == 200 and dev.status_code == 401
            # the document lists every internal route: only the service token opens it, and no HTML page exists
            assert "/internal/adapters" in doc.json()["paths"]
            assert bare_doc.status_code == 401 and bare_doc.json()["error"]["type"], bare_doc.text
            assert pages == [404, 404]
        finally:
            stop(proc)
            await drop_roles(services.database_url, [user])
