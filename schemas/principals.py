"""Kafka principals: one per service, and the consumer-group and topic prefixes each one owns.

A service authenticates to Kafka as its own principal (SASL/SCRAM), and the broker's ACLs
(lorafleet/kafka_acls.py) grant each exactly the topics and groups listed here. A consumer group id or a
faust app id outside its service's prefix is refused by the broker.
"""

from __future__ import annotations

ADMIN = "admin"  # creates topics and ACLs; a super user. Tools and tests use it on a dev stack.
RELAY = "relay"
GATEWAY = "gateway"  # the internal and the public gateway
REGISTRY_VALIDATOR = "registry-validator"
PLACEMENT_WORKER = "placement-worker"
STATS_STREAM = "stats-stream"
REPLICA = "replica"
AUTOSCALER = "autoscaler"

SERVICES: tuple[str, ...] = (
    RELAY,
    GATEWAY,
    REGISTRY_VALIDATOR,
    PLACEMENT_WORKER,
    STATS_STREAM,
    REPLICA,
    AUTOSCALER,
)
ALL: tuple[str, ...] = (ADMIN, *SERVICES)

# Consumer-group id prefixes (a prefix, so that a test or a second stack can run its own group).
REPLICA_GROUP_PREFIX = "replica-"
VALIDATOR_GROUP_PREFIX = "registry-validator"
PLACEMENT_GROUP_PREFIX = "placement-"
# The stats stream's faust app id starts with this: its consumer group and internal topics (changelogs,
# the assignor's leader topic) are named after the app id.
STATS_APP_ID_PREFIX = "lorafleet-stats"
