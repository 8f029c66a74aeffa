"""Two calibrated stand-ins hosted in one process behind the real public gateway: each registers, publishes
signed replica.state and serves what the gateway routes to it, with the tier its model found the adapter in."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import httpx
import pytest

from bench.gateway_stack import REPO
from harness.ports import free_port, free_ports
from harness.seed import Alias, ReadyAdapter, Seed, Tenant
from harness.spec import HttpReady, ProcessSpec, StackSpec, app_args
from harness.stack import private_stack
from lorafleet.config import PlatformSettings
from tests.integration.services import ServiceAddresses

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "standin-host-token"
ADAPTERS = [f"host-{i:02d}" for i in range(12)]


def _spec(run: str, report: Path) -> StackSpec:
    first, gateway_port = free_ports(2), free_port()
    ids = [f"sh{run}-{i}" for i in range(2)]
    host_args = ("bench", "standin-host", "--first-port", str(first), "--report", str(report))
    host_args += tuple(a for rid in ids for a in ("--replica-id", rid))
    host_args += ("--state-interval-s", "0.5")
    host = ProcessSpec(
        "standin-host",
        host_args,
        first,
        ready=tuple(HttpReady(f"http://127.0.0.1:{first + i}/health", 60) for i in range(2)),
    )
    gateway = ProcessSpec(
        "gateway",
        app_args("public-gateway"),
        gateway_port,
        {"LORAFLEET_GATEWAY_PUBLIC_PORT": str(gateway_port)},
        ready=(HttpReady(f"http://127.0.0.1:{gateway_port}/ready", 60),),
    )
    aliases = tuple(Alias(f"acme/{a}:prod", "acme", a) for a in ADAPTERS)
    return StackSpec(
        processes=(host, gateway),
        database=f"sthost_{run}",
        seed=Seed(
            (Tenant("acme", 1_000_000.0, 2_000_000_000),),
            tuple(ReadyAdapter(a, "acme", "sha256:" + "1" * 64) for a in ADAPTERS),
            aliases,
        ),
        prefix=f"sh{run}-",
        replica_token=TOKEN,
        fast_state=True,
        env={"PYTHONPATH": str(REPO)},
    )


async def _chat(client: httpx.AsyncClient, alias: str) -> tuple[int, str, int]:
    body = {"model": alias, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        chunks = [line async for line in resp.aiter_lines() if line.startswith("data: {")]
        return resp.status_code, resp.headers.get("x-adapter-tier", ""), len(chunks)


async def _run(tmp_path: Path) -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]], list[dict]]:
    report = tmp_path / "report.json"
    spec = _spec(uuid.uuid4().hex[:6], report)
    async with private_stack(spec, PlatformSettings(), tmp_path) as stack:
        gateway = stack.procs["gateway"].url
        headers = {"Authorization": f"Bearer {stack.keys['acme']}"}
        async with httpx.AsyncClient(base_url=gateway, headers=headers, timeout=30) as client:
            for _ in range(60):  # the gateway has seen both stand-ins' states
                if (await _chat(client, f"acme/{ADAPTERS[0]}:prod"))[0] == 200:
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(2.0)
            first = [await _chat(client, f"acme/{a}:prod") for a in ADAPTERS[1:]]
            second = [await _chat(client, f"acme/{a}:prod") for a in ADAPTERS[1:]]
    return first, second, json.loads(report.read_text())


def test_the_gateway_routes_to_two_standins_hosted_in_one_process(
    service_env: ServiceAddresses, tmp_path: Path
) -> None:
    first, second, report = asyncio.run(_run(tmp_path))
    assert all(status == 200 and chunks >= 3 for status, _, chunks in first + second), first + second
    assert {tier for _, tier, _ in first} == {"remote"}  # nothing was placed: the object store
    assert {tier for _, tier, _ in second} == {"gpu"}  # the first request left each in a slot
    served = {r["replica_id"]: r["served"] for r in report}
    assert len(served) == 2 and all(n > 0 for n in served.values()), served


def test_a_standin_counts_prompts_with_the_served_tokenizer_when_given() -> None:
    """The modeled prefill is the prompt's length: under the tokenizer when the host has one (plus a few
    template tokens a message), else about four bytes a token."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from bench.standin import _prompt_tokens
    from schemas.replica_api import ChatMessage, GenerateRequest

    words = Tokenizer(WordLevel({"[UNK]": 0, "lorem": 1}, unk_token="[UNK]"))
    words.pre_tokenizer = Whitespace()
    body = GenerateRequest(
        messages=[ChatMessage(role="user", content="lorem ipsum dolor sit amet")], max_tokens=4
    )
    assert _prompt_tokens(body, words) == 5 + 4
    assert _prompt_tokens(body) == len(b"lorem ipsum dolor sit amet") // 4 + 4
    assert _prompt_tokens(GenerateRequest(prompt_token_ids=[1, 2, 3], max_tokens=4), words) == 3
