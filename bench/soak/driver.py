"""`lorafleet bench soak`: a fault soak with an invariant checker.

For --minutes, canary chats, alias moves and registrations run against a private stack (stack.py) while a
schedule drawn from --seed (schedule.py) kills and restarts, one at a time: the outbox relay, the registry
validator, the placement worker, a replica (SIGKILL), the Kafka broker (SIGKILL) and PostgreSQL (`pg_ctl
stop -m immediate`). After each fault the run waits until the stack is healthy again (every process up, a
chat on every alias answered, a new registration validated and applied) and records how long that took.
At the end it collects the facts (collect.py) and checks the invariants (invariants.py). Prints one JSON
object: the seed and schedule (a failure replays with --seed), counts, each invariant's verdict and
violations, and the time to healthy after each fault.

    .venv/bin/python -m lorafleet.cli bench soak --minutes 10 --seed 1 [--json-out FILE]
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from bench.soak import collect, traffic
from bench.soak.facts import Facts
from bench.soak.faults import inject
from bench.soak.invariants import chats_between, check, counts
from bench.soak.schedule import FAULTS, Fault, build_schedule
from bench.soak.stack import SoakStack, soak_stack
from canary.markers import markers_in_text
from canary.probe import PROMPTS
from harness.stacks import outage as ostack
from harness.stacks.churn import RateLedger
from lorafleet.config import PlatformSettings
from lorafleet.profile import DEV_PROFILE_ENV

log = logging.getLogger(__name__)

HEALTHY_WITHIN_S = 180.0  # a broker's JVM restart is 20-30 s on two cores; its consumers rejoin after it
SERVABLE_WITHIN_S = 300.0
PROBE_APPLIED_WITHIN_S = 30.0
FINAL_WITHIN_S = 45.0  # the alias cache's TTL (10 s), an invalidation delayed by a broker restart, slack
SETTLE_WITHIN_S = 120.0


@dataclass(frozen=True)
class SoakConfig:
    seed: int
    duration_s: float
    gap_s: tuple[float, float] = (15.0, 40.0)
    kinds: tuple[str, ...] = FAULTS
    chat_workers: int = 2
    move_every_s: float = 3.0
    register_every_s: float = 2.0


@dataclass
class Run:
    stack: SoakStack
    cfg: SoakConfig
    facts: Facts
    art: traffic.Artifact
    acked: dict[str, bool] = field(default_factory=dict)
    probes: int = 0

    async def chat_each_alias(self) -> bool:
        """One chat on every alias; whether all were answered completely."""
        async with httpx.AsyncClient(
            base_url=self.stack.infra.public_url, timeout=traffic.CHAT_TIMEOUT_S
        ) as c:
            got = [await traffic.chat(c, self.facts, t, PROMPTS[0]) for t in self.stack.tenants]
        return all(g.complete for g in got)

    async def registration_goes_through(self) -> bool:
        """A new (rejected) registration is acknowledged, validated, published and applied."""
        self.probes += 1
        adapter_id = f"soak{self.cfg.seed}-probe-{self.probes:03d}"
        tenant = self.stack.tenants[0].tenant_id
        body = traffic.registration(adapter_id, tenant, self.stack.manifest.base_model_hash, self.art, False)
        if not await traffic.register(self.stack.infra.internal_url, body, self.acked):
            return False

        async def applied() -> bool:
            return bool(
                await self.stack.pool.fetchval(
                    """SELECT count(*) FROM outbox o JOIN processed_events p
                         ON p.event_id = o.id AND p.consumer = 'placement-worker'
                       WHERE o.aggregate_type = 'adapters.validated' AND o.aggregate_id = $1""",
                    adapter_id,
                )
            )

        return await collect.poll(applied, PROBE_APPLIED_WITHIN_S)

    async def healthy(self) -> bool:
        if not self.stack.infra.all_running() or not all(r.alive for r in self.stack.replicas.values()):
            return False
        async with httpx.AsyncClient(timeout=5) as c:
            for r in self.stack.replicas.values():
                if (await c.get(f"{r.url}/health")).status_code != 200:
                    return False
        return await self.chat_each_alias() and await self.registration_goes_through()

    async def time_to_healthy(self, after: str) -> float:
        started = time.monotonic()
        if await collect.poll(self.healthy, HEALTHY_WITHIN_S, every_s=1.0):
            return round(time.monotonic() - started, 1)
        names = ("supervisor", *ostack.APPS)
        tails = "\n".join(f"--- {n}\n{self.stack.tail(n)}" for n in (*names, *self.stack.replicas))
        raise RuntimeError(f"not healthy within {HEALTHY_WITHIN_S}s after {after}\n{tails}")


async def _final_chats(run: Run) -> None:
    """The end-of-run chat on each alias, sent until it names the last acknowledged move's version (or
    FINAL_WITHIN_S passes); the last one sent is the fact the alias invariant judges."""
    expected = run.facts.expected_aliases()
    async with httpx.AsyncClient(base_url=run.stack.infra.public_url, timeout=traffic.CHAT_TIMEOUT_S) as c:
        for t in run.stack.tenants:
            deadline = time.monotonic() + FINAL_WITHIN_S
            while True:
                got = await traffic.chat(c, run.facts, t, PROMPTS[1])
                if (
                    got.complete and got.adapter_id == expected[t.versions.alias]
                ) or time.monotonic() > deadline:
                    run.facts.chats[-1] = replace(got, final=True)
                    break
                await asyncio.sleep(1.0)


async def _faults(run: Run, schedule: list[Fault], t0: float) -> list[dict[str, Any]]:
    pick = random.Random(f"soak-pick:{run.cfg.seed}")
    done = []
    for fault in schedule:
        wait = t0 + fault.at_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        began = time.monotonic()
        print(f"soak: {fault.kind} at {began - t0:.1f}s, down {fault.down_s}s", file=sys.stderr, flush=True)
        await inject(run.stack, fault, pick.randrange(1 << 16))
        ended = time.monotonic()
        healthy_s = await run.time_to_healthy(fault.kind)
        done.append(
            {
                "fault": fault.kind,
                "at_s": round(began - t0, 1),
                "down_s": round(ended - began, 1),
                "healthy_after_s": healthy_s,
                "_window": (began, ended + healthy_s),
            }
        )
    return done


async def run_soak(cfg: SoakConfig, s3: PlatformSettings, canaries: Path) -> dict[str, Any]:
    schedule = build_schedule(cfg.seed, cfg.duration_s, cfg.gap_s, cfg.kinds)
    plan = [f.to_json() for f in schedule]
    print(f"soak: seed {cfg.seed}, schedule {json.dumps(plan)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    async with soak_stack(s3, canaries) as stack:
        facts = Facts(
            initial_aliases={t.versions.alias: t.versions.old for t in stack.tenants},
            versions={t.versions.alias: (t.versions.old, t.versions.new) for t in stack.tenants},
        )
        run = Run(stack, cfg, facts, await traffic.upload_artifact(stack))
        if not await collect.poll(run.chat_each_alias, SERVABLE_WITHIN_S, every_s=1.0):
            raise RuntimeError(f"the aliases were not servable within {SERVABLE_WITHIN_S}s")
        await run.time_to_healthy("start")

        async def no_reservations() -> bool:
            g = await collect.gateway_metrics(stack.infra.public_url)
            return not any(g.get(k, 0.0) for k in collect.INFLIGHT)

        if not await collect.poll(no_reservations, 30):
            raise RuntimeError("the warm-up's reservations were not refunded within 30s")
        # the limiter's scripts are loaded now: every script call the ledger sees from here on is one that ran
        async with RateLedger(stack.redis_url) as ledger:
            rng = random.Random(f"soak-traffic:{cfg.seed}")
            stop = asyncio.Event()
            unacked_moves: list[str] = []
            url, internal = stack.infra.public_url, stack.infra.internal_url
            tenants = stack.tenants
            clients = [
                *(
                    traffic.chats(url, facts, tenants, random.Random(rng.random()), stop)
                    for _ in range(cfg.chat_workers)
                ),
                traffic.moves(
                    internal,
                    facts,
                    tenants,
                    random.Random(rng.random()),
                    stop,
                    cfg.move_every_s,
                    unacked_moves,
                ),
                traffic.registrations(
                    stack,
                    run.art,
                    random.Random(rng.random()),
                    stop,
                    cfg.register_every_s,
                    run.acked,
                    f"soak{cfg.seed}",
                ),
            ]
            tasks = [asyncio.create_task(c) for c in clients]
            t0 = time.monotonic()
            try:
                done = await _faults(run, schedule, t0)
                left = t0 + cfg.duration_s - time.monotonic()
                if left > 0:
                    await asyncio.sleep(left)
            finally:
                stop.set()
                ended = await asyncio.gather(*tasks, return_exceptions=True)
            for outcome in ended:
                if isinstance(outcome, BaseException):
                    raise outcome
            traffic_s = time.monotonic() - t0
            await run.time_to_healthy("the traffic's end")
            await _final_chats(run)
            facts.release = await collect.release(stack, ledger, 60)
        facts.registrations = await collect.registrations(stack, run.acked, SETTLE_WITHIN_S)
        facts.usage = await collect.usage(stack, facts, 90)
    results = check(facts, lambda text: markers_in_text(text, stack.manifest.markers()))
    for fault in done:  # what the chats met from the fault's start until the stack was healthy again
        fault["chats_during"] = chats_between(facts.chats, *fault.pop("_window"))
    return {
        "seed": cfg.seed,
        "minutes": round(cfg.duration_s / 60, 2),
        "schedule": plan,
        "faults": done,
        "counts": counts(facts) | {"alias_moves_unacknowledged": unacked_moves},
        "invariants": {r.name: r.to_json() for r in results},
        "ok": all(r.ok for r in results),
        "traffic_s": round(traffic_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "replay": f"lorafleet bench soak --minutes {cfg.duration_s / 60:g} --seed {cfg.seed}",
    }


def soak(
    minutes: Annotated[float, typer.Option(help="how long the traffic and the faults run")] = 10.0,
    seed: Annotated[int, typer.Option(help="draws the schedule and the traffic; replays a run")] = 1,
    gap_min_s: Annotated[float, typer.Option(help="shortest gap between two faults' starts")] = 15.0,
    gap_max_s: Annotated[float, typer.Option(help="longest gap between two faults' starts")] = 40.0,
    json_out: Annotated[Path | None, typer.Option(help="also write the JSON summary here")] = None,
) -> None:
    """Fault soak: kill and restart the relay, validator, placement worker, a replica, Kafka and PostgreSQL
    under traffic; check that nothing was lost, doubled, misrouted or left held."""
    from harness.canary_training import E2E_CANARIES, trained_canaries
    from lorafleet.config import get_settings

    logging.basicConfig(level=logging.WARNING)
    # The private stack is a dev stack: its broker and database logins are the dev profile's, in this
    # process (which creates the topics) as in its children (harness.env gives them DEV_PROFILE_ENV).
    os.environ.update(DEV_PROFILE_ENV)
    cfg = SoakConfig(seed, minutes * 60, (gap_min_s, gap_max_s))
    summary = asyncio.run(run_soak(cfg, get_settings(), trained_canaries(E2E_CANARIES)))
    text = json.dumps(summary, indent=2)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(text + "\n")
    typer.echo(text)
    if not summary["ok"]:
        raise typer.Exit(1)
