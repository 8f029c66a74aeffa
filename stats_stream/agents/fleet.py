"""The agent that owns the window table: each message from the fleet topic goes to the window keeper, with
where it was read (a window whose close keeps failing is dead-lettered at the tick that closed it)."""

from __future__ import annotations

import time

import faust
from faust.types import StreamT

from stats_stream.catchup import CatchUp
from stats_stream.keeper import WindowKeeper
from stats_stream.topics import FLEET_KEY, StreamTopics, tick


def register(
    app: faust.App, topics: StreamTopics, keeper: WindowKeeper, catchup: CatchUp, tick_s: float
) -> None:
    @app.agent(topics.fleet, name="windows")
    async def windows(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            tp, offset = event.message.tp, event.message.offset
            await keeper.handle(event.value, int(time.time() * 1000), (tp.topic, tp.partition, offset))

    @app.timer(interval=tick_s)
    async def ticker() -> None:
        # Table writes are only allowed inside a stream, so the clock reaches the keeper as a message.
        await topics.fleet.send(key=FLEET_KEY, value=tick(int(time.time() * 1000), catchup.token()))
