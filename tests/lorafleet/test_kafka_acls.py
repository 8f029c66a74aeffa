"""The ACL table, pure: who writes which topic, and every service's groups fall inside its grants."""

from __future__ import annotations

import pytest

from gateway.config import GatewaySettings
from lorafleet.kafka_acls import GRANTS, writers
from ops.kafka_acl_admin import OPERATIONS, bindings
from placement_worker.config import PlacementSettings
from schemas import principals as p
from schemas import topics as t
from stats_stream.config import StatsStreamSettings


def test_only_replicas_write_replica_state_and_replica_events() -> None:
    assert writers(t.REPLICA_STATE.name) == {p.REPLICA}
    assert writers(t.REPLICA_EVENTS.name) == {p.REPLICA}


@pytest.mark.parametrize("topic", [c.name for c in t.CONTROL_TOPICS])
def test_only_the_relay_writes_a_control_plane_topic(topic: str) -> None:
    assert writers(topic) == {p.RELAY}


def test_the_relay_writes_only_the_control_plane_and_every_topic_has_one_writer() -> None:
    control = {c.name for c in t.CONTROL_TOPICS}
    assert {topic.name for topic in t.ALL_TOPICS if p.RELAY in writers(topic.name)} == control
    for topic in t.ALL_TOPICS:
        assert len(writers(topic.name)) == 1, topic.name


def test_each_services_default_group_is_inside_its_grant() -> None:
    def group_grant(principal: str, group: str) -> bool:
        return any(
            g.principal == principal and group.startswith(prefix) and "Read" in g.operations
            for g in GRANTS
            if g.prefixed
            for prefix in g.groups
        )

    assert group_grant(p.REGISTRY_VALIDATOR, GatewaySettings().validator_group)
    assert group_grant(p.PLACEMENT_WORKER, PlacementSettings().group_id)
    assert group_grant(p.STATS_STREAM, StatsStreamSettings().app_id)
    assert group_grant(p.REPLICA, "replica-replica-0")  # replica/control/service.py: replica-<id>
    assert not group_grant(p.GATEWAY, GatewaySettings().validator_group)


def test_every_grant_becomes_a_binding_per_resource_and_operation() -> None:
    rows = bindings()
    expected = sum(len(g.operations) * (len(g.topics) + len(g.groups)) for g in GRANTS)
    assert len(rows) == expected == len(set(rows))
    assert all(row[3].startswith("User:") and row[5] in OPERATIONS.values() for row in rows)
