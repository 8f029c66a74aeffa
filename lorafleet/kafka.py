"""Kafka clients configured the one way this project uses them, and topic creation.

Every aiokafka client of the project is made here, so that each one authenticates (SASL/SCRAM over the
configured security protocol) as the settings' principal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code
from aiokafka.helpers import create_ssl_context

from lorafleet.config import PlatformSettings
from lorafleet.profile import kafka_password
from schemas.topics import ALL_TOPICS, Topic


@dataclass(frozen=True)
class SaslLogin:
    """Who a client logs in as, and how (for clients built elsewhere, such as faust's)."""

    mechanism: str
    username: str
    password: str
    tls: bool


def sasl_login(settings: PlatformSettings) -> SaslLogin | None:
    """The SASL login of these settings, or None on a PLAINTEXT broker."""
    if settings.kafka_security_protocol == "PLAINTEXT":
        return None
    return SaslLogin(
        settings.kafka_sasl_mechanism,
        settings.kafka_principal,
        kafka_password(settings),
        settings.kafka_security_protocol == "SASL_SSL",
    )


def client_security(settings: PlatformSettings) -> dict[str, Any]:
    """The aiokafka client options that authenticate a client as the settings' principal."""
    login = sasl_login(settings)
    if login is None:
        return {"security_protocol": "PLAINTEXT"}
    return {
        "security_protocol": settings.kafka_security_protocol,
        "sasl_mechanism": login.mechanism,
        "sasl_plain_username": login.username,
        "sasl_plain_password": login.password,
        **({"ssl_context": create_ssl_context()} if login.tls else {}),
    }


def make_admin(settings: PlatformSettings, **overrides: Any) -> AIOKafkaAdminClient:
    """An admin client (topic creation, metadata) with the settings' login."""
    options = {**client_security(settings), **overrides}
    return AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, **options)


def make_producer(settings: PlatformSettings, **overrides: Any) -> AIOKafkaProducer:
    """An idempotent producer: enable_idempotence implies acks=all (aiokafka defaults to neither)."""
    options: dict[str, Any] = {
        "enable_idempotence": True,
        "acks": "all",
        "linger_ms": 5,
        "request_timeout_ms": 15000,
    }
    options.update(client_security(settings))
    options.update(overrides)
    return AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, **options)


def make_consumer(
    settings: PlatformSettings, *topics: str, group_id: str | None, **overrides: Any
) -> AIOKafkaConsumer:
    """A consumer that commits only after processing (at-least-once; handlers dedupe on event_id).
    Auto-commit can't be turned on: it would commit an offset before its event's effect, and a crash
    between the two would lose the event."""
    if overrides.get("enable_auto_commit"):
        raise ValueError("enable_auto_commit: offsets are committed only after their event's effect")
    options: dict[str, Any] = {
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "isolation_level": "read_committed",
    }
    options.update(client_security(settings))
    options.update(overrides)
    return AIOKafkaConsumer(*topics, bootstrap_servers=settings.kafka_bootstrap, group_id=group_id, **options)


async def seek_to_times(consumer: AIOKafkaConsumer, since_ms: Mapping[TopicPartition, int]) -> None:
    """Seek each assigned partition to its first record at or after its timestamp (ms), else to its end."""
    offsets = await consumer.offsets_for_times(dict(since_ms))
    ends = await consumer.end_offsets(list(since_ms))
    for p in since_ms:
        found = offsets.get(p)
        consumer.seek(p, found.offset if found is not None else ends[p])


async def ensure_topics(settings: PlatformSettings, topics: tuple[Topic, ...] = ALL_TOPICS) -> list[str]:
    """Create any missing topic with its partition count, the settings' replication factor and
    min.insync.replicas; return the names created. A cluster with fewer brokers than the replication factor
    refuses (InvalidReplicationFactorError), naming it."""
    admin = make_admin(settings)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in topics if t.name not in existing]
        if not missing:
            return []
        new = [
            NewTopic(
                t.name,
                num_partitions=t.partitions,
                replication_factor=settings.kafka_replication_factor,
                topic_configs={
                    "min.insync.replicas": str(settings.kafka_min_insync_replicas),
                    **({"cleanup.policy": "compact"} if t.compacted else {}),
                },
            )
            for t in missing
        ]
        response = await admin.create_topics(new)
        # the broker answers per topic; aiokafka hands the codes back without raising
        for name, code, *rest in response.topic_errors:
            if code not in (0, TopicAlreadyExistsError.errno):  # another process may have created it first
                message = rest[0] if rest and rest[0] else ""
                raise for_code(code)(f"creating topic {name}: {message}")
        return [t.name for t in missing]
    finally:
        await admin.close()
