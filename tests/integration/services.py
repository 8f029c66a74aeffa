"""Where the integration suite's Kafka, PostgreSQL and S3 come from: testcontainers when a Docker engine
answers, otherwise the locally started services (started here if they are not running)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lorafleet.config import PlatformSettings

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ServiceAddresses:
    kafka_bootstrap: str
    database_url: str
    s3_endpoint: str
    s3_access_key: str
    s3_secret_key: str

    def settings(self, **overrides) -> PlatformSettings:
        return PlatformSettings(
            kafka_bootstrap=self.kafka_bootstrap,
            database_url=self.database_url,
            s3_endpoint=self.s3_endpoint,
            s3_access_key=self.s3_access_key,
            s3_secret_key=self.s3_secret_key,
            **overrides,
        )

    def env(self) -> dict[str, str]:
        """The same addresses as LORAFLEET_* variables, for subprocesses."""
        return {
            "LORAFLEET_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "LORAFLEET_DATABASE_URL": self.database_url,
            "LORAFLEET_S3_ENDPOINT": self.s3_endpoint,
            "LORAFLEET_S3_ACCESS_KEY": self.s3_access_key,
            "LORAFLEET_S3_SECRET_KEY": self.s3_secret_key,
        }


def docker_answers() -> bool:
    if os.environ.get("LORAFLEET_TEST_LOCAL_SERVICES") == "1":
        return False
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:  # noqa: BLE001 - no engine, no socket, no permission: all mean "use local services"
        return False


def _kafka_container() -> tuple[Any, str]:
    """docker-compose.yml's broker (apache/kafka through infra/kafka/compose-kafka.sh: SASL/SCRAM, the
    principals' users), published on a free host port that it also listens and advertises on."""
    from testcontainers.core.container import DockerContainer

    from harness.ports import free_port

    spec = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["kafka"]
    (mount,) = spec["volumes"]
    script, inside = mount.split(":")[:2]
    port = free_port()
    return (
        DockerContainer(spec["image"])
        .with_volume_mapping(str(REPO / script), inside, "ro")
        .with_envs(**spec["environment"], KAFKA_PORT=str(port), KAFKA_ADVERTISED_HOST="127.0.0.1")
        .with_bind_ports(port, port)
        .with_kwargs(entrypoint=spec["entrypoint"], hostname="kafka")
    ), f"127.0.0.1:{port}"


def _kafka_ready(bootstrap: str, timeout_s: float = 120.0) -> None:
    """Wait until the admin can log in, then apply the ACL table (what `services init` does in compose)."""
    import time

    from lorafleet.kafka import make_admin
    from ops.kafka_acl_admin import apply_acls

    admin_settings = PlatformSettings(kafka_bootstrap=bootstrap, kafka_username="admin")

    async def login() -> bool:
        admin = make_admin(admin_settings, request_timeout_ms=5000)
        try:
            await admin.start()
            return True
        except Exception:  # noqa: BLE001 - not up yet
            return False
        finally:
            await admin.close()

    deadline = time.monotonic() + timeout_s
    while not asyncio.run(login()):
        assert time.monotonic() < deadline, f"the Kafka container at {bootstrap} did not come up"
        time.sleep(1.0)
    asyncio.run(apply_acls(admin_settings))


@contextlib.contextmanager
def containers() -> Iterator[ServiceAddresses]:
    """Kafka (apache/kafka, KRaft, SASL/SCRAM), PostgreSQL and MinIO in throwaway containers."""
    try:
        from testcontainers.community.minio import MinioContainer
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        from testcontainers.minio import MinioContainer
        from testcontainers.postgres import PostgresContainer

    kafka_container, bootstrap = _kafka_container()
    with (
        kafka_container,
        PostgresContainer(
            "postgres:16", username="lorafleet", password="lorafleet", dbname="lorafleet"
        ) as pg,
        MinioContainer() as minio,
    ):
        cfg = minio.get_config()
        with ThreadPoolExecutor(1) as pool:  # asyncio.run off pytest-asyncio's loop
            pool.submit(_kafka_ready, bootstrap).result()
        yield ServiceAddresses(
            kafka_bootstrap=bootstrap,
            database_url=pg.get_connection_url(driver=None),
            s3_endpoint=f"http://{cfg['endpoint']}",
            s3_access_key=cfg["access_key"],
            s3_secret_key=cfg["secret_key"],
        )


@contextlib.contextmanager
def local() -> Iterator[ServiceAddresses]:
    """The natively run services from `lorafleet services up --infra-only`, started if needed."""
    from lorafleet.config import get_settings
    from ops.stack import stack

    settings = get_settings()
    infra = {s.name for s in stack.INFRA}

    def start_if_needed() -> None:
        if not all(info["healthy"] for name, info in stack.status(settings).items() if name in infra):
            stack.infra_up(settings, lambda _msg: None)

    # In a thread: the launchers use asyncio.run, which must not touch pytest-asyncio's session loop.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(start_if_needed).result()
    yield ServiceAddresses(
        kafka_bootstrap=settings.kafka_bootstrap,
        database_url=settings.database_url,
        s3_endpoint=settings.s3_endpoint,
        s3_access_key=settings.s3_access_key,
        s3_secret_key=settings.s3_secret_key,
    )
