"""Apply replica.commands addressed to this replica: load (own it, pull to a tier), prewarm, unload.

Commands are at-least-once: each is applied idempotently (the cache's own/unload are), and event ids settled
recently are skipped. Commands for one adapter apply in order; different adapters load concurrently.

A command is settled (lorafleet.settle) before its offset is committed:
- the object store or the registry did not answer (TRANSIENT), or PostgreSQL could not take a dead letter:
  nothing is committed and the batch is read again after a backoff, so no command is lost in an outage, and
  the state publisher beside this loop keeps the replica in the fleet meanwhile;
- a tier or the slots are full of adapters in use (DECLINED): the adapter is owned all the same and is
  brought in by its first request, so the command is applied, as it was before it had retries;
- any other failure (an invalid or corrupt adapter, one the registry does not know): retried, then the
  command is dead-lettered with its error and committed past, so the next command applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from lorafleet.dead_letters import DeadLetters
from lorafleet.seen_ids import SeenIds
from lorafleet.settle import is_transient, settle
from replica.adapter_cache.errors import ObjectStoreUnavailableError, RegistryUnavailableError, TierFullError
from replica.adapter_cache.tier import Tier
from replica.errors import NoFreeSlotError
from schemas.events import Event, ReplicaCommand

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer

log = logging.getLogger(__name__)
SEEN_CAPACITY = 10_000
TRANSIENT: tuple[type[Exception], ...] = (ObjectStoreUnavailableError, RegistryUnavailableError)
DECLINED: tuple[type[Exception], ...] = (TierFullError, NoFreeSlotError)
RETRY_S, RETRY_MAX_S = 1.0, 30.0  # backoff before a batch that met a transient failure is read again

Where = tuple[str, int, int, bytes | None]  # topic, partition, offset and value of the command's record


class OwnedAdapters(Protocol):
    """What a command acts on: replica.adapter_cache.AdapterCache, or a stand-in's modeled tiers."""

    async def own(self, adapter_id: str, target: Tier = "ram") -> Tier: ...

    async def unload(self, adapter_id: str, drain_timeout_s: float = 600.0) -> bool: ...


class CommandHandler:
    """ReplicaCommand -> cache action, chosen from a table by the command name."""

    def __init__(
        self,
        cache: OwnedAdapters,
        replica_id: str,
        letters: DeadLetters,
        attempts: int = 3,
        backoff_s: float = 0.2,
    ) -> None:
        self.cache = cache
        self.replica_id = replica_id
        self.letters = letters
        self.attempts, self.backoff_s = attempts, backoff_s
        self._seen = SeenIds(SEEN_CAPACITY)
        self._tails: dict[str, asyncio.Future[bool]] = {}
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

    async def _act(self, command: ReplicaCommand) -> None:
        try:
            await self.actions[command.command](command)
        except DECLINED as exc:
            log.warning("%s %s declined for now: %s", command.command, command.adapter_id, exc)

    async def apply(self, command: ReplicaCommand, where: Where) -> bool:
        """Settle once: True once applied or dead-lettered, False for a duplicate. A transient failure is
        raised and the command is not remembered, so reading it again applies it."""
        if command.event_id in self._seen:
            return False
        previous = self._tails.get(command.adapter_id)
        if previous is not None:
            await asyncio.gather(asyncio.shield(previous), return_exceptions=True)
        task = asyncio.ensure_future(
            settle(
                lambda: self._act(command),
                self.letters,
                *where,
                attempts=self.attempts,
                backoff_s=self.backoff_s,
                transient=TRANSIENT,
            )
        )
        self._tails[command.adapter_id] = task
        try:
            await task
        finally:
            if self._tails.get(command.adapter_id) is task:
                del self._tails[command.adapter_id]
        self._seen.add(command.event_id)
        return True

    async def apply_batch(self, records: list[tuple[Event | None, Where]]) -> int:
        """Settle a fetched batch's commands for this replica: concurrently across adapters, in order within
        one adapter. Raises the first transient failure once every adapter's commands have stopped."""
        by_adapter: dict[str, list[tuple[ReplicaCommand, Where]]] = {}
        for event, where in records:
            if (c := self.mine(event)) is not None:
                by_adapter.setdefault(c.adapter_id, []).append((c, where))

        async def in_order(cs: list[tuple[ReplicaCommand, Where]]) -> int:
            return sum([await self.apply(c, where) for c, where in cs])

        done = await asyncio.gather(*(in_order(cs) for cs in by_adapter.values()), return_exceptions=True)
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome
        return sum(n for n in done if isinstance(n, int))


def passes(exc: BaseException) -> bool:
    """Whether a batch that raised exc is read again rather than ending the loop."""
    return is_transient(exc) or isinstance(exc, TRANSIENT)


async def consume_commands(consumer: AIOKafkaConsumer, handler: CommandHandler, stop: asyncio.Event) -> None:
    """Read replica.commands with a started consumer until stop; commit after each settled batch. A record
    that does not decode goes to the handler's letters and is committed past with its batch; a batch that
    met a transient failure is read again from its first record after a backoff."""
    letters, delay = handler.letters, RETRY_S
    while not stop.is_set():
        batch = await consumer.getmany(timeout_ms=500, max_records=200)
        if not batch:
            continue
        try:
            records = [
                (
                    await letters.parse(tp.topic, tp.partition, r.offset, r.value),
                    (tp.topic, tp.partition, r.offset, r.value),
                )
                for tp, rs in batch.items()
                for r in rs
            ]
            await handler.apply_batch(records)
        except Exception as exc:
            if not passes(exc):
                raise
            log.warning("replica commands: %r; reading the batch again in %.0f s", exc, delay)
            for tp, rs in batch.items():
                consumer.seek(tp, rs[0].offset)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, RETRY_MAX_S)
            continue
        delay = RETRY_S
        await consumer.commit()
