"""The probe's plan and verdict: strangers are mixed in, and a leak fails the run even with --allow-missing."""

from __future__ import annotations

from canary.probe import STRANGER_EVERY, ProbeRun, plan
from canary.probe_setup import ProbeTarget


def _targets(n: int) -> list[ProbeTarget]:
    return [
        ProbeTarget(f"c{i}", f"canary-{i}", f"canary-{i}/marker:probe", f"key{i}", f"ZQX-{i:04d}-KV", 8)
        for i in range(n)
    ]


def test_plan_mixes_owners_and_strangers_over_every_canary() -> None:
    planned = plan(_targets(3), 60)
    strangers = [p for p in planned if p.caller is not p.target]
    assert len(planned) == 60 and len(strangers) == 60 // STRANGER_EVERY
    assert all(p.caller.tenant_id != p.target.tenant_id for p in strangers)
    assert {p.target.adapter_id for p in planned} == {"c0", "c1", "c2"}
    assert {p.target.adapter_id for p in strangers} == {"c0", "c1", "c2"}


def test_a_single_canary_gets_no_stranger_requests() -> None:
    assert all(p.caller is p.target for p in plan(_targets(1), 10))


def test_clean_run_passes_and_reports_ttft_by_tier() -> None:
    run = ProbeRun()
    run.tally.record("r1", "c0", {"c0"})
    run.stranger_requests = 1
    run.ttft_s = {"gpu": [0.1, 0.2, 0.3], "disk": [0.5]}
    summary = run.summary(allow_missing=False, wall_s=1.0)
    assert summary["ok"] and summary["requests"] == 2
    assert summary["ttft_ms"] == {"p50": 250.0, "p95": 500.0}
    assert summary["ttft_ms_by_tier"]["gpu"]["p50"] == 200.0


def test_cross_tenant_success_fails_even_when_missing_markers_are_allowed() -> None:
    run = ProbeRun()
    run.tally.record("r1", "c0", {"c0"})
    run.cross_tenant_success = 1
    assert not run.ok(allow_missing=True)


def test_wrong_marker_fails_and_missing_marker_fails_only_without_allow_missing() -> None:
    leaked = ProbeRun()
    leaked.tally.record("r1", "c0", {"c0", "c1"})
    assert not leaked.ok(allow_missing=True)
    missing = ProbeRun()
    missing.tally.record("r1", "c0", set())
    assert not missing.ok(allow_missing=False) and missing.ok(allow_missing=True)
