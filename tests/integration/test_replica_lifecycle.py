"""A replica's life on the real stack: SmolLM2 replica processes, the public gateway, the placement worker,
the relay, PostgreSQL and Kafka. Nothing is published by hand. Tests are ordered and share the stack:
a replica joins (warms, then is routed to), one drains with streams in flight (zero failures, its adapters
move first), and the last one drains past its deadline (error events, reservations refunded)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from httpx_sse import EventSource

from harness.stacks.gateway import TOKEN, random_adapters
from placement_worker import store
from schemas.events import ReplicaState, RequestCompleted
from schemas.topics import REPLICA_STATE, REQUESTS_COMPLETED
from tests.integration.lifecycle_stack import ADAPTER_IDS, LEAN_ALIAS, LifecycleStack, Tap, lifecycle_stack
from tests.integration.services import REPO
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STORY = [{"role": "user", "content": "Tell me a long story about a dragon."}]


@pytest.fixture(scope="module")
async def stack(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LifecycleStack]:
    root, base_hash = await random_adapters(tmp_path_factory.mktemp("adapters"), list(ADAPTER_IDS))
    async with lifecycle_stack(services.settings(), root, base_hash, tmp_path_factory.mktemp("lc")) as s:
        yield s


async def _ready(url: str) -> bool:
    async with httpx.AsyncClient() as c:
        try:
            return (await c.get(f"{url}/ready", timeout=2)).status_code == 200
        except httpx.HTTPError:
            return False


async def _status(url: str) -> str | None:
    """What the replica's GET /ready says it is (None: it does not answer yet)."""
    async with httpx.AsyncClient() as c:
        try:
            resp = await c.get(f"{url}/ready", timeout=2)
        except httpx.HTTPError:
            return None
    return "ready" if resp.status_code == 200 else resp.json()["error"]["message"].split()[2]


async def _chat(client: httpx.AsyncClient, stack: LifecycleStack, max_tokens: int = 2) -> str:
    """One non-streamed completion through the gateway; its request id."""
    body = {"model": "acme/support:prod", "messages": STORY, "max_completion_tokens": max_tokens}
    resp = await client.post(
        f"{stack.url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {stack.keys['acme']}"},
    )
    assert resp.status_code == 200, resp.text
    return resp.headers["x-request-id"]


async def _stream(
    stack: LifecycleStack, tenant: str, model: str, max_tokens: int, first: asyncio.Event | None = None
) -> list[tuple[str | None, str]]:
    """(event, data) of one streamed completion; `first` is set when its first chunk arrives."""
    body = {"model": model, "messages": STORY, "max_completion_tokens": max_tokens, "stream": True}
    out: list[tuple[str | None, str]] = []
    async with httpx.AsyncClient(timeout=120) as c:
        headers = {"Authorization": f"Bearer {stack.keys[tenant]}"}
        async with c.stream("POST", f"{stack.url}/v1/chat/completions", json=body, headers=headers) as resp:
            assert resp.status_code == 200, await resp.aread()
            async for sse in EventSource(resp).aiter_sse():
                out.append((None if sse.event == "message" else sse.event, sse.data))
                if first is not None:
                    first.set()
    return out


def _ok(events: list[tuple[str | None, str]]) -> bool:
    return bool(events) and events[-1] == (None, "[DONE]") and all(e is None for e, _ in events)


