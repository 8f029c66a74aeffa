"""Kafka topic names, partition counts and message keys: the one place every process reads them from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topic:
    """A topic, how many partitions it has, and which event field is its message key."""

    name: str
    partitions: int
    key_field: str
    compacted: bool = False


ADAPTERS_REGISTERED = Topic("adapters.registered", 8, "adapter_id")
ADAPTERS_VALIDATED = Topic("adapters.validated", 8, "adapter_id")
ALIASES_CHANGED = Topic("aliases.changed", 8, "alias")
REPLICA_COMMANDS = Topic("replica.commands", 8, "replica_id")
REPLICA_STATE = Topic("replica.state", 8, "replica_id")
REPLICA_EVENTS = Topic("replica.events", 8, "replica_id")
REQUESTS_COMPLETED = Topic("requests.completed", 8, "adapter_id")
ADAPTER_STATS = Topic("adapter.stats", 8, "adapter_id")
AUTOSCALE_SIGNALS = Topic("autoscale.signals", 1, "fleet")
ALERTS = Topic("alerts", 4, "subject")
# Desired merged replicas per adapter version, a level (compacted: the latest target per key is the state).
MERGED_TARGETS = Topic("merged.targets", 8, "adapter_id", compacted=True)

ALL_TOPICS: tuple[Topic, ...] = (
    ADAPTERS_REGISTERED,
    ADAPTERS_VALIDATED,
    ALIASES_CHANGED,
    REPLICA_COMMANDS,
    REPLICA_STATE,
    REPLICA_EVENTS,
    REQUESTS_COMPLETED,
    ADAPTER_STATS,
    AUTOSCALE_SIGNALS,
    ALERTS,
    MERGED_TARGETS,
)

# The control plane: the topics the outbox relay publishes (every event written through the outbox), and
# which only the relay's principal may write.
CONTROL_TOPICS: tuple[Topic, ...] = (
    ADAPTERS_REGISTERED,
    ADAPTERS_VALIDATED,
    ALIASES_CHANGED,
    REPLICA_COMMANDS,
    MERGED_TARGETS,
)

BY_NAME: dict[str, Topic] = {t.name: t for t in ALL_TOPICS}
