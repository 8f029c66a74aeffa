"""A Kafka outage takes no replica out of the gateway's routing: the real replica.state follower
(consume_states) on a private broker that is paused (SIGSTOP: every request to it hangs) keeps every
replica it knew live, and once the broker is back a replica that stays silent drops out after stale_s."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import asyncpg
import pytest

from gateway.public.routing.replica_view import ReplicaView, consume_states
from harness.stacks.outage import missing_local_infra, private_infra
from lorafleet.dead_letters import DeadLetters
from lorafleet.kafka import make_producer
from ops.stack import kafka
from schemas.events import ReplicaState

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(missing_local_infra() is not None, reason=str(missing_local_infra())),
]

STALE_S = 2.0
PAUSED_S = 4 * STALE_S


def _live(view: ReplicaView) -> list[str]:
    return sorted(r.replica_id for r in view.live())


async def _until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not {what} within {timeout}s"
        await asyncio.sleep(0.1)


async def test_a_paused_broker_holds_every_replica_and_a_silent_one_drops_once_it_is_back(services) -> None:
    async with private_infra(services.settings()) as settings:
        pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
        producer = make_producer(settings, request_timeout_ms=3000)
        await producer.start()
        view, ready = ReplicaView(stale_s=STALE_S), asyncio.Event()
        follower = asyncio.create_task(consume_states(settings, view, ready, DeadLetters("feed-test", pool)))
        reporting = {"feed-r0", "feed-r1"}

        async def report() -> None:  # each replica's state once every 0.5 s, as the replicas do
            while True:
                for rid in sorted(reporting):
                    state = ReplicaState(replica_id=rid, url=f"http://127.0.0.1:1/{rid}")
                    with contextlib.suppress(Exception):  # a paused broker times the send out
                        await producer.send(state.topic.name, state.to_bytes(), key=rid.encode())
                await asyncio.sleep(0.5)

        reporter = asyncio.create_task(report())
        broker = kafka.process(settings).pid()
        assert broker is not None
        try:
            await asyncio.wait_for(ready.wait(), 30)
            await _until(lambda: _live(view) == ["feed-r0", "feed-r1"], "both replicas live")
            os.kill(broker, signal.SIGSTOP)
            paused = time.monotonic()
            while time.monotonic() - paused < PAUSED_S:
                assert _live(view) == ["feed-r0", "feed-r1"], (
                    f"{time.monotonic() - paused:.1f}s into the pause"
                )
                await asyncio.sleep(0.2)
            reporting.discard("feed-r0")  # it stops reporting just as the broker comes back
            os.kill(broker, signal.SIGCONT)
            resumed = time.monotonic()
            await _until(lambda: _live(view) == ["feed-r1"], "the silent replica dropped", timeout=45)
            print(
                f"\nFEED paused {PAUSED_S:.0f}s: both held; the silent one dropped {time.monotonic() - resumed:.1f}s after"
            )
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(broker, signal.SIGCONT)
            for task in (reporter, follower):
                task.cancel()
            await asyncio.gather(reporter, follower, return_exceptions=True)
            await producer.stop()
            await pool.close()