async def test_a_joining_replica_warms_its_adapters_before_it_is_routed_to(stack: LifecycleStack) -> None:
    first = stack.start("a")
    await wait_until(lambda: _ready(first.url), "the first replica to be ready", 120)
    await wait_until(lambda: _live(stack, {first.name}), "the gateway to route to it", 30)

    async with Tap(
        stack.env["LORAFLEET_KAFKA_BOOTSTRAP"], REPLICA_STATE.name, REQUESTS_COMPLETED.name
    ) as tap:
        joiner = stack.start("b")
        sent: dict[str, float] = {}  # request id -> when it was sent (so routed)
        stop = asyncio.Event()

        async def traffic() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                while not stop.is_set():
                    at = time.monotonic()
                    sent[await _chat(client, stack)] = at

        clients = [asyncio.create_task(traffic()) for _ in range(2)]
        warming_at = ready_at = None
        placed: dict[str, set[str]] = {}
        # Hold the placement worker's plan lock until a request was sent while the joiner warms: its full
        # replan (which tells the joiner what it owns) waits behind it, so on a fast machine too the joiner
        # stays warming long enough for the router to be tested against it.
        holder = await stack.pool.acquire()
        held = holder.transaction()
        await held.start()
        await holder.execute("SELECT pg_advisory_xact_lock($1)", store.PLAN_LOCK_KEY)
        give_up = time.monotonic() + 120
        try:
            while ready_at is None and time.monotonic() < give_up:
                status = await _status(joiner.url)
                if status == "warming" and warming_at is None:
                    warming_at = time.monotonic()
                elif status == "ready":
                    ready_at = time.monotonic()
                    placed = await stack.placements()  # what it owned when it turned ready
                if (
                    held is not None
                    and warming_at is not None
                    and any(t >= warming_at for t in sent.values())
                ):
                    await held.rollback()  # a request sent while warming has completed: let the replan run
                    held = None
                await asyncio.sleep(0.05)
        finally:
            if held is not None:
                await held.rollback()
            await stack.pool.release(holder)
        stop.set()
        await asyncio.gather(*clients)
        assert warming_at is not None and ready_at is not None, "the new replica should warm, then be ready"
        before = {rid for rid, at in sent.items() if at < ready_at}
        assert any(sent[rid] >= warming_at for rid in before), "no request was sent while it warmed"

        def completed() -> dict[str, RequestCompleted]:
            return {
                e.request_id: e
                for e in tap.events
                if isinstance(e, RequestCompleted) and e.request_id in before
            }

        await wait_until(lambda: _true(len(completed()) == len(before)), "the completion records", 60)
        assert {e.replica_id for e in completed().values()} == {first.name}
        states = [e for e in tap.events if isinstance(e, ReplicaState) and e.replica_id == joiner.name]

    statuses = [s.status for s in states]
    turned_at = statuses.index("ready")
    assert turned_at > 0 and set(statuses[:turned_at]) == {"warming"}, statuses
    turned = states[turned_at]
    owned = {a for a, owners in placed.items() if joiner.name in owners}
    assert owned == set(ADAPTER_IDS)  # two owners per adapter, two replicas
    assert turned.owned_adapters == turned.warm_adapters == len(owned)
    assert owned <= set(turned.gpu_adapters) | set(turned.ram_adapters)
    assert all(s.warm_adapters <= s.owned_adapters for s in states)
    lines = joiner.log.read_text().splitlines()
    served = [i for i, line in enumerate(lines) if "replica.server: request " in line]
    became = next(i for i, line in enumerate(lines) if "replica is ready" in line)
    assert all(i > became for i in served), "the replica served a request before it was ready"
    await wait_until(lambda: _live(stack, {first.name, joiner.name}), "both routed to", 30)
    async with httpx.AsyncClient() as c:
        exposed = (await c.get(f"{stack.url}/metrics", timeout=10)).text.splitlines()
    assert "gateway_replicas_routable 2.0" in exposed


async def _true(value: bool) -> bool:
    return value


async def _live(stack: LifecycleStack, ids: set[str]) -> bool:
    return await stack.live() == ids


