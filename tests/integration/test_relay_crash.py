"""A relay killed between publish and mark-sent loses nothing, and the consumer applies each event once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from lorafleet.outbox.idempotency import apply_once
from lorafleet.outbox.writer import emit, outbox_transaction
from schemas.events import AliasChanged, parse_event
from schemas.topics import ALIASES_CHANGED
from tests.integration.kafka_helpers import read_to_end
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.integration


BATCH = 20  # the relay's batch size, set here: the crash republishes exactly the first batch


def _relay(services, db_url: str, fault: str | None, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        **services.env(),
        "LORAFLEET_DATABASE_URL": db_url,
        "LORAFLEET_RELAY_POLL_INTERVAL_S": "0.05",
        "LORAFLEET_RELAY_BATCH_SIZE": str(BATCH),
        "LORAFLEET_RELAY_METRICS_PORT": "0",  # no /metrics: a running stack's relay may hold the default port
    }
    env.pop("LORAFLEET_RELAY_FAULT", None)
    if fault:
        env["LORAFLEET_RELAY_FAULT"] = fault
    with log.open("ab") as out:  # a file, not a pipe nobody reads: a chatty relay never blocks on it
        return subprocess.Popen(
            [sys.executable, "-m", "lorafleet.cli", "relay"], env=env, stdout=out, stderr=subprocess.STDOUT
        )


async def test_relay_killed_after_publish_before_mark_sent_loses_nothing_and_doubles_nothing(
    pool, services, migrated_db, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:6]
    events = [
        AliasChanged(alias=f"c{run}/a:prod", tenant_id=f"c{run}", adapter_id=f"v{i}", revision=i + 1)
        for i in range(50)
    ]
    for e in events:
        async with outbox_transaction(pool) as conn:
            await emit(conn, e)
    log = tmp_path / "relay.log"

    crashing = _relay(services, migrated_db, "crash_after_publish", log)
    try:
        code = await asyncio.to_thread(crashing.wait, 60)
    finally:
        if crashing.poll() is None:
            crashing.kill()
    assert code == 17, log.read_text()[-2000:]
    # Kafka has the first batch, but its rows were never marked sent (nor any later row).
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 50

    async def all_sent() -> bool:
        return await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL") == 0

    restarted = _relay(services, migrated_db, None, log)
    try:
        await wait_until(all_sent, "the restarted relay to publish every row", timeout=90)
    finally:
        restarted.terminate()
        await asyncio.to_thread(restarted.wait, 20)

    wanted = {str(e.event_id) for e in events}
    records = await read_to_end(
        services.kafka_bootstrap,
        ALIASES_CHANGED.name,
        accept=lambda r: json.loads(r.value)["event_id"] in wanted,
    )
    deliveries = Counter(json.loads(r.value)["event_id"] for r in records)
    # at-least-once: the crashed batch was published again, and nothing else twice
    assert deliveries == {str(e.event_id): 2 if i < BATCH else 1 for i, e in enumerate(events)}

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
