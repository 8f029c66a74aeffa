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

from replica.adapter_cache.cache import AdapterCache
from replica.errors import ReplicaError
from schemas.events import EventValidationError, ReplicaCommand, parse_event

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

    def parse(self, raw: bytes) -> ReplicaCommand | None:
        """The command if it is valid and for this replica; None (logged) otherwise."""
        try:
            event = parse_event(raw, "replica.commands")
        except EventValidationError as exc:
            log.warning("skipping an invalid replica command: %s", exc)
            return None
        assert isinstance(event, ReplicaCommand)
        return event if event.replica_id == self.replica_id else None

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

    async def apply_batch(self, raws: list[bytes]) -> int:
        """Apply a fetched batch: concurrently across adapters, in order within one adapter."""
        commands = [c for c in (self.parse(r) for r in raws) if c is not None]
        by_adapter: dict[str, list[ReplicaCommand]] = {}
        for c in commands:
            by_adapter.setdefault(c.adapter_id, []).append(c)

        async def in_order(cs: list[ReplicaCommand]) -> int:
            return sum([await self.apply(c) for c in cs])

        return sum(await asyncio.gather(*(in_order(cs) for cs in by_adapter.values())))


async def consume_commands(consumer: AIOKafkaConsumer, handler: CommandHandler, stop: asyncio.Event) -> None:
    """Read replica.commands with a started consumer until stop; commit after each applied batch."""
    while not stop.is_set():
        batch = await consumer.getmany(timeout_ms=500, max_records=200)
        raws = [r.value for records in batch.values() for r in records]
        if raws:
            await handler.apply_batch(raws)
            await consumer.commit()
