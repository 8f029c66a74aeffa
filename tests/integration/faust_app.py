"""A tiny faust-streaming app for the compatibility test: count events per key in a table, emit the counts."""

from __future__ import annotations

import os

import faust

from lorafleet.config import PlatformSettings
from stats_stream.app import broker_credentials

app = faust.App(
    os.environ["FAUST_TEST_APP_ID"],
    broker=f"kafka://{os.environ['LORAFLEET_KAFKA_BOOTSTRAP']}",
    broker_credentials=broker_credentials(PlatformSettings()),
    store="memory://",
    topic_partitions=1,
    web_enabled=False,
    datadir=os.environ["FAUST_TEST_DATADIR"],
)


class Ping(faust.Record, serializer="json"):
    tenant: str
    n: int


source = app.topic(os.environ["FAUST_TEST_SOURCE"], value_type=Ping, partitions=1)
sink = app.topic(os.environ["FAUST_TEST_SINK"], partitions=1, value_serializer="json")
counts = app.Table("counts", default=int, partitions=1)


@app.agent(source)
async def count(stream):
    async for ping in stream.group_by(Ping.tenant, name="by-tenant", partitions=1):
        counts[ping.tenant] += 1
        await sink.send(key=ping.tenant, value={"tenant": ping.tenant, "count": counts[ping.tenant]})
