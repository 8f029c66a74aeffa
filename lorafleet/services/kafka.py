"""Apache Kafka, single node, KRaft mode, run with the machine's Java from Maven Central jars."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import uuid

from aiokafka.admin import AIOKafkaAdminClient

from lorafleet.config import PlatformSettings
from lorafleet.services.paths import INFRA, java_classpath, log_dir, run_dir, service_dir
from lorafleet.services.process import ManagedProcess, wait_until

NAME = "kafka"


def process(settings: PlatformSettings) -> ManagedProcess:
    return ManagedProcess(NAME, run_dir(settings), log_dir(settings))


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java not found: Kafka needs Java 17+ on PATH")
    return java


def _render_config(settings: PlatformSettings) -> tuple[str, str]:
    base = service_dir(settings, NAME)
    data = base / "data"
    data.mkdir(parents=True, exist_ok=True)
    host, port = settings.kafka_bootstrap.rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost"):
        raise ValueError(f"the local Kafka only listens on loopback, not {host}")
    template = (INFRA / "kafka" / "server.properties.template").read_text()
    config = base / "server.properties"
    config.write_text(
        template.format(broker_port=port, controller_port=settings.kafka_controller_port, log_dir=data)
    )
    return str(config), str(data)


def _format_storage(settings: PlatformSettings, config: str, data: str) -> None:
    """Format the KRaft log dir once; a formatted dir has meta.properties and is left alone."""
    if (service_dir(settings, NAME) / "data" / "meta.properties").exists():
        return
    cluster_id = uuid.uuid4().hex[:22]
    subprocess.run(
        [
            _java(),
            "-cp",
            java_classpath("kafka"),
            _log4j(),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id,
            "-c",
            config,
            "--ignore-formatted",
        ],
        check=True,
        capture_output=True,
    )


def _log4j() -> str:
    return f"-Dlog4j.configuration=file:{INFRA / 'kafka' / 'log4j.properties'}"


async def _metadata_ok(bootstrap: str) -> bool:
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # connection refusals while probing are expected
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await admin.start()
        await admin.list_topics()
        return True
    except Exception:  # noqa: BLE001 - any failure means "not ready yet"
        return False
    finally:
        try:
            await admin.close()
        except Exception:  # noqa: BLE001
            pass
        logging.getLogger("aiokafka").setLevel(logging.NOTSET)


def ready(settings: PlatformSettings) -> bool:
    """Kafka counts as ready when a metadata request succeeds."""
    return asyncio.run(_metadata_ok(settings.kafka_bootstrap))


def up(settings: PlatformSettings, timeout: float = 90.0) -> str:
    proc = process(settings)
    if proc.pid() is not None and ready(settings):
        return "already running"
    config, data = _render_config(settings)
    _format_storage(settings, config, data)
    if proc.pid() is None:
        proc.start(
            [
                _java(),
                "-Xms256m",
                "-Xmx768m",
                "-cp",
                java_classpath("kafka"),
                _log4j(),
                "kafka.Kafka",
                config,
            ],
            env={"KAFKA_HEAP_OPTS": ""},
        )
    if not wait_until(lambda: ready(settings), timeout, interval=1.0):
        raise RuntimeError(f"Kafka did not become ready in {timeout}s:\n{proc.log_tail()}")
    return "started"


def down(settings: PlatformSettings) -> bool:
    return process(settings).stop()
