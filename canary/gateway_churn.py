"""A churn run through the public gateway: canary tenants stream while their aliases move and a replica dies.

`concurrency` workers send streaming chat completions, each to a random tenant's alias with that
tenant's key, until `requests` have been sent. Once `flip_after` answers are in, the run calls flip()
(which moves every alias to its new version and returns each move's acknowledgement time); once
`kill_after` are in, it calls kill() (which kills a replica and returns when). Every answer is kept for
churn_verdict.judge_run. Times are time.monotonic().
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from canary.churn_verdict import AliasVersions, Answer
from canary.probe import PROMPTS, Planned, Streamed, stream_chat
from canary.probe_setup import ProbeTarget

POLL_S = 0.05


@dataclass(frozen=True)
class ChurnTenant:
    """One tenant of the run: its key and alias (as the probe calls them) and the alias's two versions."""

    target: ProbeTarget
    versions: AliasVersions


@dataclass(frozen=True)
class GatewayChurnPlan:
    requests: int
    flip_after: int
    kill_after: int
    concurrency: int = 6
    max_tokens: int = 48  # a canary stops after its marker: most of each reservation is refunded
    seed: int = 0


@dataclass
class GatewayChurnRun:
    """What the run saw: every answer, and when it moved the aliases and killed the replica."""

    answers: list[Answer]
    flip_started: float
    flip_acked: dict[str, float]
    killed_at: float | None
    wall_s: float


async def _send(client: httpx.AsyncClient, p: Planned, max_tokens: int) -> Answer:
    sent = time.monotonic()
    try:
        got = await stream_chat(client, p, max_tokens)
    except httpx.HTTPError as exc:
        got = Streamed(0, "", None, None, None, f"{type(exc).__name__}: {exc}")
    return Answer(
        p.request_id, p.target.alias, sent, time.monotonic(), got.status, got.adapter_id, got.text, got.error
    )


async def run_gateway_churn(
    gateway: str,
    tenants: Sequence[ChurnTenant],
    plan: GatewayChurnPlan,
    flip: Callable[[], Awaitable[dict[str, float]]],
    kill: Callable[[], Awaitable[float]],
) -> GatewayChurnRun:
    """Send plan.requests requests; move the aliases and kill a replica on the way (see the module doc)."""
    rng = random.Random(f"gateway-churn:{plan.seed}")
    planned = iter(
        Planned(f"churn-{i:05d}", t.target, t.target, rng.choice(PROMPTS))
        for i, t in enumerate(rng.choice(list(tenants)) for _ in range(plan.requests))
    )
    answers: list[Answer] = []
    flip_started, flip_acked, killed_at = float("inf"), {}, None
    limits = httpx.Limits(max_connections=plan.concurrency, max_keepalive_connections=plan.concurrency)
    start = time.monotonic()
    async with httpx.AsyncClient(base_url=gateway, timeout=120, limits=limits) as client:

        async def worker() -> None:
            for p in planned:  # the workers share one iterator: each request is sent once
                answers.append(await _send(client, p, plan.max_tokens))

        async def steer() -> None:
            nonlocal flip_started, flip_acked, killed_at
            while len(answers) < plan.flip_after:
                await asyncio.sleep(POLL_S)
            flip_started = time.monotonic()
            flip_acked = await flip()
            while len(answers) < plan.kill_after:
                await asyncio.sleep(POLL_S)
            killed_at = await kill()

        workers = asyncio.gather(*(worker() for _ in range(plan.concurrency)))
        steering = asyncio.create_task(steer())
        await workers
        if not steering.done():
            steering.cancel()
            raise RuntimeError("the run ended before it moved the aliases and killed a replica")
        steering.result()
    return GatewayChurnRun(answers, flip_started, flip_acked, killed_at, time.monotonic() - start)
