"""One thin agent per source topic: validate the event and forward it onto the single fleet partition; a
record that does not decode goes to the dead letters, and a replica.state that is not its registered
replica's own (stats_stream.trust) is counted and dropped; either offset is acknowledged like a forwarded
one's."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import faust
from faust.types import StreamT

from lorafleet.dead_letters import DeadLetters
from schemas.events import ReplicaState
from stats_stream import metrics
from stats_stream.catchup import CatchUp
from stats_stream.topics import FLEET_KEY, StreamTopics
from stats_stream.trust import StateCheck

log = logging.getLogger(__name__)


def register(
    app: faust.App, topics: StreamTopics, catchup: CatchUp, letters: DeadLetters, states: StateCheck
) -> None:
    for name, source in topics.sources.items():
        app.agent(source, name=f"forward-{name}")(_forwarder(name, topics.fleet, catchup, letters, states))


def _forwarder(
    name: str, fleet: faust.TopicT, catchup: CatchUp, letters: DeadLetters, states: StateCheck
) -> Callable[[StreamT[bytes]], Coroutine[Any, Any, None]]:
    async def forward(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            raw, message = event.value, event.message
            tp = message.tp
            parsed = await letters.parse(name, tp.partition, message.offset, raw)
            if parsed is None:
                metrics.EVENTS.labels(name, "invalid").inc()
            elif not isinstance(parsed, ReplicaState) or await states.believes(parsed, raw, message.headers):
                await fleet.send(key=FLEET_KEY, value=raw)  # a state not believed is counted by the check
            # after the send: a tick vouching for this offset is sent behind the forwarded event
            catchup.read((message.tp.topic, message.tp.partition), message.offset)

    return forward
