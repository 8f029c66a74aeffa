"""Each process the local stack starts logs in to Kafka as its own principal, with that one's password."""

from __future__ import annotations

from lorafleet.profile import dev_kafka_password
from ops.stack.env import replica_env
from ops.stack.stack import APP_PROCESSES, app_envs
from schemas import principals


def test_each_app_process_gets_its_own_principal_and_password() -> None:
    envs = app_envs(list(APP_PROCESSES))
    users = {name: env["LORAFLEET_KAFKA_USERNAME"] for name, env in envs.items()}
    assert users["relay"] == principals.RELAY
    assert users["gateway"] == users["public-gateway"] == principals.GATEWAY
    assert users["replica-0"] == users["replica-1"] == principals.REPLICA
    assert set(users.values()) == set(principals.SERVICES)
    for env in envs.values():
        assert env["LORAFLEET_KAFKA_PASSWORD"] == dev_kafka_password(env["LORAFLEET_KAFKA_USERNAME"])


def test_a_replica_the_autoscaler_starts_logs_in_as_a_replica() -> None:
    assert replica_env()["LORAFLEET_KAFKA_USERNAME"] == principals.REPLICA
