"""Where the integration suite's Kafka, PostgreSQL and S3 come from: testcontainers when a Docker engine
answers, otherwise the locally started services (started here if they are not running)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from lorafleet.config import PlatformSettings


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


@contextlib.contextmanager
def containers() -> Iterator[ServiceAddresses]:
    """Kafka (apache/kafka, KRaft), PostgreSQL and MinIO in throwaway containers."""
    try:
        from testcontainers.community.kafka import KafkaContainer
        from testcontainers.community.minio import MinioContainer
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        from testcontainers.kafka import KafkaContainer
        from testcontainers.minio import MinioContainer
        from testcontainers.postgres import PostgresContainer

    with (
        # testcontainers' Kafka module drives Confluent's image; cp-kafka 7.9 ships Apache Kafka 3.9 (KRaft).
        KafkaContainer("confluentinc/cp-kafka:7.9.0").with_kraft() as kafka,
        PostgresContainer(
            "postgres:16", username="lorafleet", password="lorafleet", dbname="lorafleet"
        ) as pg,
        MinioContainer() as minio,
    ):
        cfg = minio.get_config()
        yield ServiceAddresses(
            kafka_bootstrap=kafka.get_bootstrap_server(),
            database_url=pg.get_connection_url(driver=None),
            s3_endpoint=f"http://{cfg['endpoint']}",
            s3_access_key=cfg["access_key"],
            s3_secret_key=cfg["secret_key"],
        )


@contextlib.contextmanager
def local() -> Iterator[ServiceAddresses]:
    """The natively run services from `lorafleet services up --infra-only`, started if needed."""
    from lorafleet.config import get_settings
    from lorafleet.services import stack

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
