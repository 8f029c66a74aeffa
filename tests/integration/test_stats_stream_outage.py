"""The stats stream through a Kafka outage, on a private broker and PostgreSQL (harness/stacks/outage.py: private_infra):
a window is closed, the broker is stopped and started again, and a window after the restart is closed too,
with no manual step and nothing counted twice in adapter_stats."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

import pytest

from harness.ports import free_port
from harness.stacks.outage import infra_env, missing_local_infra, private_infra
from ops.stack import kafka
from schemas.events import AdapterStats, parse_event
from schemas.topics import ADAPTER_STATS
from stats_stream.windows import from_ms, to_ms, window_start
from tests.integration.kafka_helpers import read_to_end
from tests.integration.test_stats_stream import (
    WINDOW_S,
    Stream,
    mid_window,
    publish,
    requests_for,
    stats_row,
    stream_env,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(missing_local_infra() is not None, reason=str(missing_local_infra())),
]

OUTAGE_S = 20.0  # past the stream's 6 s session timeout: its group membership expires while it is down


async def test_the_stream_closes_windows_again_after_the_broker_restarts(services, tmp_path) -> None:
    run = uuid.uuid4().hex[:8]
    async with private_infra(services.settings()) as settings:
        env = {
            **infra_env(settings),
            **stream_env(f"lorafleet-stats-outage-{run}", run, tmp_path / "faust"),
        }
        stream = Stream(env, tmp_path / "stats-stream.log")
        stream.start()
        try:
            await stream.wait_for("lorafleet_stats_ticks_total", 1, timeout=180)
            at = mid_window()
            before = requests_for(run, f"a-{run}-before", f"t-{run}", 3, at, tier="gpu", ttft_s=0.1)
            await publish(settings.kafka_bootstrap, before)
            window = from_ms(window_start(to_ms(at), int(WINDOW_S * 1000)))
            assert (await stats_row(settings.database_url, f"a-{run}-before", window))["requests"] == 3

            # a window open when the broker goes: it closes while its outputs cannot be sent
            at = mid_window()
            during = requests_for(run, f"a-{run}-during", f"t-{run}", 2, at, tier="gpu", ttft_s=0.1)
            await publish(settings.kafka_bootstrap, during)
            window_during = from_ms(window_start(to_ms(at), int(WINDOW_S * 1000)))
            down_at = time.monotonic()
            await asyncio.to_thread(kafka.down, settings)
            await asyncio.sleep(OUTAGE_S)
            await asyncio.to_thread(kafka.up, settings)
            outage_s = time.monotonic() - down_at

            up_at = time.monotonic()
            at = mid_window()
            after = requests_for(run, f"a-{run}-after", f"t-{run}", 4, at, tier="gpu", ttft_s=0.1)
            await publish(settings.kafka_bootstrap, after)
            window_after = from_ms(window_start(to_ms(at), int(WINDOW_S * 1000)))
            row = await stats_row(settings.database_url, f"a-{run}-after", window_after, timeout=180)
            healthy_s = time.monotonic() - up_at
            assert row["requests"] == 4
            assert (await stats_row(settings.database_url, f"a-{run}-during", window_during))["requests"] == 2
            again = await stats_row(settings.database_url, f"a-{run}-before", window)
            assert again["requests"] == 3  # closed before the outage; replayed input counts nothing twice
            # a window closed again after a crash or replay publishes the same event id: consumers dedupe it
            published = [
                parse_event(r.value) for r in await read_to_end(settings.kafka_bootstrap, ADAPTER_STATS.name)
            ]
            ids: dict[str, set[str]] = {}
            for e in published:
                if isinstance(e, AdapterStats) and e.adapter_id.startswith(f"a-{run}-"):
                    ids.setdefault(e.adapter_id, set()).add(str(e.event_id))
            assert {a: len(i) for a, i in ids.items()} == {
                f"a-{run}-before": 1,
                f"a-{run}-during": 1,
                f"a-{run}-after": 1,
            }
            print(
                f"STATS-OUTAGE broker down {outage_s:.1f}s (stop + {OUTAGE_S:.0f}s + start); the window after "
                f"the restart in adapter_stats {healthy_s:.1f}s after the broker answered again"
            )
        finally:
            stream.stop()


def test_a_start_while_kafka_is_down_exits_at_once_for_supervision_to_retry(tmp_path) -> None:
    env = {
        **os.environ,
        "LORAFLEET_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",  # nothing listens there
        "LORAFLEET_STATS_METRICS_PORT": "0",
        "LORAFLEET_STATS_DATA_DIR": str(tmp_path / "faust"),
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "lorafleet.cli", "stats-stream"], env=env, capture_output=True, timeout=120
    )
    assert done.returncode != 0 and b"KafkaConnectionError" in done.stdout + done.stderr
    assert time.monotonic() - started < 60
