"""The noisy-neighbour scenario's trace and summary on plain values."""

from __future__ import annotations

from loadtest.client import RequestRecord
from loadtest.noisy import NoisyConfig, arrivals, in_burst, summarise

CFG = NoisyConfig("http://gw", "globex/sales:prod", "acme/support:prod", {}, rate=2.0, duration_s=60.0)


def test_the_noisy_tenant_sends_burst_factor_times_its_rate_inside_the_burst_only() -> None:
    trace = arrivals(CFG)
    assert trace == sorted(trace, key=lambda a: a.at_s) and all(0 <= a.at_s < 60 for a in trace)

    def rate(model: str, burst: bool) -> float:
        span = CFG.burst_s if burst else CFG.duration_s - CFG.burst_s
        return sum(1 for a in trace if a.tenant_model == model and in_burst(CFG, a.at_s) == burst) / span

    assert 6 <= rate("acme/support:prod", True) / rate("acme/support:prod", False) <= 16
    assert 0.5 <= rate("globex/sales:prod", True) / rate("globex/sales:prod", False) <= 2


def test_summary_counts_ttft_over_the_burst_per_tenant() -> None:
    def rec(model: str, at: float, ttft: float, status: int = 200) -> RequestRecord:
        return RequestRecord(0, 2.0, model, 8, 4, arrival_s=at, status=status, ttft_s=ttft)

    quiet, noisy = CFG.quiet_model, CFG.noisy_model
    records = [rec(quiet, 25, 0.2), rec(quiet, 30, 2.0), rec(quiet, 5, 9.0), rec(noisy, 30, 3.0, 200)]
    records.append(rec(noisy, 31, -1.0, 429))
    s = summarise(CFG, records)
    assert s["quiet"]["in_burst"] == 2 and s["quiet"]["over_slo_in_burst"] == 1
    assert s["quiet"]["ttft_in_burst_s"]["p50"] == 1.1
    assert s["noisy"]["status"] == {"200": 1, "429": 1} and s["noisy"]["ttft_in_burst_s"]["p95"] == 3.0
