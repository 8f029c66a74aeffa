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

# PostgreSQL: the processes that hold a database login, each a member of its own role. The migrations
# create the roles (NOLOGIN) and grant each what its process does and nothing more
# (schemas/sql/013_process_roles.sql); `lorafleet db logins` creates the logins.
PUBLIC_GATEWAY = "public-gateway"
DATABASE_ROLES: dict[str, str] = {
    GATEWAY: "lorafleet_gateway",
    PUBLIC_GATEWAY: "lorafleet_public_gateway",
    REGISTRY_VALIDATOR: "lorafleet_registry_validator",
    PLACEMENT_WORKER: "lorafleet_placement_worker",
    RELAY: "lorafleet_relay",
    STATS_STREAM: "lorafleet_stats_stream",
    REPLICA: "lorafleet_replica",
    AUTOSCALER: "lorafleet_autoscaler",
}
DATABASE_LOGINS: tuple[str, ...] = tuple(DATABASE_ROLES)
