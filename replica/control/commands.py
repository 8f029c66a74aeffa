"""Apply replica.commands addressed to this replica: load (own it, pull to a tier), prewarm, unload.

Commands are at-least-once: each is applied idempotently (the cache's own/unload are), and event ids seen
recently are skipped. Commands for one adapter apply in order; different adapters load concurrently.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from lorafleet.dead_letters import DeadLetters
from replica.adapter_cache.cache import AdapterCache
from replica.errors import ReplicaError
from schemas.events import Event, ReplicaCommand

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer

log = logging.getLogger(__name__)
SEEN_CAPACITY = 10_000


class CommandHandler:
    """ReplicaCommand -> cache action, chosen from a table by the command name."""

    def __init__(self, cache: AdapterCache, replica_id: str) -> None:
        self.cache = cache
        self.replica_id = replica_id
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._tails: dict[str, asyncio.Future[object]] = {}
        self.actions: dict[str, Callable[[ReplicaCommand], Awaitable[object]]] = {
            "load": lambda c: cache.own(c.adapter_id, c.target_tier),
            "prewarm": lambda c: cache.own(c.adapter_id, "gpu"),
            "unload": lambda c: cache.unload(c.adapter_id),
        }

    def mine(self, event: Event | None) -> ReplicaCommand | None:
        """The command if it is one for this replica; None otherwise."""
        if isinstance(event, ReplicaCommand) and event.replica_id == self.replica_id:
            return event
        return None

    async def apply(self, command: ReplicaCommand) -> bool:
        """Apply once; False for a duplicate. Failures are logged: the control plane re-sends on drift."""
        key = str(command.event_id)
        if key in self._seen:
            return False
        self._seen[key] = None
        if len(self._seen) > SEEN_CAPACITY:
            self._seen.popitem(last=False)
        previous = self._tails.get(command.adapter_id)
        if previous is not None:
            await asyncio.gather(asyncio.shield(previous), return_exceptions=True)
        task = asyncio.ensure_future(self.actions[command.command](command))
        self._tails[command.adapter_id] = task
        try:
            await task
        except ReplicaError as exc:
            log.warning("%s %s failed: %s (%s)", command.command, command.adapter_id, exc.message, exc.code)
        except Exception:
            log.exception("%s %s failed", command.command, command.adapter_id)
        finally:
            if self._tails.get(command.adapter_id) is task:
                del self._tails[command.adapter_id]
        return True

    async def apply_batch(self, events: list[Event | None]) -> int:
        """Apply a fetched batch's commands for this replica: concurrently across adapters, in order within
        one adapter."""
        commands = [c for c in (self.mine(e) for e in events) if c is not None]
        by_adapter: dict[str, list[ReplicaCommand]] = {}
        for c in commands:
            by_adapter.setdefault(c.adapter_id, []).append(c)

        async def in_order(cs: list[ReplicaCommand]) -> int:
            return sum([await self.apply(c) for c in cs])

        return sum(await asyncio.gather(*(in_order(cs) for cs in by_adapter.values())))


async def consume_commands(
    consumer: AIOKafkaConsumer, handler: CommandHandler, letters: DeadLetters, stop: asyncio.Event
) -> None:
    """Read replica.commands with a started consumer until stop; commit after each applied batch. A record
    that does not decode goes to letters and is committed past with its batch."""
    while not stop.is_set():
        batch = await consumer.getmany(timeout_ms=500, max_records=200)
        events = [
            await letters.parse(tp.topic, tp.partition, r.offset, r.value)
            for tp, records in batch.items()
            for r in records
        ]
        if events:
            await handler.apply_batch(events)
            await consumer.commit()
