"""The replica's control loop: consume commands, publish state every second and cache events."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from lorafleet.config import PlatformSettings
from lorafleet.dead_letters import DeadLetters
from lorafleet.kafka import make_consumer, make_producer
from replica.adapter_cache.cache import AdapterCache
from replica.control.commands import CommandHandler, consume_commands
from replica.control.events import EventPublisher
from replica.control.state_publisher import publish_state
from schemas.events import ReplicaState
from schemas.topics import REPLICA_COMMANDS

log = logging.getLogger(__name__)


async def run_control(
    platform: PlatformSettings,
    replica_id: str,
    cache: AdapterCache,
    events: EventPublisher,
    make_state: Callable[[], ReplicaState],
    stop: asyncio.Event,
    state_interval_s: float = 1.0,
    nudge: asyncio.Event | None = None,
    letters: DeadLetters | None = None,
    signing_key: str | None = None,
) -> None:
    """Run until stop; each replica reads every command partition in a group of its own and filters by id."""
    producer = make_producer(platform)
    consumer = make_consumer(platform, REPLICA_COMMANDS.name, group_id=f"replica-{replica_id}")
    own_letters = letters is None
    letters = letters or DeadLetters.own_pool("replica-commands", platform)
    handler = CommandHandler(cache, replica_id, letters)
    tasks: list[asyncio.Task[None]] = []
    waiter = asyncio.create_task(stop.wait())
    try:
        await producer.start()  # inside the try: a broker that is down still gets both clients closed
        await consumer.start()
        tasks = [
            asyncio.create_task(consume_commands(consumer, handler, stop), name="replica-commands"),
            asyncio.create_task(
                publish_state(producer, make_state, stop, state_interval_s, nudge, signing_key),
                name="replica-state",
            ),
            asyncio.create_task(events.run(producer, stop), name="replica-events"),
        ]
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done - {waiter}:
            if task.exception() is not None:  # a loop died: stop the rest rather than serve half a replica
                log.error("control loop %s failed: %r", task.get_name(), task.exception())
    finally:
        waiter.cancel()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await consumer.stop()
        with contextlib.suppress(Exception):
            await producer.stop()
        if own_letters:
            await letters.close()
