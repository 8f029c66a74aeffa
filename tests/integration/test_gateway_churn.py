"""Isolation under churn end to end: canary streams through the real public gateway to two real replica
processes with one GPU slot each, while every alias moves to a new canary version and a replica is
SIGKILLed mid-run.

Two tenants each call one alias with two canary versions; four versions on one slot per replica keep
forcing GPU evictions, and host RAM for two canaries evicts when a replica gets three. Pass: every complete
answer carries exactly the marker of the version its x-adapter-id names (no other tenant's, no mix of
versions, never the base's answer); the new versions are admitted within STALENESS_BOUND_S of each move's
acknowledgement; the killed replica's requests end as 503/504 or an error event in OpenAI's shape, and
later ones are served by the survivor;
at the end the survivor holds no pin, refcount, request or engine row, the gateway holds no reservation,
and Redis saw a refund for every reservation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from canary.churn_verdict import RunEvents, judge_run
from canary.gateway_churn import GatewayChurnPlan, run_gateway_churn
from canary.manifest import CanaryManifest
from canary.probe import PROMPTS, Planned, stream_chat
from canary.probe_setup import wait_servable
from harness.canary_training import E2E_CANARIES, trained_canaries
from harness.stacks.churn import (
    ChurnStack,
    RateLedger,
    churn_stack,
    gateway_metrics,
    replica_metrics,
)
from tests.integration.services import ServiceAddresses
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.trains("e2e-canaries")]

# The canaries: E2E_CANARIES, shared with the canary probe (two tenants, a v1 and a v2 canary each).
PLAN = GatewayChurnPlan(requests=150, flip_after=50, kill_after=90, concurrency=6)
# The gateway's alias cache drops an entry on the relay's aliases.changed event; without the event the
# entry would live out its TTL (10 s). The bound is that TTL plus slack for a loaded box.
STALENESS_BOUND_S = 15.0
KILL_SETTLE_S = 10.0  # requests sent this long after the kill may still meet the dead replica
HOLDS_DEADLINE_S = 30.0
INFLIGHT_TOKENS, INFLIGHT_REQUESTS = "gateway_inflight_tokens{pool=default}", "gateway_inflight_requests"


@pytest.fixture(scope="module")
async def canaries() -> Path:
    return await asyncio.to_thread(trained_canaries, E2E_CANARIES)


@pytest.fixture(scope="module")
async def stack(
    services: ServiceAddresses, canaries: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ChurnStack]:
    async with churn_stack(services.settings(), canaries, tmp_path_factory.mktemp("gateway-churn")) as s:
        yield s


async def _no_reservations(gateway: str) -> bool:
    """The gateway holds no reservation: its in-flight tokens and requests are 0."""
    m = await gateway_metrics(gateway)
    return m.get(INFLIGHT_TOKENS) == 0 and m.get(INFLIGHT_REQUESTS) == 0


def _evictions(metrics: dict[str, float], tier: str) -> float:
    return metrics.get(f"lorafleet_replica_adapter_evictions_total{{tier={tier}}}", 0.0)


@pytest.mark.timeout(900, func_only=True)  # the fixtures' training and start-up have their own bounds
async def test_churn_through_the_gateway_keeps_every_marker_flips_cleanly_and_survives_a_kill(
    stack: ChurnStack, canaries: Path
) -> None:
    manifest = CanaryManifest.read(canaries)
    targets = [t.target for t in stack.tenants]
    tenants = [t.tenant_id for t in targets]
    await asyncio.to_thread(wait_servable, stack.gw.url, targets, time.monotonic() + 180)
    # one refunded request per tenant first: the gateway has loaded both limiter scripts into Redis before
    # the ledger starts, so every script call it logs is one that ran
    async with httpx.AsyncClient(base_url=stack.gw.url, timeout=120) as client:
        for t in targets:
            got = await stream_chat(client, Planned(f"warm-{t.tenant_id}", t, t, PROMPTS[0]), PLAN.max_tokens)
            assert got.status == 200 and not got.error, got
    await wait_until(lambda: _no_reservations(stack.gw.url), "the warm-up's reservations refunded", 30)
    async with RateLedger(stack.gw.env["LORAFLEET_REDIS_URL"]) as ledger:
        run = await run_gateway_churn(stack.gw.url, stack.tenants, PLAN, stack.flip, stack.kill_busy)

        # every admitted reservation is finished (refunded) by the gateway, and the refund reached Redis
        seen: dict[str, object] = {}

        async def reservations_returned() -> bool:
            seen["gateway_inflight"] = await _no_reservations(stack.gw.url)
            seen["ledger"] = ledgers = {t: ledger.by_tenant(t) for t in tenants}
            return bool(seen["gateway_inflight"]) and all(r == f for r, f, _ in ledgers.values())

        with contextlib.suppress(AssertionError):
            await wait_until(reservations_returned, "every reservation refunded", 30)
        ledgers = {t: ledger.by_tenant(t) for t in tenants}
    assert seen["gateway_inflight"], seen

    events = RunEvents(run.flip_started, run.flip_acked, run.killed_at, KILL_SETTLE_S)
    verdict = judge_run(
        run.answers, [t.versions for t in stack.tenants], manifest.markers(), events, STALENESS_BOUND_S
    )
    (survivor,) = stack.survivors()
    (victim_metrics,) = stack.killed.values()

    async def released() -> bool:
        m = await replica_metrics(survivor)
        return all(v == 0 for k, v in m.items() if k.startswith("lorafleet_replica_holds"))

    await wait_until(released, "the survivor's pins and refcounts back to zero", HOLDS_DEADLINE_S)
    after = await replica_metrics(survivor)
    holds = {k: v for k, v in after.items() if k.startswith("lorafleet_replica_holds")}
    summary = verdict.summary() | {
        "requests": len(run.answers),
        "wall_s": round(run.wall_s, 1),
        "flips": len(run.flip_acked),
        "gpu_evictions": {"victim": _evictions(victim_metrics, "gpu"), "survivor": _evictions(after, "gpu")},
        "ram_evictions": {"victim": _evictions(victim_metrics, "ram"), "survivor": _evictions(after, "ram")},
        "survivor_holds": holds,
        "rate_ledger": {
            t: {"reserves": r, "refunds": f, "tokens_refunded": n} for t, (r, f, n) in ledgers.items()
        },
    }
    print(json.dumps(summary))  # the run's numbers, kept in the test log

    assert len(run.answers) == PLAN.requests and summary["ok"], summary
    assert summary["wrong_marker"] == 0 and summary["missing_marker"] == 0, summary
    assert len(holds) >= 6 and not any(holds.values()), holds
    # Two aliases on one slot: after the kill the lone survivor serves both tenants' versions, so it must
    # evict. RAM evictions depend on which versions the router sent where (RAM fits two rank-16 canaries),
    # so they are counted in the summary, not required.
    assert _evictions(after, "gpu") > 0, summary
    assert verdict.served_after_kill > 0 and sum(verdict.kill_outcomes.values()) > 0, summary
    for tenant, (reserves, refunds, _) in ledgers.items():
        sent = sum(1 for a in run.answers if a.alias.startswith(tenant + "/"))
        assert reserves == refunds == sent, (tenant, ledgers[tenant], sent)
