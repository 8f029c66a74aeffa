"""Topics are created with the configured copies and min.insync.replicas, on the real broker; asking for more
copies than the cluster has brokers is refused, not created thinner."""

from __future__ import annotations

import uuid

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidReplicationFactorError

from lorafleet.kafka import ensure_topics, make_admin
from schemas.topics import Topic

pytestmark = pytest.mark.integration


async def test_a_topic_gets_its_min_insync_replicas_and_too_many_copies_are_refused(services) -> None:
    settings = services.settings()
    topic = Topic(f"test-topics-{uuid.uuid4().hex[:8]}", 2, "key")
    assert await ensure_topics(settings, (topic,)) == [topic.name]
    admin = make_admin(settings)
    await admin.start()
    try:
        (described,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic.name)])
        configs = {name: value for name, value, *_ in described.resources[0][4]}
        assert configs["min.insync.replicas"] == str(settings.kafka_min_insync_replicas) == "1"
    finally:
        await admin.close()
    three = settings.model_copy(update={"kafka_replication_factor": 3, "kafka_min_insync_replicas": 2})
    with pytest.raises(InvalidReplicationFactorError):
        await ensure_topics(three, (Topic(f"test-topics-{uuid.uuid4().hex[:8]}", 1, "key"),))
