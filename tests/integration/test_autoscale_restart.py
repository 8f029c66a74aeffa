"""The autoscaler killed mid-start comes back from its records: one new replica, never two.

A real stack: replica 0 (not the autoscaler's) publishing replica.state, the stats stream whose signal
floor of two replicas makes it ask for one more, the placement worker and relay a new replica warms
through, and the autoscaler. The autoscaler is SIGKILLed after it
started replica 1 and before that replica is ready, then started again.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from harness.stacks.scaleup import ScaleupConfig, scaleup_stack, wait_for
from ops.autoscale.local import STARTED

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_an_autoscaler_killed_mid_start_neither_leaves_nor_doubles_the_new_replica(
    services, tmp_path: Path
) -> None:
    cfg = ScaleupConfig(gateway=False, stats_min_replicas=2, max_replicas=2, cooldown_s=0.0)
    async with scaleup_stack(services.settings(), tmp_path, cfg) as stack:
        recs = stack.records()
        first = stack.autoscaler("first")
        first.start()
        await wait_for(lambda: recs.live(), 60, "the autoscaler to start replica 1", stack)
        [started] = recs.live()
        assert started.index == 1 and not started.was_ready
        state = await stack.state(1)
        assert state is None or state.status != "ready", "replica 1 was ready before the kill"
        first.kill()

        ours = [pid for pid in stack.replica_processes() if pid == started.pid]
        assert ours == [started.pid], "killing the autoscaler took its replica with it"

        second = stack.autoscaler("second")
        second.start()
        seen: set[int] = set()

        async def one_ready() -> bool:
            pids = stack.replica_processes()
            seen.update(pids)
            assert len(pids) <= 2, f"a second new replica was started: {pids}"
            state = await stack.state(1)
            return state is not None and state.status == "ready" and bool(recs.live()[0].was_ready)

        await wait_for(one_ready, 90, "replica 1 ready under the restarted autoscaler", stack)
        # it keeps the one replica: nothing else starts while the signal holds at two
        until = time.monotonic() + 3 * cfg.window_s
        while time.monotonic() < until:
            pids = stack.replica_processes()
            seen.update(pids)
            assert len(pids) == 2, pids
            await asyncio.sleep(0.3)
        assert [r.pid for r in recs.live()] == [started.pid]
        assert len(seen) == 2, f"processes seen serving this stack's replicas: {sorted(seen)}"
        assert not STARTED.search(second.log.read_text()), second.tail()
        assert second.alive, second.tail()
