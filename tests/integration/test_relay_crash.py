"""A relay killed between publish and mark-sent loses nothing, and the consumer applies each event once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid

import pytest

from lorafleet.outbox.idempotency import apply_once
from lorafleet.outbox.writer import emit, outbox_transaction
from schemas.events import AliasChanged, parse_event
from schemas.topics import ALIASES_CHANGED
from tests.integration.kafka_helpers import collect

pytestmark = pytest.mark.integration


def _relay(services, db_url: str, fault: str | None) -> subprocess.Popen:
    env = {
        **os.environ,
        **services.env(),
        "LORAFLEET_DATABASE_URL": db_url,
        "LORAFLEET_RELAY_POLL_INTERVAL_S": "0.05",
        "LORAFLEET_RELAY_METRICS_PORT": "0",  # no /metrics: a running stack's relay may hold the default port
    }
    env.pop("LORAFLEET_RELAY_FAULT", None)
    if fault:
        env["LORAFLEET_RELAY_FAULT"] = fault
    return subprocess.Popen(
        [sys.executable, "-m", "lorafleet.cli", "relay"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


async def test_relay_killed_after_publish_before_mark_sent_loses_nothing_and_doubles_nothing(
    pool, services, migrated_db
) -> None:
    run = uuid.uuid4().hex[:6]
    events = [
        AliasChanged(alias=f"c{run}/a:prod", tenant_id=f"c{run}", adapter_id=f"v{i}", revision=i + 1)
        for i in range(50)
    ]
    for e in events:
        async with outbox_transaction(pool) as conn:
            await emit(conn, e)

    crashing = _relay(services, migrated_db, "crash_after_publish")
    try:
        code = await asyncio.to_thread(crashing.wait, 60)
    finally:
        if crashing.poll() is None:
            crashing.kill()
    assert code == 17, crashing.stdout.read().decode()[-2000:]
    # Kafka has the batch, but the rows were never marked sent.
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 50

    restarted = _relay(services, migrated_db, None)
    try:
        for _ in range(200):
            if await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0:
                break
            await asyncio.sleep(0.1)
    finally:
        restarted.terminate()
        await asyncio.to_thread(restarted.wait, 20)
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0

    wanted = {str(e.event_id) for e in events}
    records = await collect(
        services.kafka_bootstrap,
        ALIASES_CHANGED.name,
        want=lambda rs: len(rs) >= 2 * len(events),  # every event twice: once before the crash, once after
        accept=lambda r: json.loads(r.value)["event_id"] in wanted,
        timeout=30,
    )
    assert {json.loads(r.value)["event_id"] for r in records} == wanted
    assert len(records) == 100  # at-least-once: the crashed batch was published again

    await pool.execute("CREATE TABLE effects (event_id uuid)")
    applied = 0
    for r in records:
        event = parse_event(r.value, ALIASES_CHANGED.name)
        async with pool.acquire() as conn:
            did, _ = await apply_once(
                conn,
                "alias-cache",
                event.event_id,
                lambda c, e=event: c.execute("INSERT INTO effects VALUES ($1)", e.event_id),
            )
            applied += did
    assert applied == 50
    assert await pool.fetchval("SELECT count(*) FROM effects") == 50
