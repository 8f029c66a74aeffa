import pytest

from stats_stream.aggregates import (
    adapter_windows,
    dedupe,
    fleet_load,
    percentile,
    replica_churn,
    slot_demand,
    tenant_costs,
    tenant_latencies,
    tier_shares,
)
from tests.stats_stream.builders import replica_event, request, state


def test_an_event_delivered_twice_is_kept_once() -> None:
    a, b = request(), request()
    assert dedupe([a, b, a, a, b]) == [a, b]


def test_adapter_window_counts_requests_tokens_per_second_and_gpu_hits() -> None:
    reqs = [
        request("a1", tier="gpu", completion=300),
        request("a1", tier="gpu", completion=300),
        request("a1", tier="ram", completion=300),
        request("a1", tier=None, completion=0, status="error"),
        request("a2", tier="remote", completion=60),
    ]
    out = adapter_windows(reqs, window_s=60)
    assert out["a1"].requests == 4
    assert out["a1"].tokens_per_s == pytest.approx(900 / 60)
    assert out["a1"].gpu_hit_rate == pytest.approx(0.5)
    assert out["a2"].gpu_hit_rate == 0.0
    assert out["a2"].tokens_per_s == pytest.approx(1.0)


def test_adapter_window_reports_each_versions_errors_and_ttft_apart() -> None:
    current = [request("v7", ttft=0.1 * i) for i in range(1, 21)]
    canary = [request("v8", ttft=0.5), request("v8", ttft=0.7), request("v8", ttft=None, status="error")]
    out = adapter_windows(current + canary, window_s=60)
    assert (out["v7"].errors, out["v7"].p50_ttft_s, out["v7"].p95_ttft_s) == (
        0,
        pytest.approx(1.0),
        pytest.approx(1.9),
    )
    assert (out["v8"].requests, out["v8"].errors, out["v8"].p50_ttft_s, out["v8"].p95_ttft_s) == (
        3,
        1,
        0.5,
        0.7,
    )
    failing = adapter_windows([request("v9", ttft=None, status="error")], window_s=60)["v9"]
    assert (failing.errors, failing.p50_ttft_s, failing.p95_ttft_s) == (1, None, None)


def test_tier_shares_split_requests_by_where_the_adapter_was_found() -> None:
    shares = tier_shares([request(tier="gpu"), request(tier="gpu"), request(tier="ram"), request(tier=None)])
    assert shares == {"gpu": 0.5, "ram": 0.25, "disk": 0.0, "remote": 0.0}
    assert tier_shares([]) == {"gpu": 0.0, "ram": 0.0, "disk": 0.0, "remote": 0.0}


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        percentile([], 95)


def test_tenant_latency_uses_only_successful_requests_with_a_ttft() -> None:
    reqs = [request(tenant="acme", ttft=t / 10) for t in range(1, 21)]
    reqs += [
        request(tenant="acme", ttft=None, status="error"),
        request(tenant="acme", ttft=9.0, status="cancelled"),
    ]
    reqs += [request(tenant="globex", ttft=0.05)]
    out = tenant_latencies(reqs)
    assert out["acme"].requests == 20
    assert out["acme"].p50_ttft_s == pytest.approx(1.0)
    assert out["acme"].p95_ttft_s == pytest.approx(1.9)
    assert out["globex"].p95_ttft_s == pytest.approx(0.05)


def test_replica_churn_is_per_minute_whatever_the_window() -> None:
    events = [replica_event("rep-1", "evict") for _ in range(10)] + [
        replica_event("rep-1", "load") for _ in range(4)
    ]
    events += [replica_event("rep-2", "load")]
    out = replica_churn(events, window_s=30)
    assert out["rep-1"].evictions_per_min == pytest.approx(20.0)
    assert out["rep-1"].loads_per_min == pytest.approx(8.0)
    assert out["rep-2"].evictions == 0 and out["rep-2"].loads == 1


def test_fleet_load_sums_each_replicas_mean_and_counts_draining_only_for_the_bill() -> None:
    states = [state("rep-1", queue=q, tokens=1000, t=i) for i, q in enumerate([2, 4, 6])]
    states += [state("rep-2", queue=10, tokens=3000, t=1), state("rep-2", queue=0, status="draining", t=2)]
    load = fleet_load(states)
    assert load.queue_depth == pytest.approx(4 + 5)
    assert load.tokens_in_flight == pytest.approx(1000 + 1500)
    assert load.serving_replicas == 1
    assert load.billed_replicas == 2
    assert load.joining_replicas == 0
    joining = fleet_load(
        [state("rep-3", status="warming"), state("rep-4", status="starting"), state("rep-5")]
    )
    assert (joining.serving_replicas, joining.joining_replicas) == (3, 2)


def test_the_whole_gpu_bill_is_split_by_request_seconds() -> None:
    reqs = [
        request(tenant="acme", total_s=3.0, prompt=0, completion=1000),
        request(tenant="globex", total_s=1.0, prompt=0, completion=1000),
    ]
    out = tenant_costs(reqs, billed_replicas=2, window_s=3600, gpu_hour_usd=2.5)
    assert out["acme"].cost_usd + out["globex"].cost_usd == pytest.approx(5.0)
    assert out["acme"].cost_usd == pytest.approx(3.75)
    assert out["acme"].usd_per_million_tokens == pytest.approx(3750.0)
    assert out["globex"].usd_per_million_tokens == pytest.approx(1250.0)


def test_a_tenant_without_tokens_has_no_per_million_price() -> None:
    out = tenant_costs([request(tenant="acme", prompt=0, completion=0, total_s=0.5)], 1, 60, 2.5)
    assert out["acme"].usd_per_million_tokens is None
    assert out["acme"].cost_usd == pytest.approx(2.5 / 60)


def test_slot_demand_is_the_active_adapters_over_the_smallest_replicas_slots() -> None:
    requests = [request(f"a{i % 7}") for i in range(30)]  # 7 distinct adapters, on rep-1
    states = [state("rep-1", gpu_slots=4, t=1), state("rep-2", gpu_slots=3, t=1), state("rep-2", t=2)]
    demand = slot_demand(requests, states[:2])
    assert (demand.active_adapters, demand.slots_per_replica, demand.replicas) == (7, 3, 3)
    # the newest state of each replica counts: rep-2 reports no slots now (a merged or base-only replica)
    assert slot_demand(requests, states).replicas == 2
    draining = [state("rep-1", gpu_slots=4), state("rep-2", gpu_slots=1, status="draining")]
    assert slot_demand(requests, draining).replicas == 2
    assert slot_demand(requests, [state("rep-1")]).replicas == 0  # slots unknown: no claim
    elsewhere = [request("b", t=1).model_copy(update={"replica_id": "other-1"})]
    assert slot_demand(elsewhere, states[:2]).active_adapters == 0  # another fleet's replica
