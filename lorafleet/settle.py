"""Apply one consumed event with bounded retries: a handler that keeps raising dead-letters its record.

A consumer commits an offset only after its event is applied, so a handler that raised on every delivery
would stop its partition for good. The failures are told apart:

- the infrastructure (PostgreSQL unreachable or restarting, a statement cancelled, a serialization or
  deadlock failure, the network): raised, so the consumer's own retry loop reads the record again once the
  service is back; nothing is lost while it is down;
- anything else (a bug, data the handler cannot take): retried `attempts` times with backoff, then the
  record goes to dead_letters with the error, is counted, and the consumer commits past it, so the next
  record applies. `lorafleet dead-letters` lists it.

A consumer that commits no offsets (it follows a topic from a point of its own, and its handler is pure and in
memory) uses settle_following: no offset would bring the record back, so a failure is dead-lettered at once
and the follower goes on with the next record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from lorafleet.dead_letters import DeadLetters

log = logging.getLogger(__name__)
T = TypeVar("T")

# SQLSTATE classes of a failure that passes: connection, transaction rollback (serialization, deadlock),
# insufficient resources, operator intervention (a cancelled statement, a shutdown), system error
TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58"})


def is_transient(exc: BaseException) -> bool:
    """Whether exc says the infrastructure failed, not the handler or its event."""
    if isinstance(exc, OSError | TimeoutError | asyncpg.InterfaceError | asyncpg.PostgresConnectionError):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        return (getattr(exc, "sqlstate", None) or "")[:2] in TRANSIENT_SQLSTATE_CLASSES
    return False


async def settle(
    apply: Callable[[], Awaitable[object]],
    letters: DeadLetters,
    topic: str,
    partition: int,
    offset: int,
    value: bytes | None | Callable[[], bytes],
    attempts: int = 3,
    backoff_s: float = 0.2,
    transient: tuple[type[Exception], ...] = (),
    subject: str = "",
) -> bool:
    """apply(); True once it succeeded, False once the record was dead-lettered after attempts failures.
    A transient failure (is_transient, or one of the consumer's own transient types) is raised at once.
    subject, when the record alone does not say what failed, begins the dead letter's reason. value may be
    a function that makes the bytes, called only when the record is dead-lettered."""
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    attempt = 0
    while True:
        attempt += 1
        try:
            await apply()
            return True
        except Exception as exc:
            if is_transient(exc) or isinstance(exc, transient):
                raise
            if attempt == attempts:
                reason = f"the handler failed {attempts} times: {type(exc).__name__}: {exc}"
                reason = f"{subject}: {reason}" if subject else reason
                await letters.record(topic, partition, offset, value() if callable(value) else value, reason)
                return False
            log.warning(
                "%s: %s[%d]@%d failed (%r), attempt %d of %d",
                letters.consumer,
                topic,
                partition,
                offset,
                exc,
                attempt,
                attempts,
            )
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1))


async def settle_following(
    apply: Callable[[], T], letters: DeadLetters, topic: str, partition: int, offset: int, value: bytes | None
) -> T | None:
    """apply()'s result for a follower (it commits no offsets), or None once its failure is dead-lettered. The
    handler is pure, so a retry of the same record fails the same way; a dead letter PostgreSQL cannot take
    is logged, as nothing would read the record again."""
    try:
        return apply()
    except Exception as exc:
        reason = f"the handler failed: {type(exc).__name__}: {exc}"
        await letters.record_following(topic, partition, offset, value, reason)
        return None
