"""One thin agent per source topic: validate the event and forward it onto the single fleet partition; a
record that does not decode goes to the dead letters and its offset is acknowledged like a forwarded one's."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import faust
from faust.types import StreamT

from lorafleet.dead_letters import DeadLetters
from stats_stream import metrics
from stats_stream.catchup import CatchUp
from stats_stream.topics import FLEET_KEY, StreamTopics

log = logging.getLogger(__name__)


def register(app: faust.App, topics: StreamTopics, catchup: CatchUp, letters: DeadLetters) -> None:
    for name, source in topics.sources.items():
        app.agent(source, name=f"forward-{name}")(_forwarder(name, topics.fleet, catchup, letters))


def _forwarder(
    name: str, fleet: faust.TopicT, catchup: CatchUp, letters: DeadLetters
) -> Callable[[StreamT[bytes]], Coroutine[Any, Any, None]]:
    async def forward(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            raw, message = event.value, event.message
            tp = message.tp
            if await letters.parse(name, tp.partition, message.offset, raw) is None:
                metrics.EVENTS.labels(name, "invalid").inc()
            else:
                await fleet.send(key=FLEET_KEY, value=raw)
            # after the send: a tick vouching for this offset is sent behind the forwarded event
            catchup.read((message.tp.topic, message.tp.partition), message.offset)

    return forward
