"""Queue depth pushed over the threshold through the public API makes the autoscaler add a replica, which
is routed to only once it is ready, with its owned adapters warm by then.

The real stack of harness/stacks/scaleup.py: one replica, the public gateway, the relay, the placement
worker, the stats stream (2 s windows, a queue threshold of 3 per replica) and the autoscaler. Six streamed
requests at a time against replicas of two rows each keep four queued; nothing is published by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scaleup import run_scaleup
from harness.stacks.scaleup import ScaleupConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ORDER = (
    "threshold_crossed",
    "signal_published",
    "process_started",
    "base_loaded",
    "adapters_warm_ready",
    "first_request_served",
)


async def test_queue_over_the_threshold_adds_one_replica_that_serves_only_once_warm(
    services, tmp_path: Path
) -> None:
    cfg = ScaleupConfig(queue_per_replica=3.0, max_num_seqs=2, max_replicas=2)
    result = await run_scaleup(services.settings(), tmp_path, cfg, clients=6, max_tokens=48, timeout_s=150)
    m = result["milestones_s"]
    context = {k: v for k, v in result.items() if not k.endswith("_series")}
    assert all(m[k] is not None for k in ORDER), context
    times = [m[k] for k in ORDER]
    # a signal is stamped at the window's close and a replica's first state after its base loads; each
    # milestone comes after the one before it
    assert times == sorted(times), context
    assert m["queue_under_threshold"] is not None and m["queue_under_threshold"] > m["adapters_warm_ready"]
    assert result["requests_before_ready"] == [], context  # nothing reached it while it warmed
    assert "warming" in result["statuses_seen"], context
    warm = result["at_ready"]
    assert warm["owned_adapters"] >= 1 and warm["warm_adapters"] == warm["owned_adapters"], context
    assert result["autoscaler_starts"] == 1 and result["replica_processes_at_end"] == 2, context
    assert result["requests"]["failed"] == 0, context
