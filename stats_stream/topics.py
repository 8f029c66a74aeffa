"""The stream's Kafka topics: the three it reads, its internal fleet topic, and the three it writes.

Sources and sinks carry raw JSON bytes validated by schemas.events (the contracts live there, not in faust
Records). Every source event is forwarded, keyed by the fleet, onto one single-partition internal topic so
one table partition sees the whole fleet: closing a window needs every adapter, tenant and replica at once
(cost needs the fleet size, hot adapters need the fleet size, autoscaling needs every replica's queue).
At this product's rates (40 requests/s and one state event per replica per second) one partition is ample.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import faust

from schemas import topics as t

TICK_TYPE = "stats.tick"  # internal to the stats stream; never leaves its fleet topic
FLEET_KEY = b"fleet"
SOURCES: tuple[t.Topic, ...] = (t.REQUESTS_COMPLETED, t.REPLICA_EVENTS, t.REPLICA_STATE)


def tick(wall_ms: int, token: str | None) -> bytes:
    """A tick; the token, when set, vouches that every source event read before it precedes it here."""
    return json.dumps({"type": TICK_TYPE, "at_ms": wall_ms, "token": token}).encode()


def tick_token(raw: bytes) -> str | None:
    token = json.loads(raw).get("token")
    return token if isinstance(token, str) else None


def is_tick(raw: bytes) -> bool:
    return raw.startswith(b'{"type": "stats.tick"')


@dataclass(frozen=True)
class StreamTopics:
    sources: dict[str, faust.TopicT]  # by topic name
    fleet: faust.TopicT
    adapter_stats: faust.TopicT
    alerts: faust.TopicT
    autoscale: faust.TopicT


def _raw(app: faust.App, topic: t.Topic) -> faust.TopicT:
    return app.topic(topic.name, partitions=topic.partitions, key_serializer="raw", value_serializer="raw")


def declare(app: faust.App) -> StreamTopics:
    return StreamTopics(
        sources={src.name: _raw(app, src) for src in SOURCES},
        fleet=app.topic(
            f"{app.conf.id}-fleet", partitions=1, internal=True, key_serializer="raw", value_serializer="raw"
        ),
        adapter_stats=_raw(app, t.ADAPTER_STATS),
        alerts=_raw(app, t.ALERTS),
        autoscale=_raw(app, t.AUTOSCALE_SIGNALS),
    )