async def _busy(stack: LifecycleStack) -> str:
    """A replica with requests in flight now."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        for _ in range(100):
            for rid, r in stack.replicas.items():
                if r.proc is None or r.proc.poll() is not None:
                    continue
                st = (await c.get(f"{r.url}/internal/replicas/{rid}/state", timeout=5)).json()
                if st["tokens_in_flight"] or st["queue_depth"]:
                    return rid
            await asyncio.sleep(0.05)
    raise AssertionError("no replica has requests in flight")


async def test_scale_down_drains_a_replica_with_zero_failed_requests(stack: LifecycleStack) -> None:
    alive = {rid for rid, r in stack.replicas.items() if r.proc is not None and r.proc.poll() is None}
    assert len(alive) == 2, "the previous test leaves two ready replicas"
    streams = [asyncio.create_task(_stream(stack, "acme", "acme/support:prod", 12)) for _ in range(4)]
    victim = stack.replicas[await _busy(stack)]
    (keeper,) = alive - {victim.name}
    env = {**stack.env, "LORAFLEET_REPLICA_SERVICE_TOKEN": TOKEN}
    # a deadline far past what the streams need even on a loaded CPU: this drain is one that ends in time
    drain = ["replica", "drain", "--url", victim.url, "--deadline-s", "120", "--wait"]
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lorafleet.cli", *drain,
        env=env, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    later = [asyncio.create_task(_stream(stack, "acme", "acme/support:prod", 6)) for _ in range(2)]
    moved_while_alive = False
    assert victim.proc is not None
    deadline = time.monotonic() + 150
    while victim.proc.poll() is None and time.monotonic() < deadline:
        placed = await stack.placements()
        if victim.proc.poll() is None and not any(victim.name in o for o in placed.values()):
            moved_while_alive = moved_while_alive or all(keeper in placed.get(a, set()) for a in ADAPTER_IDS)
        await asyncio.sleep(0.05)
    out, err = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0, err.decode()
    assert json.loads(out.decode())["status"] == "draining"
    assert victim.proc.returncode == 0, victim.log.read_text()[-2000:]
    assert moved_while_alive, "its placements were not on the other replica before it exited"
    results = await asyncio.gather(*streams, *later)
    assert all(_ok(r) for r in results), [r[-2:] for r in results if not _ok(r)]
    log = victim.log.read_text()
    assert "drained: no request runs and no adapter is placed here" in log


async def test_a_drain_past_its_deadline_ends_streams_with_errors_and_refunds(stack: LifecycleStack) -> None:
    (last,) = [r for r in stack.replicas.values() if r.proc is not None and r.proc.poll() is None]
    firsts = [asyncio.Event(), asyncio.Event()]
    # 31 estimated prompt tokens + 400: two of these fit the lean tenant's 1,000 tokens/min, not a third
    streams = [asyncio.create_task(_stream(stack, "lean", LEAN_ALIAS, 400, ev)) for ev in firsts]
    await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in firsts)), 60)
    probe = {"model": LEAN_ALIAS, "messages": STORY, "max_completion_tokens": 570}
    auth = {"Authorization": f"Bearer {stack.keys['lean']}"}
    async with httpx.AsyncClient(timeout=30) as c:
        refused = await c.post(f"{stack.url}/v1/chat/completions", json=probe, headers=auth)
        assert refused.status_code == 429, refused.text  # the two running requests hold the tokens
        drain = await c.post(
            f"{last.url}/internal/drain",
            json={"deadline_s": 1.5},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert drain.status_code == 200 and drain.json()["deadline_s"] == 1.5
        results = await asyncio.gather(*streams)
        for events in results:
            kind, data = events[-1]
            assert kind == "error", events[-3:]
            error = json.loads(data)["error"]
            assert error["code"] == "replica_draining" and error["type"] == "server_error"
            assert all(e is None and d != "[DONE]" for e, d in events[:-1])
        # Refunded at once: without the refunds these tokens come back only after half a minute.
        admitted = None
        for _ in range(30):
            admitted = await c.post(f"{stack.url}/v1/chat/completions", json=probe, headers=auth)
            if admitted.status_code != 429:
                break
            await asyncio.sleep(0.1)
        assert admitted is not None and admitted.status_code == 503, admitted.text
        assert admitted.json()["error"]["code"] == "no_replica_available"  # admitted; no replica is left
    assert last.proc is not None
    await asyncio.wait_for(asyncio.to_thread(last.proc.wait), 20)
    assert last.proc.returncode == 0
    assert "drain deadline passed: ending 2 running requests" in last.log.read_text()
