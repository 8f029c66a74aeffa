from datetime import UTC, datetime, timedelta

from gateway.console.fleet_snapshot import FORGET_AFTER_S, fleet_snapshot, gpu_hit_rate, phase
from schemas.console import AdapterWindow, AlertView
from schemas.events import ReplicaState

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def window(adapter_id: str, requests: int, hit: float) -> AdapterWindow:
    return AdapterWindow(
        adapter_id=adapter_id, window_start=T0, requests=requests, tokens_per_s=1.0, gpu_hit_rate=hit
    )


def alert(kind: str, subject: str) -> AlertView:
    return AlertView(
        occurred_at=T0, subject=subject, kind=kind, severity="warning", message="", value=1, threshold=0
    )


def test_phase_is_the_reported_status_merged_when_merged_and_stale_when_old() -> None:
    warming = ReplicaState(replica_id="r1", url="http://r1", status="warming")
    merged = ReplicaState(replica_id="r2", url="http://r2", merged_adapter_id="a")
    assert phase(warming, 0.5, 3.0) == "warming"
    assert phase(merged, 0.5, 3.0) == "merged"
    assert phase(ReplicaState(replica_id="r3", url="http://r3", status="draining"), 0.5, 3.0) == "draining"
    assert phase(warming, 3.5, 3.0) == "stale"


def test_gpu_hit_rate_is_weighted_by_requests_and_none_without_requests() -> None:
    assert gpu_hit_rate([window("a", 30, 1.0), window("b", 10, 0.0)]) == 0.75
    assert gpu_hit_rate([window("a", 0, 1.0)]) is None


def test_the_snapshot_keeps_recent_replicas_and_the_stats_of_the_adapters_they_hold() -> None:
    held = ReplicaState(replica_id="r1", url="http://r1", gpu_adapters=["a"], disk_adapters=["b"])
    gone = ReplicaState(replica_id="r9", url="http://r9", ram_adapters=["c"])
    windows = [window("a", 10, 1.0), window("b", 10, 0.0), window("other-fleet", 100, 0.0)]
    alerts = [alert("thrashing", "r1"), alert("thrashing", "other-fleet-0"), alert("slo_ttft", "acme")]
    states = [(held, 1.0), (gone, FORGET_AFTER_S + 1)]
    hit_rates = {"r1": 0.25}
    snap = fleet_snapshot(states, windows, alerts, 3.0, "r", hit_rates, at=T0 + timedelta(1))
    assert [r.replica_id for r in snap.replicas] == ["r1"]
    assert (snap.replicas[0].phase, snap.replicas[0].age_s, snap.replicas[0].gpu_hit_rate) == (
        "ready",
        1.0,
        0.25,
    )
    assert [w.adapter_id for w in snap.adapter_stats] == ["a", "b"]
    assert snap.gpu_hit_rate == 0.5
    assert [a.subject for a in snap.alerts] == ["r1", "acme"]  # not another fleet's replica
