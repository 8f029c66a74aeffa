"""`services up` on a developer's old plaintext broker (running, its log dir formatted without SCRAM users):
the broker is stopped, its dir formatted again with the users, and it comes back with SASL and the ACLs."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from harness.ports import free_port
from lorafleet.config import PlatformSettings
from lorafleet.kafka import ensure_topics
from ops.stack import kafka
from ops.stack.paths import java_classpath, service_dir
from ops.stack.process import wait_until
from schemas import principals
from schemas import topics as t
from tests.integration.kafka_helpers import connects, login, produce

pytestmark = pytest.mark.integration

# The local broker's configuration before it had SASL: every listener PLAINTEXT, no authorizer.
PLAINTEXT_BROKER = """process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{broker},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{broker}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data}
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
"""


def _start_plaintext_broker(settings: PlatformSettings) -> None:
    data = service_dir(settings, "kafka") / "data"
    data.mkdir(parents=True)
    config = service_dir(settings, "kafka") / "server.properties"
    broker = settings.kafka_bootstrap.rsplit(":", 1)[1]
    config.write_text(
        PLAINTEXT_BROKER.format(broker=broker, controller=settings.kafka_controller_port, data=data)
    )
    java = ["java", "-cp", java_classpath("kafka"), kafka._log4j()]  # noqa: SLF001 - the same launch
    fmt = [*java, "kafka.tools.StorageTool", "format", "-t", uuid.uuid4().hex[:22], "-c", str(config)]
    subprocess.run(fmt, check=True, capture_output=True)
    kafka.process(settings).start([*java, "kafka.Kafka", str(config)])


def test_an_old_plaintext_broker_is_formatted_again_with_sasl_and_acls(tmp_path: Path) -> None:
    settings = PlatformSettings(
        data_dir=tmp_path / "data",
        kafka_bootstrap=f"127.0.0.1:{free_port()}",
        kafka_controller_port=free_port(),
    )
    plaintext = settings.model_copy(update={"kafka_security_protocol": "PLAINTEXT"})
    try:
        _start_plaintext_broker(settings)
        assert wait_until(lambda: asyncio.run(connects(plaintext)), 180, interval=1.0)
        old_pid = kafka.process(settings).pid()

        with ThreadPoolExecutor(1) as pool:  # up() uses asyncio.run
            said = pool.submit(kafka.up, settings, 240.0).result()
        assert "formatted" in said and "lacked this stack's SASL/SCRAM users" in said, said
        assert kafka.process(settings).pid() not in (None, old_pid)
        assert not asyncio.run(connects(plaintext))
        asyncio.run(ensure_topics(kafka.admin_settings(settings)))

        async def gateway_forges_replica_state() -> None:
            await produce(login(settings, principals.GATEWAY), t.REPLICA_STATE.name)

        with pytest.raises(TopicAuthorizationFailedError):
            asyncio.run(gateway_forges_replica_state())
        with ThreadPoolExecutor(1) as pool:
            again = pool.submit(kafka.up, settings, 240.0).result()
        assert again.startswith("already running") and "formatted" not in again, again
    finally:
        kafka.down(settings)
