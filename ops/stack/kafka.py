"""Apache Kafka, single node, KRaft mode, run with the machine's Java from Maven Central jars.

The local broker is a dev broker: it authenticates every client with SASL/SCRAM-SHA-512, its users are
the principals of schemas/principals.py with their dev passwords (lorafleet/profile.py), and every `up`
applies the fleet's ACL table (lorafleet/kafka_acls.py; a no-op when it is in place). A log dir formatted
without these users (an older plaintext one) is local dev data: it is formatted again, and `up` says so.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

from pydantic import SecretStr

from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_admin
from lorafleet.profile import dev_kafka_password
from ops import kafka_acl_admin
from ops.stack.paths import INFRA, java_classpath, log_dir, run_dir, service_dir
from ops.stack.process import ManagedProcess, wait_until
from schemas import principals

NAME = "kafka"
MECHANISM = "SCRAM-SHA-512"


def process(settings: PlatformSettings) -> ManagedProcess:
    return ManagedProcess(NAME, run_dir(settings), log_dir(settings))


def _users_file(settings: PlatformSettings) -> Path:
    return service_dir(settings, NAME) / "scram-users.json"


def users(settings: PlatformSettings) -> dict[str, str]:
    """principal -> password of the broker's SCRAM users: the dev passwords, unless it was started with
    users of its own (a test's private broker with the passwords of the deployment files it runs)."""
    try:
        return dict(json.loads(_users_file(settings).read_text()))
    except FileNotFoundError:
        return {name: dev_kafka_password(name) for name in principals.ALL}


def admin_settings(settings: PlatformSettings) -> PlatformSettings:
    """The local broker's admin login, for probing it and applying its ACLs."""
    return settings.model_copy(
        update={
            "kafka_security_protocol": "SASL_PLAINTEXT",
            "kafka_sasl_mechanism": MECHANISM,
            "kafka_username": principals.ADMIN,
            "kafka_password": SecretStr(users(settings)[principals.ADMIN]),
        }
    )


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java not found: Kafka needs Java 17+ on PATH")
    return java


def _data(settings: PlatformSettings) -> Path:
    return service_dir(settings, NAME) / "data"


def _users_marker(settings: PlatformSettings) -> Path:
    return service_dir(settings, NAME) / "scram-users.sha256"


def _users_digest(settings: PlatformSettings) -> str:
    # in the principals' order: the dev users' digest is the one every formatted local broker recorded
    pairs = list(users(settings).items())
    return hashlib.sha256(json.dumps([MECHANISM, pairs]).encode()).hexdigest()


def _render_config(settings: PlatformSettings) -> str:
    base = service_dir(settings, NAME)
    data = _data(settings)
    data.mkdir(parents=True, exist_ok=True)
    host, port = settings.kafka_bootstrap.rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost"):
        raise ValueError(f"the local Kafka only listens on loopback, not {host}")
    template = (INFRA / "kafka" / "server.properties.template").read_text()
    config = base / "server.properties"
    config.write_text(
        template.format(
            broker_port=port,
            controller_port=settings.kafka_controller_port,
            log_dir=data,
            admin_password=users(settings)[principals.ADMIN],
        )
    )
    config.chmod(0o600)
    return str(config)


def _stale_format(settings: PlatformSettings) -> bool:
    """A formatted log dir whose SCRAM users are not this code's (none, in a plaintext one)."""
    formatted = (_data(settings) / "meta.properties").exists()
    marker = _users_marker(settings)
    return formatted and (not marker.exists() or marker.read_text() != _users_digest(settings))


def _format_storage(settings: PlatformSettings, config: str) -> None:
    """Format the KRaft log dir once, with every principal's SCRAM user; a formatted dir is left alone."""
    if (_data(settings) / "meta.properties").exists():
        return
    scram = []
    for name, password in users(settings).items():
        scram += ["--add-scram", f"{MECHANISM}=[name={name},password={password}]"]
    subprocess.run(
        [
            _java(),
            "-cp",
            java_classpath("kafka"),
            _log4j(),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            uuid.uuid4().hex[:22],
            "-c",
            config,
            *scram,
        ],
        check=True,
        capture_output=True,
    )
    _users_marker(settings).write_text(_users_digest(settings))


def _log4j() -> str:
    return f"-Dlog4j.configuration=file:{INFRA / 'kafka' / 'log4j.properties'}"


def apply_acls(settings: PlatformSettings) -> int:
    """Apply the ACL table as the local admin (idempotent); return the number of bindings."""
    return asyncio.run(kafka_acl_admin.apply_acls(admin_settings(settings)))


async def _metadata_ok(settings: PlatformSettings) -> bool:
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # connection refusals while probing are expected
    admin = make_admin(admin_settings(settings), request_timeout_ms=3000)
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
    """Kafka counts as ready when the admin's metadata request succeeds."""
    return asyncio.run(_metadata_ok(settings))


def up(
    settings: PlatformSettings, timeout: float = 90.0, scram_users: Mapping[str, str] | None = None
) -> str:
    """Start the broker (formatting its log dir with its SCRAM users first): the principals on their dev
    passwords, or scram_users (principal -> password; the admin among them), remembered for later calls."""
    proc = process(settings)
    if scram_users is not None:
        if principals.ADMIN not in scram_users:
            raise ValueError("the broker's users include its admin")
        _users_file(settings).parent.mkdir(parents=True, exist_ok=True)
        _users_file(settings).write_text(json.dumps(dict(scram_users)))
        _users_file(settings).chmod(0o600)
    notes = []
    if _stale_format(settings):
        # local dev data from a broker without these SCRAM users: start over rather than refuse to start
        if proc.stop(timeout=30.0):
            notes.append("stopped the running broker")
        shutil.rmtree(_data(settings))
        notes.append(
            f"formatted {_data(settings)} again: it lacked this stack's SASL/SCRAM users"
            " (its topics and offsets are gone)"
        )
    if proc.pid() is not None and ready(settings):
        return "; ".join(["already running", *notes, *_acl_note(settings)])
    config = _render_config(settings)
    _format_storage(settings, config)
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
    return "; ".join(["started", *notes, *_acl_note(settings)])


def _acl_note(settings: PlatformSettings) -> list[str]:
    return [f"{apply_acls(settings)} ACL bindings in place"]


def down(settings: PlatformSettings) -> bool:
    return process(settings).stop()
