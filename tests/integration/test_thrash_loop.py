"""Thrashing closes the loop on the real stack: a replica whose active set outgrows its GPU slots makes the
stats stream ask for a replica, the autoscaler starts it, placement moves half the adapters to it, the
router sends their traffic there, and the first replica's evictions per request fall. Then the run goes on
past the scale-down decision: once the thrash is gone the signal falls back to one replica, and the
autoscaler, which remembers it started the second one for thrashing, keeps it while the four adapters
still need both replicas' slots, so the thrash does not come back.

Real processes throughout: replicas (2 GPU slots each), the public gateway (cost routing, its default), the
stats stream (2 s windows), the relay, the placement worker and the autoscaler, on the shared Kafka and
PostgreSQL. The four adapters are picked so that rendezvous gives each replica two of them, so the fleet of
two holds every active adapter in a slot and the expected fall is to no evictions at all.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path

import httpx
import pytest

from harness.stacks.scaleup import ScaleupConfig, ScaleupStack, new_run_id, scaleup_stack, wait_for
from schemas.events import Alert, AutoscaleSignal, parse_event
from schemas.rendezvous import owners
from schemas.topics import ALERTS, AUTOSCALE_SIGNALS
from tests.integration.kafka_helpers import read_to_end

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EVICTIONS = re.compile(r'^lorafleet_replica_adapter_evictions_total\{tier="gpu"\} (\S+)$', re.M)
REQUESTS = re.compile(r"^vllm:request_success_total\{[^}]*\} (\S+)$", re.M)


def _balanced_adapters(run: str) -> dict[str, str]:
    """Four adapter ids (-> aliases), two whose rendezvous home among the stack's two replicas is each."""
    r0, r1 = f"as{run}-0", f"as{run}-1"
    picked: dict[str, list[str]] = {r0: [], r1: []}
    for i in itertools.count():
        adapter = f"acme-thrash-{i}"
        home = owners(adapter, [r0, r1], 1)[0]
        if len(picked[home]) < 2:
            picked[home].append(adapter)
        if all(len(v) == 2 for v in picked.values()):
            break
    return {a: f"acme/{a.removeprefix('acme-')}:prod" for a in (*picked[r0], *picked[r1])}


def _config(run: str) -> ScaleupConfig:
    return ScaleupConfig(
        run=run,
        adapters=_balanced_adapters(run),
        max_num_seqs=4,
        unmanaged=1,
        max_replicas=2,
        stats_min_replicas=1,
        queue_per_replica=1000,  # no replica for queueing: only thrashing asks for one here
        scale_down_windows=5,  # the default hysteresis: the signal falls 5 quiet windows (10 s) on
        env={
            "LORAFLEET_REPLICA_LORA_SLOTS": '{"8": 2}',
            "LORAFLEET_STATS_THRASH_EVICTIONS_PER_MIN": "20",
            "LORAFLEET_PLACEMENT_DEFAULT_OWNERS": "1",
            "LORAFLEET_GATEWAY_OWNERS_K": "1",
            "LORAFLEET_PLACEMENT_GPU_TOKENS_PER_S": "1000000",  # slots are the replicas' LRU alone
            "LORAFLEET_PLACEMENT_MERGE_TOKENS_PER_S": "1000000",
        },
    )


async def _counters(stack: ScaleupStack, index: int) -> tuple[float, float]:
    """(GPU evictions, requests) so far, from the replica's own /metrics."""
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"{stack.replica_url(index)}/metrics", timeout=5)).text
    return sum(map(float, EVICTIONS.findall(text))), sum(map(float, REQUESTS.findall(text)))


async def _evictions_per_request(stack: ScaleupStack, index: int, served: int) -> float:
    """Evictions per request on one replica over the next `served` requests it serves."""
    ev0, req0 = await _counters(stack, index)

    async def enough() -> bool:
        return (await _counters(stack, index))[1] >= req0 + served

    await wait_for(enough, 180, f"{served} requests on replica {index}", stack)
    ev1, req1 = await _counters(stack, index)
    return (ev1 - ev0) / (req1 - req0)


