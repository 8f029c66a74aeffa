"""A closed window's tenant rows, written by the stats stream's sink into the real PostgreSQL and read back
by the console's registry view: latencies per window, the bill charged by request-seconds, and several
windows combined (requests and tokens add, p95 is the highest window's)."""

from __future__ import annotations

import time

import pytest

from gateway.console.overview import tenant_stats
from stats_stream.closing import close_window
from stats_stream.config import SignalSettings
from stats_stream.signals import ScaleState
from stats_stream.sinks import write_tenant_stats
from stats_stream.windows import window_start
from tests.stats_stream.builders import request, state

pytestmark = pytest.mark.integration

S = SignalSettings(window_s=60, gpu_hour_usd=3.6)


async def test_the_console_reads_each_tenants_figures_from_the_stream_s_tenant_rows(pool) -> None:
    now_ms = int(time.time() * 1000)
    windows = [window_start(now_ms, 60_000) - 60_000 * i for i in (1, 2)]
    first = [request(tenant="acme", ttft=0.1, completion=90, prompt=10, total_s=3.0) for _ in range(4)]
    first += [request(tenant="globex", ttft=0.5, completion=40, prompt=10, total_s=1.0) for _ in range(2)]
    second = [request(tenant="acme", ttft=0.3, completion=90, prompt=10, total_s=3.0) for _ in range(4)]
    replicas = [state("rep-1")]
    for window_ms, events in zip(windows, (first, second), strict=True):
        report = close_window(window_ms, [*events, *replicas], ScaleState(), S)
        await write_tenant_stats(pool, report, S.window_s)
        await write_tenant_stats(pool, report, S.window_s)  # a window closed twice changes nothing

    acme, globex = await tenant_stats(pool)
    assert (acme.tenant_id, acme.requests, acme.tokens) == ("acme", 8, 800)
    assert acme.p50_ttft_s == pytest.approx(0.2)  # the request-weighted mean of the windows' p50s
    assert acme.p95_ttft_s == pytest.approx(0.3)  # the highest window p95
    assert acme.tokens_per_s == pytest.approx(800 / 120)
    # one replica at $3.6/h is $0.06 a window; acme held 12 of the first window's 14 request-seconds
    bill = 0.06 * 12 / 14 + 0.06
    assert acme.usd_per_million_tokens == pytest.approx(bill / 800 * 1e6)
    assert (globex.requests, globex.tokens, globex.p95_ttft_s) == (2, 100, 0.5)
    assert globex.usd_per_million_tokens == pytest.approx(0.06 * 2 / 14 / 100 * 1e6)
