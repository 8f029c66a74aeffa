"""A replica joining the fleet, then killed: the owner placements each change moved, the time until the
placements stop changing, and (for the join) how soon the gateways route to the newcomer: when every gateway's
GET /ready first lists it, and when a request first lands there (from the newcomer answering its health
check, probes for adapters placed on it go through the gateways, one every tenth of a second)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import asyncpg
import httpx

from bench.fleet_probe import Owners, moved, owners
from bench.fleet_stack import FleetStack, alias_name, tenant_name


async def _served(client: httpx.AsyncClient, url: str) -> int:
    try:
        resp = await client.get(f"{url}/stats", timeout=2.0)
        return int(resp.json()["served"]) if resp.status_code == 200 else 0
    except (httpx.HTTPError, ValueError, KeyError):
        return 0


async def _probe(client: httpx.AsyncClient, stack: FleetStack, n: int, rank: int) -> None:
    """One short request for the adapter of popularity rank `rank`, through gateway n mod 2."""
    tenant = tenant_name(rank, stack.cfg.tenants)
    body = {"model": alias_name(rank, stack.cfg.tenants), "messages": [{"role": "user", "content": "probe"}]}
    headers = {"Authorization": f"Bearer {stack.stack.keys[tenant]}"}
    url = f"{stack.gateways[n % len(stack.gateways)]}/v1/chat/completions"
    with contextlib.suppress(httpx.HTTPError):
        await client.post(url, json={**body, "max_tokens": 1}, headers=headers, timeout=30.0)


async def _routing(client: httpx.AsyncClient, gateway: str) -> set[str]:
    """The replicas a gateway routes to now (its GET /ready)."""
    try:
        return set((await client.get(f"{gateway}/ready", timeout=2.0)).json()["replicas"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return set()


async def _settle(
    pool: asyncpg.Pool, before: Owners, t0: float, quiet_s: float, timeout_s: float
) -> tuple[Owners, float | None]:
    """Poll the placements until they changed and then stayed the same for quiet_s; (final, last change)."""
    current, last_change = before, None
    deadline = t0 + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        now = await owners(pool)
        if now != current:
            current, last_change = now, time.monotonic() - t0
        elif last_change is not None and time.monotonic() - t0 - last_change >= quiet_s:
            break
    return current, last_change


def _outcome(before: Owners, after: Owners, replicas_after: int, settle_s: float | None) -> dict[str, Any]:
    n_moved = moved(before, after)
    share = n_moved / max(len(before), 1)
    return {
        "owner_placements_before": len(before),
        "placements_moved": n_moved,
        "moved_share": round(share, 4),
        "bound_share": round(1.5 / replicas_after, 4),
        "within_bound": share <= 1.5 / replicas_after,
        "placements_settled_s": None if settle_s is None else round(settle_s, 3),
    }


async def join(stack: FleetStack, pool: asyncpg.Pool, quiet_s: float, timeout_s: float) -> dict[str, Any]:
    """Start the joining replica; what moved onto it and how soon the gateways routed to it."""
    before = await owners(pool)
    new = stack.replica_id(stack.cfg.replicas)
    t0 = time.monotonic()
    stack.start_joiner()
    routed_s: float | None = None
    placed_s: float | None = None  # the first owner placement on the newcomer
    async with httpx.AsyncClient() as client:
        ready_s = None
        while time.monotonic() - t0 < timeout_s and ready_s is None:
            try:
                if (await client.get(f"{stack.joiner_url}/health", timeout=1.0)).status_code == 200:
                    ready_s = time.monotonic() - t0
            except httpx.HTTPError:
                await asyncio.sleep(0.1)

        async def first_served() -> None:
            """Probe through the gateways with adapters placed on the newcomer until one lands there."""
            nonlocal routed_s, placed_s
            base = await _served(client, stack.joiner_url)
            sent = 0
            while time.monotonic() - t0 < timeout_s:
                placed = sorted(a for a, rid in await owners(pool) if rid == new)
                if placed and placed_s is None:
                    placed_s = time.monotonic() - t0
                if placed:
                    rank = int(placed[sent % len(placed)].rsplit("-", 1)[1])
                    await _probe(client, stack, sent, rank)
                    sent += 1
                if await _served(client, stack.joiner_url) > base:
                    routed_s = time.monotonic() - t0
                    return
                await asyncio.sleep(0.1)

        routable_s: float | None = None

        async def routable() -> None:
            """Poll every gateway's routing set until each lists the newcomer."""
            nonlocal routable_s
            while time.monotonic() - t0 < timeout_s:
                seen = [new in await _routing(client, g) for g in stack.gateways]
                if all(seen):
                    routable_s = time.monotonic() - t0
                    return
                await asyncio.sleep(0.1)

        routing = asyncio.gather(first_served(), routable())
        after, settle_s = await _settle(pool, before, t0, quiet_s, timeout_s)
        await routing
    out = _outcome(before, after, stack.cfg.replicas + 1, settle_s)
    out["placed_on_new"] = sum(1 for _, rid in after if rid == new)
    out["serving_s"] = None if ready_s is None else round(ready_s, 3)
    out["routable_s"] = None if routable_s is None else round(routable_s, 3)
    # every gateway routes to it (its GET /ready) this long after it answered its health check: the
    # registration read and its first replica.state (the goal: two state periods)
    out["routable_after_serving_s"] = (
        None if routable_s is None or ready_s is None else round(routable_s - ready_s, 3)
    )
    out["first_probe_routed_s"] = None if routed_s is None else round(routed_s, 3)
    out["first_placed_s"] = None if placed_s is None else round(placed_s, 3)
    out["routing_settled_after_serving_s"] = (
        None if routed_s is None or ready_s is None else round(routed_s - ready_s, 3)
    )
    out["routing_settled_after_placement_s"] = (
        None if routed_s is None or placed_s is None else round(routed_s - placed_s, 3)
    )
    out["state_period_s"] = stack.cfg.state_interval_s
    return out


async def kill(stack: FleetStack, pool: asyncpg.Pool, quiet_s: float, timeout_s: float) -> dict[str, Any]:
    """SIGKILL the joined replica; what moved off it and how soon the placements settled."""
    before = await owners(pool)
    t0 = time.monotonic()
    stack.stack.procs["standin-joiner"].kill()
    after, settle_s = await _settle(pool, before, t0, quiet_s, timeout_s)
    out = _outcome(before, after, stack.cfg.replicas, settle_s)
    out["left_on_killed"] = sum(1 for _, rid in after if rid == stack.replica_id(stack.cfg.replicas))
    return out
