"""Small helpers the integration tests share for reading what reached Kafka.

Both readers leave out poison records (tests.integration.poison): the dead-letter tests publish them on
purpose to the shared topics, where every later read from the beginning meets them.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import SecretStr

from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_admin, make_consumer, make_producer
from schemas.events import SCHEMA_VERSION
from schemas.topics import ALL_TOPICS


def consumer_at(bootstrap: str, *topics: str, group_id: str | None = None) -> AIOKafkaConsumer:
    """A consumer of the broker at bootstrap, logged in as the environment's principal (admin in tests)."""
    return make_consumer(PlatformSettings(kafka_bootstrap=bootstrap), *topics, group_id=group_id)


def decodable(record: object) -> bool:
    """Not a poison record: a JSON object of a schema version this code reads (or of none)."""
    try:
        value = json.loads(getattr(record, "value", None) or b"")
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("schema_version", SCHEMA_VERSION) == SCHEMA_VERSION


async def collect(
    bootstrap: str,
    topic: str,
    want: Callable[[list], bool],
    timeout: float = 60.0,
    accept: Callable[[object], bool] = lambda _r: True,
) -> list:
    """Read topic from the beginning with a fresh group until want(records) or timeout; return the records."""
    consumer = consumer_at(bootstrap, topic, group_id=f"test-{uuid.uuid4().hex[:8]}")
    await consumer.start()
    records: list = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not want(records):
            batch = await consumer.getmany(timeout_ms=500, max_records=2000)
            for recs in batch.values():
                records.extend(r for r in recs if decodable(r) and accept(r))
            await asyncio.sleep(0)
    finally:
        await consumer.stop()
    return records


async def read_to_end(
    bootstrap: str, topic: str, accept: Callable[[object], bool] = lambda _r: True, timeout: float = 60.0
) -> list:
    """Every accepted record of topic, from the beginning up to its end offsets as of this call.

    For records already acknowledged by Kafka: unlike collect, it cannot stop early and miss a duplicate.
    """
    # No group and an explicit assignment: a subscription's assignment is replaced on a metadata refresh,
    # and the replacement starts at the latest offsets, dropping the seek to the beginning.
    consumer = consumer_at(bootstrap)
    await consumer.start()
    records: list = []
    deadline = time.monotonic() + timeout
    try:
        known = next((t.partitions for t in ALL_TOPICS if t.name == topic), None)
        while known is None:
            found = consumer.partitions_for_topic(topic)  # a topic outside schemas.topics
            known = len(found) if found else None
            assert time.monotonic() < deadline, f"{topic}: no partitions known within {timeout}s"
            if known is None:
                await consumer.topics()  # refreshes the metadata
        partitions = [TopicPartition(topic, p) for p in range(known)]
        consumer.assign(partitions)
        end = await consumer.end_offsets(partitions)
        # explicit offsets: a lazy seek_to_beginning can lose to the fetcher's own reset to the latest offset
        for tp, first in (await consumer.beginning_offsets(partitions)).items():
            consumer.seek(tp, first)
        while [tp for tp in partitions if await consumer.position(tp) < end[tp]]:
            assert time.monotonic() < deadline, f"{topic}: not read to its end offsets within {timeout}s"
            batch = await consumer.getmany(*partitions, timeout_ms=500, max_records=5000)
            for tp, recs in batch.items():
                records.extend(r for r in recs if r.offset < end[tp] and decodable(r) and accept(r))
    finally:
        await consumer.stop()
    return records


def login(broker: PlatformSettings, principal: str, password: str | None = None) -> PlatformSettings:
    """The broker's address with a principal's login (its dev password unless one is given)."""
    secret = SecretStr(password) if password is not None else None
    return broker.model_copy(update={"kafka_username": principal, "kafka_password": secret})


async def produce(settings: PlatformSettings, topic: str) -> None:
    """Send one record to topic with these settings (an authorization failure raises)."""
    producer = make_producer(settings, request_timeout_ms=10000)
    try:
        await producer.start()
        await producer.send_and_wait(topic, b"{}", key=b"k")
    finally:
        await producer.stop()


async def connects(settings: PlatformSettings) -> bool:
    """Whether a client with these settings logs in and reads metadata."""
    admin = make_admin(settings, request_timeout_ms=5000)
    try:
        await admin.start()
        await admin.list_topics()
        return True
    except KafkaError:
        return False
    finally:
        await admin.close()
