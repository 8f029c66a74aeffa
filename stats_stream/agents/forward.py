"""One thin agent per source topic: validate the event and forward it onto the single fleet partition."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import faust
from faust.types import StreamT

from schemas.events import EventValidationError, parse_event
from stats_stream import metrics
from stats_stream.catchup import CatchUp
from stats_stream.topics import FLEET_KEY, StreamTopics

log = logging.getLogger(__name__)


def register(app: faust.App, topics: StreamTopics, catchup: CatchUp) -> None:
    for name, source in topics.sources.items():
        app.agent(source, name=f"forward-{name}")(_forwarder(name, topics.fleet, catchup))


def _forwarder(
    name: str, fleet: faust.TopicT, catchup: CatchUp
) -> Callable[[StreamT[bytes]], Coroutine[Any, Any, None]]:
    async def forward(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            raw, message = event.value, event.message
            try:
                parse_event(raw, topic=name)
            except EventValidationError as exc:
                metrics.EVENTS.labels(name, "invalid").inc()
                log.warning("skipping an invalid event on %s: %s", name, exc)
            else:
                await fleet.send(key=FLEET_KEY, value=raw)
            # after the send: a tick vouching for this offset is sent behind the forwarded event
            catchup.read((message.tp.topic, message.tp.partition), message.offset)

    return forward
