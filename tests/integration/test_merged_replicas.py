"""Merged replicas on the real stack (merged_stack.py): traffic through the public API promotes an adapter,
the actuator starts a merged replica that fetches it from the registry and the object store, and the
gateway routes to it; an alias flip during the promotion never serves the old version once the gateway has
served the new one; and when traffic falls the merged replica drains with zero failed requests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from harness.adapters import make_peft_adapters
from harness.stacks.gateway import TOKEN
from lorafleet.model.prepare import ensure_default_model
from tests.integration.merged_stack import ALIAS, MergedStack, merged_stack
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = [{"role": "user", "content": "Name three colours."}]
MAX_TOKENS = 6


@dataclass(frozen=True)
class Answer:
    started: float
    status: int
    adapter_id: str | None
    merged: bool
    text: str


@pytest.fixture(scope="module")
async def stack(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[MergedStack]:
    from lorafleet.model.base_hash import base_model_hash

    model_dir = ensure_default_model()
    base_hash = base_model_hash(model_dir)
    run = time.time_ns() % 1_000_000
    versions = (f"acme-heavy-{run}-v1", f"acme-heavy-{run}-v2")
    root = tmp_path_factory.mktemp("adapters")
    # B's std large enough that the two versions answer differently at temperature 0
    await asyncio.to_thread(make_peft_adapters, model_dir, root, list(versions), base_hash, 8, 0.2)
    work = tmp_path_factory.mktemp("merged")
    async with merged_stack(services.settings(), root, versions, base_hash, work) as s:
        yield s


async def _ask(client: httpx.AsyncClient, stack: MergedStack, max_tokens: int = MAX_TOKENS) -> Answer:
    started = time.monotonic()
    body = {"model": ALIAS, "messages": PROMPT, "max_completion_tokens": max_tokens, "temperature": 0}
    resp = await client.post(
        f"{stack.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {stack.key}"}
    )
    text = resp.json()["choices"][0]["message"]["content"] if resp.status_code == 200 else resp.text
    merged = resp.headers.get("x-lorafleet-merged") == "true"
    return Answer(started, resp.status_code, resp.headers.get("x-adapter-id"), merged, text)


class Load:
    """Concurrent clients asking the alias until stopped; every answer is kept."""

    def __init__(self, stack: MergedStack, clients: int) -> None:
        self.stack, self.clients = stack, clients
        self.answers: list[Answer] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _client(self) -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            while not self._stop.is_set():
                self.answers.append(await _ask(c, self.stack))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client()) for _ in range(self.clients)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def _move_alias(stack: MergedStack, adapter_id: str) -> None:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        resp = await c.put(f"{stack.internal_url}/internal/aliases/{ALIAS}", json={"adapter_id": adapter_id})
        assert resp.status_code == 200, resp.text


async def test_promotion_alias_flip_and_demotion(stack: MergedStack) -> None:
    v1, v2 = stack.versions
    async with httpx.AsyncClient(timeout=120) as c:
        baseline_v1 = await _ask(c, stack)
    assert (baseline_v1.status, baseline_v1.adapter_id, baseline_v1.merged) == (200, v1, False)

    # Promotion: traffic over the merge threshold for two windows; the merged replica turns ready and serves.
    load = Load(stack, clients=3)
    load.start()
    try:
        await wait_until(lambda: _has(stack, (v1, 1, "promote")), "v1 promoted", timeout=120)
        await wait_until(lambda: _served_merged(load, v1), "a request served by v1's merged replica", 240)
        async with httpx.AsyncClient(timeout=120) as c:
            merged_v1 = await _ask(c, stack)
        assert merged_v1.adapter_id == v1
        assert merged_v1.text == baseline_v1.text  # temperature 0: merged equals unmerged

        # The alias moves during the promotion: once the gateway has served v2, nothing is served by v1.
        await _move_alias(stack, v2)
        await wait_until(lambda: _served(load, v2), "the gateway serving v2", timeout=30)
        acknowledged = min(a.started for a in load.answers if a.adapter_id == v2)
        await wait_until(lambda: _has(stack, (v2, 1, "alias_moved")), "v2 promoted at the flip", 30)
        # the alias row retires v1 at once; the worker demotes it on that or on the alias event
        assert {(a, d) for a, d, r in await stack.targets() if r in ("alias_moved", "retired")} >= {(v1, 0)}
        await wait_until(lambda: _served_merged(load, v2), "a request served by v2's merged replica", 240)
    finally:
        await load.stop()
    after = [a for a in load.answers if a.started > acknowledged]
    assert after and all(a.status == 200 and a.adapter_id == v2 for a in after), after[:5]
    async with httpx.AsyncClient(timeout=120) as c:
        baseline_v2 = await _ask(c, stack)
    assert baseline_v2.text != baseline_v1.text
    assert {a.text for a in after} == {baseline_v2.text}  # v2's output, merged or not, never v1's
    assert all(a.status == 200 for a in load.answers), [a for a in load.answers if a.status != 200][:3]
    assert v1 not in stack.merged_pids()  # the old version's merged replica drained and stopped

    # Demotion: a trickle under the lower threshold; the merged replica drains with nothing failing.
    trickle: list[Answer] = []
    pid = stack.merged_pids()[v2]
    deadline = time.monotonic() + 150
    async with httpx.AsyncClient(timeout=120) as c:
        while v2 in stack.merged_pids() and time.monotonic() < deadline:
            trickle.append(await _ask(c, stack, max_tokens=2))
            await asyncio.sleep(2.0)
    assert v2 not in stack.merged_pids(), f"merged replica pid {pid} still running"
    assert await _has(stack, (v2, 0, "demote"))
    assert trickle and all(a.status == 200 and a.adapter_id == v2 for a in trickle), trickle
    # a 2-token answer may end inside a multi-byte character, which the detokenizer closes with U+FFFD
    assert all(baseline_v2.text.startswith(a.text.removesuffix("\ufffd")) for a in trickle), trickle


async def _has(stack: MergedStack, target: tuple[str, int, str]) -> bool:
    return target in await stack.targets()


async def _served_merged(load: Load, adapter_id: str) -> bool:
    return any(a.merged and a.adapter_id == adapter_id for a in load.answers)


async def _served(load: Load, adapter_id: str) -> bool:
    return any(a.adapter_id == adapter_id for a in load.answers)
