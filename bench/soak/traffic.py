"""The fault soak's clients: canary chats, alias moves and registrations, each recorded as a fact.

Each client does what a careful real one would: a refused or unanswered registration or alias move is
sent again (both are idempotent) until it is acknowledged, so an acknowledged fact is unambiguous.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
from httpx_sse import aconnect_sse

from bench.soak.facts import AliasMove, Chat, Facts
from bench.soak.stack import SoakStack, SoakTenant
from canary.probe import PROMPTS
from harness.stacks import outage as ostack
from lorafleet.client.peft_dir import describe_peft_dir
from lorafleet.client.upload import upload_peft_dir
from lorafleet.s3 import async_client

CHAT_TIMEOUT_S = 120.0
CONTROL_TIMEOUT_S = 30.0  # longer than the internal API's own database deadlines: no answer is lost in flight
ACK_WITHIN_S = 180.0  # a move or registration still unacknowledged after this is given up (and reported)
RETRY_S = 1.0
REFUSED_PAUSE_S = 0.25  # a client pauses after a refusal instead of asking again at once
MAX_TOKENS = 48  # a canary stops after its marker


def _service() -> dict[str, str]:
    return {"Authorization": f"Bearer {ostack.SERVICE_TOKEN}"}


async def chat(client: httpx.AsyncClient, facts: Facts, t: SoakTenant, prompt: str) -> Chat:
    """One streaming chat on the tenant's alias, recorded in facts."""
    body = {
        "model": t.versions.alias,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {t.key}"}
    sent = time.monotonic()
    status, rid, adapter, parts, error = 0, None, None, [], ""
    try:
        async with aconnect_sse(client, "POST", "/v1/chat/completions", json=body, headers=headers) as source:
            resp = source.response
            status, rid, adapter = (
                resp.status_code,
                resp.headers.get("x-request-id"),
                resp.headers.get("x-adapter-id"),
            )
            if status != 200:
                error = (await resp.aread()).decode(errors="replace") or "empty"
            else:
                async for sse in source.aiter_sse():
                    if sse.event == "error":
                        error = sse.data or "error event"
                    elif sse.data != "[DONE]":
                        for choice in sse.json().get("choices", []):
                            parts.append(choice.get("delta", {}).get("content") or "")
    except httpx.HTTPError as exc:  # what arrived before the break is kept: its markers are judged too
        error = f"{type(exc).__name__}: {exc}"
    got = Chat(t.versions.alias, status, rid, adapter, "".join(parts), error, sent_at=sent)
    facts.chats.append(got)
    return got


async def chats(
    url: str, facts: Facts, tenants: list[SoakTenant], rng: random.Random, stop: asyncio.Event
) -> None:
    """Back-to-back chats on random tenants' aliases until stop."""
    async with httpx.AsyncClient(base_url=url, timeout=CHAT_TIMEOUT_S) as client:
        while not stop.is_set():
            got = await chat(client, facts, rng.choice(tenants), rng.choice(PROMPTS))
            if not got.complete:
                await asyncio.sleep(REFUSED_PAUSE_S)


async def _until_acked(send: Callable[[], Awaitable[httpx.Response]]) -> bool:
    """Call send() until it answers 200/202; False when ACK_WITHIN_S passes first."""
    deadline = time.monotonic() + ACK_WITHIN_S
    while time.monotonic() < deadline:
        try:
            resp = await send()
            if resp.status_code in (200, 202):
                return True
        except httpx.HTTPError:
            pass  # no answer: it may have been applied, so it is sent again (idempotent) until answered
        await asyncio.sleep(RETRY_S)
    return False


async def moves(
    url: str,
    facts: Facts,
    tenants: list[SoakTenant],
    rng: random.Random,
    stop: asyncio.Event,
    every_s: float,
    unacked: list[str],
) -> None:
    """Every every_s, move a random tenant's alias to its other version; record each acknowledged move."""
    current = dict(facts.initial_aliases)
    async with httpx.AsyncClient(base_url=url, timeout=CONTROL_TIMEOUT_S, headers=_service()) as client:
        while not stop.is_set():
            await _sleep_or_stop(stop, every_s)
            if stop.is_set():
                return
            t = rng.choice(tenants)
            alias, v = t.versions.alias, t.versions
            target = v.new if current[alias] == v.old else v.old

            def send(alias: str = alias, target: str = target) -> Awaitable[httpx.Response]:
                return client.put(f"/internal/aliases/{alias}", json={"adapter_id": target})

            if await _until_acked(send):
                facts.moves.append(AliasMove(alias, target, time.monotonic()))
                current[alias] = target
            else:
                unacked.append(f"{alias} -> {target}")
                return  # its outcome is unknown: no later move of this run can be judged


@dataclass(frozen=True)
class Artifact:
    """One canary version uploaded once; every "good" registration of the run points at it."""

    weights_uri: str
    checksum: str
    rank: int
    alpha: float
    target_modules: list[str]


async def upload_artifact(stack: SoakStack) -> Artifact:
    entry = stack.manifest.adapters[0]
    folder = stack.manifest.adapter_dir(stack.canaries, entry.adapter_id)
    facts = describe_peft_dir(folder)
    prefix = f"adapters/soak/{uuid.uuid4().hex[:12]}"
    bucket = stack.settings.s3_bucket
    async with async_client(stack.settings) as s3:
        checksum = await upload_peft_dir(s3, folder, bucket, prefix)
    return Artifact(f"s3://{bucket}/{prefix}", checksum, facts.rank, facts.alpha, facts.target_modules)


def registration(adapter_id: str, tenant_id: str, base_hash: str, art: Artifact, good: bool) -> dict:
    """A registration body: the uploaded canary (ready), or a missing object (rejected)."""
    uri = art.weights_uri if good else f"{art.weights_uri}-missing-{adapter_id}"
    return {
        "adapter_id": adapter_id,
        "tenant_id": tenant_id,
        "version": 1,
        "base_model_hash": base_hash,
        "rank": art.rank,
        "alpha": art.alpha,
        "target_modules": art.target_modules,
        "weights_uri": uri,
        "checksum": art.checksum,
    }


async def register(url: str, body: dict, acked: dict[str, bool]) -> bool:
    """POST one registration until acknowledged; its outcome goes in acked."""
    async with httpx.AsyncClient(base_url=url, timeout=CONTROL_TIMEOUT_S, headers=_service()) as client:
        ok = await _until_acked(lambda: client.post("/internal/adapters", json=body))
    acked[body["adapter_id"]] = ok
    return ok


async def registrations(
    stack: SoakStack,
    art: Artifact,
    rng: random.Random,
    stop: asyncio.Event,
    every_s: float,
    acked: dict[str, bool],
    prefix: str,
) -> None:
    """Every every_s, a new registration (half of them good, by the seed), each sent until acknowledged;
    they run side by side so a refused one does not hold up the next."""
    pending: list[asyncio.Task[bool]] = []
    n = 0
    tenant = stack.tenants[0].tenant_id
    while not stop.is_set():
        await _sleep_or_stop(stop, every_s)
        if stop.is_set():
            break
        n += 1
        good = rng.random() < 0.5
        body = registration(f"{prefix}-{n:04d}", tenant, stack.manifest.base_model_hash, art, good)
        acked.setdefault(body["adapter_id"], False)
        pending.append(asyncio.create_task(register(stack.infra.internal_url, body, acked)))
    await asyncio.gather(*pending)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
