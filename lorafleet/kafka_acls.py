"""Who may do what on Kafka: the ACL table every broker of the fleet gets (ops/kafka_acl_admin.py
applies it).

Nothing is allowed that is not granted here (the broker runs StandardAuthorizer with
allow.everyone.if.no.acl.found=false); the admin principal is a super user. Only the replicas write
replica.state and replica.events, only the relay writes the control-plane topics, and every other
service reads what it consumes, joins its own consumer groups and writes only its own outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas import principals as p
from schemas import topics as t


@dataclass(frozen=True)
class Grant:
    """Allow one principal some operations on some topics or consumer groups (names, or name prefixes)."""

    principal: str
    operations: tuple[str, ...]
    topics: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    prefixed: bool = False


def _names(*topics: t.Topic) -> tuple[str, ...]:
    return tuple(topic.name for topic in topics)


READ = ("Read", "Describe")
WRITE = ("Write", "Describe")

GRANTS: tuple[Grant, ...] = (
    Grant(p.RELAY, WRITE, topics=_names(*t.CONTROL_TOPICS)),
    Grant(p.REPLICA, WRITE, topics=_names(t.REPLICA_STATE, t.REPLICA_EVENTS)),
    Grant(p.REPLICA, READ, topics=_names(t.REPLICA_COMMANDS)),
    Grant(p.REPLICA, ("Read",), groups=(p.REPLICA_GROUP_PREFIX,), prefixed=True),
    Grant(p.GATEWAY, READ, topics=_names(t.ALIASES_CHANGED, t.REPLICA_STATE, t.ADAPTER_STATS, t.ALERTS)),
    Grant(p.GATEWAY, WRITE, topics=_names(t.REQUESTS_COMPLETED)),
    # the internal gateway's operator console: each replica's GPU hit rate from the completed requests
    Grant(p.GATEWAY, ("Read",), topics=_names(t.REQUESTS_COMPLETED)),
    Grant(p.REGISTRY_VALIDATOR, READ, topics=_names(t.ADAPTERS_REGISTERED)),
    Grant(p.REGISTRY_VALIDATOR, ("Read",), groups=(p.VALIDATOR_GROUP_PREFIX,), prefixed=True),
    Grant(
        p.PLACEMENT_WORKER,
        READ,
        topics=_names(
            t.ADAPTERS_VALIDATED, t.ALIASES_CHANGED, t.REPLICA_STATE, t.ADAPTER_STATS, t.REQUESTS_COMPLETED
        ),
    ),
    Grant(p.PLACEMENT_WORKER, ("Read",), groups=(p.PLACEMENT_GROUP_PREFIX,), prefixed=True),
    Grant(p.STATS_STREAM, READ, topics=_names(t.REQUESTS_COMPLETED, t.REPLICA_EVENTS, t.REPLICA_STATE)),
    Grant(p.STATS_STREAM, WRITE, topics=_names(t.ADAPTER_STATS, t.ALERTS, t.AUTOSCALE_SIGNALS)),
    # faust creates, reads and writes its internal topics (changelogs, the assignor's leader topic)
    Grant(
        p.STATS_STREAM,
        ("Create", "Read", "Write", "Describe", "DescribeConfigs"),
        topics=(p.STATS_APP_ID_PREFIX,),
        prefixed=True,
    ),
    Grant(p.STATS_STREAM, ("Read",), groups=(p.STATS_APP_ID_PREFIX,), prefixed=True),
    Grant(p.AUTOSCALER, READ, topics=_names(t.AUTOSCALE_SIGNALS, t.MERGED_TARGETS)),
)


def writers(topic: str) -> set[str]:
    """The principals granted Write on a topic (by its name or a prefix of it)."""
    return {
        g.principal
        for g in GRANTS
        if "Write" in g.operations
        and any(topic.startswith(n) if g.prefixed else topic == n for n in g.topics)
    }