async def _signals(stack: ScaleupStack) -> list[AutoscaleSignal]:
    """The stack's fleet's autoscale signals so far."""
    bootstrap = stack.env["LORAFLEET_KAFKA_BOOTSTRAP"]
    return [
        s
        for r in await read_to_end(bootstrap, AUTOSCALE_SIGNALS.name)
        if isinstance(s := parse_event(r.value, AUTOSCALE_SIGNALS.name), AutoscaleSignal)
        and s.fleet == stack.fleet
    ]


async def test_a_thrashing_replica_gets_a_second_replica_its_evictions_fall_and_stay_down(
    services, tmp_path: Path
) -> None:
    run = new_run_id()
    cfg = _config(run)
    async with scaleup_stack(services.settings(), tmp_path, cfg) as stack:
        autoscaler = stack.autoscaler()
        autoscaler.start()
        stop = asyncio.Event()
        failures: list[str] = []

        async def client(offset: int) -> None:
            aliases = itertools.islice(itertools.cycle(cfg.adapters.values()), offset, None)
            headers = {"Authorization": f"Bearer {stack.key}"}
            async with httpx.AsyncClient(base_url=stack.gateway_url, headers=headers, timeout=120) as c:
                for alias in aliases:
                    if stop.is_set():
                        return
                    body = {"model": alias, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2}
                    resp = await c.post("/v1/chat/completions", json=body)
                    if resp.status_code != 200:
                        failures.append(f"{resp.status_code} {resp.text[:200]}")

        clients = [asyncio.create_task(client(offset)) for offset in (0, 2)]
        try:
            # One replica, four adapters cycling through two slots: nearly every request evicts.
            before = await _evictions_per_request(stack, 0, 12)

            async def second_ready() -> bool:
                state = await stack.state(1)
                return state is not None and state.status == "ready"

            await wait_for(second_ready, 240, "the autoscaler's replica 1 ready", stack)

            async def homes_hold() -> bool:
                state = await stack.state(1)
                held = set(state.gpu_adapters) if state else set()
                return held == set(list(cfg.adapters)[2:])

            await wait_for(homes_hold, 120, "replica 1 to hold its two adapters in its slots", stack)
            after = await _evictions_per_request(stack, 0, 12)

            # Past the scale-down decision: the signal asks for one replica, the autoscaler keeps two.
            async def scale_down_asked() -> bool:
                return any(s.desired_replicas == 1 and s.current_replicas == 2 for s in await _signals(stack))

            await wait_for(scale_down_asked, 90, "the signal to fall back to one replica", stack)
            await asyncio.sleep(2 * 2.0 + 5.0)  # two more windows and the autoscaler's cooldown
            kept = await stack.state(1)
            later = await _evictions_per_request(stack, 0, 12)
        finally:
            stop.set()
            await asyncio.gather(*clients)
        assert not failures, failures[:3]
        assert before >= 0.5, f"the single replica should thrash: {before:.2f} evictions/request"
        assert after <= before / 4, f"evictions/request {before:.2f} -> {after:.2f}"
        assert kept is not None and kept.status == "ready", "the replica added for thrashing was drained"
        assert later <= before / 4, f"the thrash came back: evictions/request {before:.2f} -> {later:.2f}"
        assert "started for thrashing and its adapters still need 2" in autoscaler.tail(20_000)

        # What moved the fleet: the stats stream's thrashing alert and its signal for one replica more.
        bootstrap = stack.env["LORAFLEET_KAFKA_BOOTSTRAP"]
        signals = await _signals(stack)
        assert any(s.desired_replicas == 2 and s.thrashing_replicas == 1 for s in signals), [
            s.reason for s in signals
        ]
        assert any(s.slot_demand == 2 and s.active_adapters == 4 for s in signals)
        alerts = [
            a
            for r in await read_to_end(bootstrap, ALERTS.name)
            if isinstance(a := parse_event(r.value, ALERTS.name), Alert)
        ]
        assert any(a.kind == "thrashing" and a.subject == stack.replica_id(0) for a in alerts)
