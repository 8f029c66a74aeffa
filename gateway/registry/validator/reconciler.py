"""Ask again for the check of every pending version whose check is due: none is left pending for good.

A version stays pending when the object store failed its check (the validator recorded when to check again,
adapters.defer_check) or when its adapters.registered event never reached a validator (a lost event: no
check within registry_reconcile_after_s of its registration). Every registry_reconcile_interval_s the
reconciler claims such versions and writes a new adapters.registered event for each to the outbox, in the
transaction that pushes its next check registry_reconcile_after_s out; the relay publishes it and the
validator checks the version again. A check that settles nothing (the version settled meanwhile) is a no-op.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from gateway.config import GatewaySettings
from gateway.registry import adapters
from lorafleet import metrics
from lorafleet.outbox.writer import emit
from lorafleet.settle import is_transient

log = logging.getLogger(__name__)


async def reconcile_once(pool: asyncpg.Pool, settings: GatewaySettings) -> int:
    """Publish (through the outbox) a check for each pending version that is due; return how many."""
    async with pool.acquire() as conn, conn.transaction():
        due = await adapters.claim_due_checks(conn, settings.registry_reconcile_after_s)
        for row in due:
            await emit(conn, adapters.registered_event(row))
        pending = await conn.fetchrow(
            """SELECT count(*) FILTER (WHERE check_attempts = 0) AS waiting,
                      count(*) FILTER (WHERE check_attempts > 0) AS retrying,
                      coalesce(extract(epoch FROM now() - min(created_at)), 0) AS oldest_s
               FROM adapters WHERE status = 'pending'"""
        )
    assert pending is not None  # an aggregate without GROUP BY returns one row
    metrics.REGISTRY_PENDING.labels("waiting").set(pending["waiting"])
    metrics.REGISTRY_PENDING.labels("retrying").set(pending["retrying"])
    metrics.REGISTRY_OLDEST_PENDING.set(float(pending["oldest_s"]))
    for row in due:
        why = (
            f"its check failed {row['check_attempts']} times" if row["check_attempts"] else "no check arrived"
        )
        log.info("adapter %s is pending and %s: its check is asked for again", row["adapter_id"], why)
    metrics.REGISTRY_CHECKS_REQUESTED.inc(len(due))
    return len(due)


async def reconcile_forever(pool: asyncpg.Pool, settings: GatewaySettings, stop: asyncio.Event) -> None:
    """reconcile_once every interval until stop; a failure is logged and tried at the next interval."""
    while not stop.is_set():
        try:
            await reconcile_once(pool, settings)
        except Exception as exc:  # noqa: BLE001 - the validator keeps validating while this waits
            level = logging.WARNING if is_transient(exc) else logging.ERROR
            log.log(level, "registry reconciler failed, trying again: %r", exc)
        try:
            await asyncio.wait_for(stop.wait(), settings.registry_reconcile_interval_s)
        except TimeoutError:
            pass
