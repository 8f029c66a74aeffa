"""The public gateway end to end: the official openai client, two real SmolLM2 replicas with real PEFT
adapters, the real PostgreSQL and Kafka. Tests are ordered: the last ones kill replicas."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator

import asyncpg
import httpx
import openai
import pytest
from httpx_sse import EventSource

from gateway.public.routing.rollout import unit_hash
from gateway.registry import aliases
from harness.processes import wait_http
from harness.stacks.gateway import (
    TENANT_LIMITS,
    GatewayStack,
    gateway_stack,
    random_adapters,
)
from lorafleet.config import RelaySettings
from lorafleet.kafka import make_producer
from relay.publisher import Relay
from schemas.api import CanaryTarget
from schemas.events import AliasChanged, RequestCompleted, parse_event
from schemas.topics import REQUESTS_COMPLETED
from tests.integration.kafka_helpers import collect
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHAT = {"model": "acme/support:prod", "messages": [{"role": "user", "content": "Tell me a long story."}]}


@pytest.fixture(scope="module")
async def stack(services, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GatewayStack]:
    root, base_hash = await random_adapters(tmp_path_factory.mktemp("adapters"))
    async with gateway_stack(services.settings(), root, base_hash, tmp_path_factory.mktemp("gw")) as s:
        await wait_until(lambda: _live_replicas_are(s, set(s.replicas)), "both replicas to become live", 60)
        yield s


def _auth(stack: GatewayStack, tenant: str = "acme") -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.keys[tenant]}"}


async def _sse(resp: httpx.Response) -> AsyncIterator[tuple[str | None, str]]:
    """(event, data) per SSE event as httpx-sse decodes it; None names the default event type."""
    async for sse in EventSource(resp).aiter_sse():
        yield (None if sse.event == "message" else sse.event), sse.data


async def _chunks(size: int, count: int) -> AsyncIterator[bytes]:
    """A body with no Content-Length (chunked transfer)."""
    for _ in range(count):
        yield b"x" * size


async def _live_replicas_are(stack: GatewayStack, replica_ids: set[str]) -> bool:
    """The gateway's own view (GET /ready) lists exactly these replicas as live."""
    async with httpx.AsyncClient() as c:
        return set((await c.get(f"{stack.url}/ready")).json()["replicas"]) == replica_ids


async def _completed(stack: GatewayStack, request_ids: set[str]) -> dict[str, RequestCompleted]:
    """request id -> the requests.completed event the gateway published for it."""

    def mine(r) -> bool:  # noqa: ANN001
        return json.loads(r.value).get("request_id") in request_ids

    records = await collect(
        stack.env["LORAFLEET_KAFKA_BOOTSTRAP"],
        REQUESTS_COMPLETED.name,
        lambda rs: len(rs) >= len(request_ids),
        accept=mine,
    )
    events = [parse_event(r.value, REQUESTS_COMPLETED.name) for r in records]
    return {e.request_id: e for e in events if isinstance(e, RequestCompleted)}


async def _busy_replica(stack: GatewayStack) -> str:
    """The replica with a request in flight now."""
    for _ in range(50):
        for rid in stack.replicas:
            try:
                st = await stack.state(rid)
            except httpx.HTTPError:
                continue
            if st["queue_depth"] or st["tokens_in_flight"]:
                return rid
        await asyncio.sleep(0.05)
    raise AssertionError("no replica has the request in flight")


async def test_openai_client_streams_chunks_usage_and_adapter_headers(stack: GatewayStack) -> None:
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["acme"], max_retries=0)
    raw = await client.chat.completions.with_raw_response.create(
        model="acme/support:prod",
        messages=[{"role": "user", "content": "Say hello."}],
        max_completion_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers["x-adapter-id"] == "acme-support-v1"
    assert raw.headers["x-adapter-tier"] in {"gpu", "ram", "disk", "remote"}
    assert raw.headers["x-request-id"].startswith("req_")
    chunks = [c async for c in raw.parse()]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert chunks[-2].choices[0].finish_reason in {"stop", "length"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert len({c.id for c in chunks}) == 1


async def test_openai_client_non_streaming_has_usage(stack: GatewayStack) -> None:
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["globex"], max_retries=0)
    done = await client.chat.completions.create(
        model="globex/sales:prod", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, seed=1
    )
    assert done.object == "chat.completion" and done.choices[0].finish_reason in {"stop", "length"}
    assert done.usage.prompt_tokens > 0 and 1 <= done.usage.completion_tokens <= 4
    models = await client.models.list()
    assert [m.id for m in models.data] == ["globex/sales:prod"]


async def test_openai_client_streams_a_legacy_completion_with_usage(stack: GatewayStack) -> None:
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["acme"], max_retries=0)
    raw = await client.completions.with_raw_response.create(
        model="acme/support:prod",
        prompt="The capital of France is",
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers["x-adapter-id"] == "acme-support-v1" and raw.headers["x-request-id"].startswith("req_")
    chunks = [c async for c in raw.parse()]
    assert {c.object for c in chunks} == {"text_completion"} and len({c.id for c in chunks}) == 1
    assert chunks[0].id.startswith("cmpl-")
    assert chunks[-1].choices == [] and 1 <= chunks[-1].usage.completion_tokens <= 8
    assert chunks[-2].choices[0].finish_reason in {"stop", "length"}
    assert "".join(c.choices[0].text for c in chunks if c.choices)


async def test_openai_client_legacy_completion_is_the_raw_prompt_with_usage(stack: GatewayStack) -> None:
    """Greedy on one prompt: the whole answer is the stream's text, and the prompt had no chat template."""
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["acme"], max_retries=0)
    args = {"model": "acme/support:prod", "prompt": "The capital of France is", "max_tokens": 6, "seed": 1}
    done = await client.completions.create(**args, temperature=0)
    assert done.object == "text_completion" and done.id.startswith("cmpl-")
    assert done.choices[0].finish_reason in {"stop", "length"} and done.choices[0].text
    assert 1 <= done.usage.completion_tokens <= 6
    assert done.usage.prompt_tokens < 10  # five words, no template's role markers around them
    chat = await client.chat.completions.create(
        model="acme/support:prod", messages=[{"role": "user", "content": args["prompt"]}], max_tokens=1
    )
    assert chat.usage.prompt_tokens > done.usage.prompt_tokens
    streamed = await client.completions.create(**args, temperature=0, stream=True)
    assert "".join([c.choices[0].text async for c in streamed if c.choices]) == done.choices[0].text
    for fields, param in (
        ({"echo": True}, "echo"),
        ({"best_of": 2}, "best_of"),
        ({"suffix": "!"}, "suffix"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"extra_body": {"messages": []}}, "messages"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            await client.completions.create(**(args | fields))
        assert err.value.param == param, (fields, err.value.body)
        assert err.value.code in {"unsupported_parameter", "unknown_parameter"}, err.value.body


async def test_a_legacy_completion_is_one_tenants_like_a_chat(stack: GatewayStack) -> None:
    """Another tenant's alias is the same 404 on both routes, and a completion is billed like a chat."""
    body = {"model": "globex/sales:prod", "prompt": "Hi", "max_tokens": 2}
    async with httpx.AsyncClient(base_url=stack.url, headers=_auth(stack)) as c:
        theirs = await c.post("/v1/completions", json=body)
        chat = await c.post("/v1/chat/completions", json={**CHAT, "model": "globex/sales:prod"})
        mine = await c.post("/v1/completions", json={**body, "model": "acme/support:prod"})
    assert theirs.status_code == 404 and theirs.content == chat.content
    assert mine.status_code == 200, mine.text
    events = await _completed(stack, {mine.headers["x-request-id"]})
    event = events[mine.headers["x-request-id"]]
    assert event.tenant_id == "acme" and event.status == "ok"
    assert event.completion_tokens == mine.json()["usage"]["completion_tokens"]


async def test_a_resent_long_prompt_reports_cached_tokens_and_a_salt_keeps_its_own(
    stack: GatewayStack,
) -> None:
    """usage.prompt_tokens_details.cached_tokens through the real gateway; cache_salt (an extension the
    official client sends through extra_body) shares blocks only with the same salt."""
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["acme"], max_retries=0)
    system = "You are the support desk of a shop that sells garden tools. " * 12  # several KV blocks

    async def cached(salt: str | None = None) -> int:
        extra = {"cache_salt": salt} if salt else None
        done = await client.chat.completions.create(
            model="acme/support:prod",
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi"}],
            max_tokens=2,
            extra_body=extra,
        )
        details = done.usage.prompt_tokens_details
        assert details is not None
        return details.cached_tokens or 0

    # two replicas own the adapter: asked a few times, a request lands where the prompt was seen before
    assert await cached() == 0
    assert max([await cached() for _ in range(4)]) >= 64
    assert await cached("end-user-1") == 0  # the same tokens under a salt: nothing shared
    assert max([await cached("end-user-1") for _ in range(4)]) >= 64


async def test_bad_keys_are_401_with_one_body(stack: GatewayStack) -> None:
    pool = await asyncpg.create_pool(stack.database_url, min_size=1, max_size=1)
    from gateway.tenants import create_key, revoke_key

    revoked = await create_key(pool, "acme")
    await revoke_key(pool, revoked.key_id)
    await pool.close()
    bodies = set()
    async with httpx.AsyncClient(base_url=stack.url) as c:
        for headers in (
            {},
            {"Authorization": "Bearer lf-nope"},
            {"Authorization": f"Bearer {revoked.secret}"},
        ):
            resp = await c.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert resp.status_code == 401
            assert resp.json()["error"]["code"] == "invalid_api_key"
            bodies.add(resp.content)
    assert len(bodies) == 1


async def test_other_tenants_alias_is_the_same_404_as_an_unknown_one(stack: GatewayStack) -> None:
    async with httpx.AsyncClient(base_url=stack.url, headers=_auth(stack)) as c:
        theirs = await c.post("/v1/chat/completions", json={**CHAT, "model": "globex/sales:prod"})
        unknown = await c.post("/v1/chat/completions", json={**CHAT, "model": "globex/nothing:prod"})
        garbage = await c.post("/v1/chat/completions", json={**CHAT, "model": "no such model"})
    assert theirs.status_code == unknown.status_code == garbage.status_code == 404
    assert theirs.content == unknown.content == garbage.content
    assert theirs.json()["error"] == {
        "message": "The model does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


@pytest.mark.parametrize(
    "change, code, param",
    [
        ({"n": 9}, "invalid_parameter", "n"),
        ({"top_logprobs": 2}, "invalid_parameter", "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "invalid_parameter", "top_logprobs"),
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "unsupported_parameter", "tools[0].type"),
        ({"tool_choice": "required"}, "invalid_parameter", "tool_choice"),
        (
            {"messages": [{"role": "user", "content": "Hi", "cache": True}]},
            "unknown_parameter",
            "messages[0].cache",
        ),
        ({"presence_penalty": 2.5}, "invalid_parameter", "presence_penalty"),
        # an id past the vocabulary: the replica refuses it, and the gateway passes its 400 on
        ({"logit_bias": {"99999999": 1}}, "invalid_request", "logit_bias"),
        ({"temperature": 5}, "invalid_parameter", "temperature"),
        ({"messages": []}, "invalid_parameter", "messages"),
        ({"max_tokens": -1}, "invalid_parameter", "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "invalid_parameter", "stop"),
        ({"messages": [{"role": "user", "content": "word " * 5000}]}, "context_length_exceeded", "messages"),
    ],
)
async def test_bad_parameters_are_400(stack: GatewayStack, change: dict, code: str, param: str) -> None:
    async with httpx.AsyncClient(base_url=stack.url, headers=_auth(stack)) as c:
        resp = await c.post("/v1/chat/completions", json={**CHAT, **change, "max_tokens": 4} | change)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == code and resp.json()["error"]["param"] == param


async def test_the_openai_client_gets_bad_request_errors_naming_refused_fields(stack: GatewayStack) -> None:
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["acme"], max_retries=0)
    refused: list[tuple[dict, str]] = [
        ({"tools": [{"type": "custom", "custom": {"name": "lookup"}}]}, "tools[0].type"),
        ({"extra_body": {"top_k": 5}}, "top_k"),
    ]
    for fields, param in refused:
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(
                model="acme/support:prod",
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=4,
                **fields,
            )
        assert err.value.param == param, (fields, err.value.body)
        assert err.value.code in {"unsupported_parameter", "unknown_parameter"}, err.value.body
    done = await client.chat.completions.create(
        model="acme/support:prod",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        n=1,
        logprobs=False,
        store=True,
        metadata={"ticket": "T-7"},
        user="end-user-1",
        safety_identifier="hash-1",
        prompt_cache_key="conversation-1",
    )
    assert done.choices[0].finish_reason in {"stop", "length"}


async def test_the_openai_clients_logit_bias_reaches_the_replica(stack: GatewayStack) -> None:
    """+100 on one token id makes every greedy token that id: four tokens are the one-token answer four
    times."""
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["acme"], max_retries=0)

    async def answer(max_tokens: int) -> openai.types.chat.ChatCompletion:
        return await client.chat.completions.create(
            model="acme/support:prod",
            messages=[{"role": "user", "content": "Say hello."}],
            temperature=0,
            max_tokens=max_tokens,
            logit_bias={"42": 100},
            presence_penalty=0.5,
            frequency_penalty=0.5,
        )

    one, four = await answer(1), await answer(4)
    assert four.usage is not None and four.usage.completion_tokens == 4
    piece = one.choices[0].message.content
    assert piece and four.choices[0].message.content == piece * 4


async def test_the_openai_clients_penalties_act_on_the_generated_tokens_only(stack: GatewayStack) -> None:
    """Greedy with and without a frequency penalty: the first token (nothing generated yet) and its logprob
    are the same; after it, the penalised answer's tokens or logprobs differ."""
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["globex"], max_retries=0)

    async def answer(penalty: float) -> list:
        done = await client.chat.completions.create(
            model="globex/sales:prod",
            messages=[{"role": "user", "content": "Repeat: la la la la la la la la"}],
            temperature=0,
            max_tokens=12,
            logprobs=True,
            frequency_penalty=penalty,
        )
        return [(e.token, round(e.logprob, 4)) for e in done.choices[0].logprobs.content or []]  # type: ignore[union-attr]

    plain = await answer(0.0)
    await asyncio.sleep(0.6)  # globex's rate limit is two requests a second
    penalised = await answer(2.0)
    assert plain[0] == penalised[0]
    assert plain[1:] != penalised[1:]


async def test_chat_logprobs_are_each_tokens_with_its_top_alternatives_streamed_or_not(
    stack: GatewayStack,
) -> None:
    """Greedy: every token is its own top alternative, asking for logprobs changes no token, and the
    stream's entries are the whole answer's."""
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["acme"], max_retries=0)
    args = {
        "model": "acme/support:prod",
        "messages": [{"role": "user", "content": "Count to ten."}],
        "temperature": 0,
        "max_tokens": 6,
    }
    plain = await client.chat.completions.create(**args)
    done = await client.chat.completions.create(**args, logprobs=True, top_logprobs=3)
    choice = done.choices[0]
    assert choice.message.content == plain.choices[0].message.content
    assert choice.logprobs is not None and choice.logprobs.content
    for entry in choice.logprobs.content:
        assert entry.logprob <= 0.0 and bytes(entry.bytes or []).decode(errors="replace") == entry.token
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True
        )
    if choice.finish_reason == "length":
        assert len(choice.logprobs.content) == done.usage.completion_tokens  # type: ignore[union-attr]
    stream = await client.chat.completions.create(**args, logprobs=True, top_logprobs=3, stream=True)
    streamed = [
        e
        async for c in stream
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content or []
    ]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [
        (e.token, round(e.logprob, 4)) for e in choice.logprobs.content
    ]
    bare = await client.chat.completions.create(**args, logprobs=True)
    assert bare.choices[0].logprobs is not None
    assert all(e.top_logprobs == [] for e in bare.choices[0].logprobs.content or [])


async def test_legacy_completion_logprobs_have_openais_legacy_shape_streamed_or_not(
    stack: GatewayStack,
) -> None:
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["acme"], max_retries=0)
    args = {
        "model": "acme/support:prod",
        "prompt": "The capital of France is",
        "max_tokens": 5,
        "temperature": 0,
    }
    done = await client.completions.create(**args, logprobs=2)
    lp = done.choices[0].logprobs
    assert (
        lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset is not None
    )
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert all(
        len(top) <= 2 and max(top.values()) >= lp_ - 1e-4
        for top, lp_ in zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    )
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    if done.choices[0].finish_reason == "length" and not any("\ufffd" in t for t in lp.tokens):
        assert "".join(lp.tokens) == done.choices[0].text
    stream = await client.completions.create(**args, logprobs=2, stream=True)
    tokens, offsets = [], []
    async for c in stream:
        if c.choices and c.choices[0].logprobs:
            tokens += c.choices[0].logprobs.tokens or []
            offsets += c.choices[0].logprobs.text_offset or []
    assert tokens == lp.tokens and offsets == lp.text_offset


async def test_n_choices_differ_repeat_with_a_seed_and_are_all_billed(stack: GatewayStack) -> None:
    """n=3 with a seed: three distinct choices, the same three again, and usage (answered, refunded and
    published) counts the prompt once and every choice's tokens."""
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["acme"], max_retries=0)
    args = {
        "model": "acme/support:prod",
        "messages": [{"role": "user", "content": "Write a short poem about rain."}],
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 1234,
        "n": 3,
        "logprobs": True,
    }
    raw = await client.chat.completions.with_raw_response.create(**args)
    done = raw.parse()
    again = await client.chat.completions.create(**args)
    assert [c.index for c in done.choices] == [0, 1, 2]
    texts = [c.message.content for c in done.choices]
    assert texts == [c.message.content for c in again.choices]
    assert len(set(texts)) > 1
    single = await client.chat.completions.create(**(args | {"n": 1}))
    assert single.usage is not None and done.usage is not None
    assert done.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counted once
    # a token line per generated token, but the one that stopped a "stop" finish
    tokens = sum(
        len(c.logprobs.content or []) + (c.finish_reason == "stop") for c in done.choices if c.logprobs
    )
    assert done.usage.completion_tokens == tokens
    assert done.usage.total_tokens == done.usage.prompt_tokens + tokens
    request_id = raw.headers["x-request-id"]
    event = (await _completed(stack, {request_id}))[request_id]
    assert (event.prompt_tokens, event.completion_tokens) == (done.usage.prompt_tokens, tokens)


async def test_the_rate_limit_reserves_every_choices_tokens(stack: GatewayStack) -> None:
    """30,000 tokens fit acme's 200,000 a minute once, but not eight times: n=8 is refused by the gateway's
    limit before any replica sees it, while n=1 reaches the replica (which finds it over its context)."""
    async with httpx.AsyncClient(base_url=stack.url, headers=_auth(stack)) as c:
        one = await c.post("/v1/chat/completions", json={**CHAT, "max_completion_tokens": 30_000, "n": 1})
        eight = await c.post("/v1/chat/completions", json={**CHAT, "max_completion_tokens": 30_000, "n": 8})
    assert one.status_code == 400 and one.json()["error"]["code"] == "context_length_exceeded", one.text
    assert eight.status_code == 400, eight.text
    assert eight.json()["error"]["code"] == "tokens_exceed_limit"
    assert eight.json()["error"]["param"] == "max_completion_tokens"


async def test_the_openai_client_assembles_streamed_choices_by_index(stack: GatewayStack) -> None:
    client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["acme"], max_retries=0)
    args = {
        "model": "acme/support:prod",
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 6,
        "seed": 7,
        "n": 3,
    }
    whole = await client.chat.completions.create(**args)
    # the client's own stream assembler (a length finish is fine: the snapshot is not parsed for a format)
    async with client.chat.completions.stream(**args, stream_options={"include_usage": True}) as stream:
        async for _ in stream:
            pass
        final = stream.current_completion_snapshot
    assert [c.message.content for c in final.choices] == [c.message.content for c in whole.choices]
    assert [c.finish_reason for c in final.choices] == [c.finish_reason for c in whole.choices]
    assert final.usage is not None and whole.usage is not None
    assert final.usage.completion_tokens == whole.usage.completion_tokens
    legacy = await client.completions.create(
        model="acme/support:prod", prompt="Once upon a time", max_tokens=4, seed=3, n=2, stream=True
    )
    texts = {0: "", 1: ""}
    finished = set()
    async for c in legacy:
        for choice in c.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1} and all(texts.values())


async def test_invalid_json_is_400_and_oversized_body_is_413(stack: GatewayStack) -> None:
    async with httpx.AsyncClient(base_url=stack.url, headers=_auth(stack)) as c:
        bad = await c.post(
            "/v1/chat/completions", content=b'{"model": ', headers={"content-type": "application/json"}
        )
        huge = await c.post("/v1/chat/completions", content=b"x" * (2 << 20))
        chunked = await c.post("/v1/chat/completions", content=_chunks(65536, 40))
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    assert huge.status_code == 413 and chunked.status_code == 413
    assert huge.json()["error"]["code"] == "request_too_large"


async def test_burst_over_the_limit_gets_429_and_other_tenant_is_unaffected(stack: GatewayStack) -> None:
    """However slowly the burst arrives, globex gets no more than its bucket plus what refilled meanwhile."""
    rate, _ = TENANT_LIMITS["globex"]
    capacity, n = max(1.0, rate), 12  # the request bucket holds one second's worth
    await asyncio.sleep(
        capacity / rate
    )  # long enough to refill from empty, so the burst starts on a full bucket
    body = {"model": "globex/sales:prod", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    acme = {**CHAT, "max_tokens": 1}
    async with httpx.AsyncClient(base_url=stack.url, timeout=60) as c:
        started = time.monotonic()
        burst = [c.post("/v1/chat/completions", json=body, headers=_auth(stack, "globex")) for _ in range(n)]
        others = [c.post("/v1/chat/completions", json=acme, headers=_auth(stack)) for _ in range(3)]
        results = await asyncio.gather(*burst, *others)
        elapsed = time.monotonic() - started  # every admission decision fell inside this window
    ours, limited = results[:n], [r for r in results[:n] if r.status_code == 429]
    admitted = sum(r.status_code == 200 for r in ours)
    assert admitted + len(limited) == n, [r.status_code for r in ours]
    assert min(n, capacity) <= admitted <= capacity + rate * elapsed, (admitted, elapsed)
    for r in limited:
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert [r.status_code for r in results[n:]] == [200, 200, 200]


async def test_unknown_models_and_model_lookups_count_against_the_tenants_request_rate(
    stack: GatewayStack,
) -> None:
    """Each would read the database: a tenant asking for endless unknown names, or listing its models in a
    loop, gets 429 past its request rate like any chat; another tenant's lookups are unaffected."""
    rate, _ = TENANT_LIMITS["globex"]
    capacity, n = max(1.0, rate), 12
    await asyncio.sleep(capacity / rate)  # a full bucket to start from
    globex = _auth(stack, "globex")
    async with httpx.AsyncClient(base_url=stack.url, timeout=60) as c:
        started = time.monotonic()
        lookups = [
            c.post(
                "/v1/chat/completions",
                json={"model": f"globex/nothing-{i}:prod", "messages": [{"role": "user", "content": "Hi"}]},
                headers=globex,
            )
            for i in range(n)
        ] + [c.get("/v1/models", headers=globex) for _ in range(n)]
        others = [c.get("/v1/models", headers=_auth(stack)) for _ in range(3)]
        results = await asyncio.gather(*lookups, *others)
        elapsed = time.monotonic() - started
    ours = results[: 2 * n]
    served = [r for r in ours if r.status_code in (200, 404)]
    limited = [r for r in ours if r.status_code == 429]
    assert len(served) + len(limited) == 2 * n, [r.status_code for r in ours]
    assert len(served) <= capacity + rate * elapsed, (len(served), elapsed)
    for r in limited:
        assert r.json()["error"]["code"] == "rate_limit_exceeded" and int(r.headers["retry-after"]) >= 1
    assert all(r.json()["error"]["code"] == "model_not_found" for r in served if r.status_code == 404)
    assert [r.status_code for r in results[2 * n :]] == [200, 200, 200]


async def test_client_disconnect_aborts_the_generation_on_the_replica(stack: GatewayStack) -> None:
    """Counted in tokens, not seconds: the replica stops within a few steps of the disconnect, however slow
    each step is, where a generation left running would go on to its 400 tokens."""
    max_tokens = 400
    async with httpx.AsyncClient(base_url=stack.url, headers=_auth(stack), timeout=60) as c:
        async with c.stream(
            "POST", "/v1/chat/completions", json={**CHAT, "max_tokens": max_tokens, "stream": True}
        ) as r:
            seen = 0
            async for _event, _data in _sse(r):
                seen += 1
                if seen == 3:
                    busy = await _busy_replica(stack)
                    at_close = (await stack.state(busy))["tokens_in_flight"]  # prompt + tokens so far
                    break
    closed, last = time.monotonic(), at_close
    while (state := await stack.state(busy))["tokens_in_flight"] or state["queue_depth"]:
        last = state["tokens_in_flight"]
        assert time.monotonic() - closed < 120, "the replica never went idle"
        await asyncio.sleep(0.05)
    waited = time.monotonic() - closed
    assert last - at_close < max_tokens // 4, (
        f"{last - at_close} tokens after the disconnect ({waited:.1f} s)"
    )


async def test_alias_flip_sends_new_requests_to_the_new_version_while_running_ones_finish(
    stack: GatewayStack, services
) -> None:
    pool = await asyncpg.create_pool(stack.database_url, min_size=1, max_size=2)
    producer = make_producer(services.settings())
    await producer.start()
    try:
        async with httpx.AsyncClient(base_url=stack.url, headers=_auth(stack), timeout=60) as c:
            body = {**CHAT, "max_tokens": 40, "stream": True}
            async with c.stream("POST", "/v1/chat/completions", json=body) as running:
                assert running.headers["x-adapter-id"] == "acme-support-v1"
                view, changed = await aliases.set_alias(pool, "acme/support:prod", "acme-support-v2")
                assert changed
                event = AliasChanged(
                    alias=view.alias, tenant_id="acme", adapter_id=view.adapter_id, revision=view.revision
                )
                await producer.send_and_wait(event.topic.name, event.to_bytes(), key=event.key().encode())
                deadline = time.monotonic() + 30
                while True:
                    fresh = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1})
                    if fresh.headers["x-adapter-id"] == "acme-support-v2":
                        break
                    assert time.monotonic() < deadline, "new requests should reach the new version"
                    await asyncio.sleep(0.1)
                events = [(e, d) async for e, d in _sse(running)]
            assert events[-1] == (None, "[DONE]")
    finally:
        view, _ = await aliases.set_alias(pool, "acme/support:prod", "acme-support-v1")
        event = AliasChanged(
            alias=view.alias, tenant_id="acme", adapter_id=view.adapter_id, revision=view.revision
        )  # the revision the row has now: the gateway's cache keeps the newest revision it has seen
        await producer.send_and_wait(event.topic.name, event.to_bytes(), key=event.key().encode())
        await producer.stop()
        await pool.close()


async def _served_by(c: httpx.AsyncClient, user: str | None = None) -> str:
    body = {**CHAT, "max_tokens": 1, **({"user": user} if user else {})}
    resp = await c.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.headers["x-adapter-id"]


async def test_a_weighted_canary_takes_its_share_sticky_per_user_until_rolled_back(
    stack: GatewayStack, services
) -> None:
    """The production path end to end: set_alias writes the row and its aliases.changed outbox event, the
    real relay publishes it, the gateway's cache drops the entry and the next request reads the split."""
    alias, weight, n = "acme/support:prod", 0.25, 120
    on_canary = next(f"user-{i}" for i in range(1000) if unit_hash(alias, f"user-{i}") < weight)
    pool = await asyncpg.create_pool(stack.database_url, min_size=1, max_size=3)
    producer = make_producer(services.settings())
    await producer.start()
    stop = asyncio.Event()
    relay = asyncio.create_task(Relay(pool, producer, RelaySettings(poll_interval_s=0.05)).run(stop))
    try:
        async with httpx.AsyncClient(base_url=stack.url, headers=_auth(stack), timeout=60) as c:
            await aliases.set_alias(
                pool, alias, "acme-support-v1", CanaryTarget(adapter_id="acme-support-v2", weight=weight)
            )

            async def split_seen() -> bool:
                return await _served_by(c, on_canary) == "acme-support-v2"

            await wait_until(split_seen, "the gateway to read the canary split")
            assert {await _served_by(c, on_canary) for _ in range(5)} == {
                "acme-support-v2"
            }  # sticky per user
            gate = asyncio.Semaphore(4)

            async def one() -> str:
                async with gate:
                    return await _served_by(c)  # no user: the request id decides

            served = await asyncio.gather(*(one() for _ in range(n)))
            canary = served.count("acme-support-v2")
            assert set(served) == {"acme-support-v1", "acme-support-v2"}
            bound = 4 * (n * weight * (1 - weight)) ** 0.5  # four standard deviations of Binomial(n, w)
            assert abs(canary - n * weight) <= bound, f"{canary} of {n} on the canary at weight {weight}"

            await aliases.set_alias(pool, alias, "acme-support-v1")  # what `alias rollback` sends

            async def rolled_back() -> bool:
                return await _served_by(c, on_canary) == "acme-support-v1"

            await wait_until(rolled_back, "the rollback to reach the gateway")
            assert {await _served_by(c) for _ in range(20)} == {"acme-support-v1"}
    finally:
        await aliases.set_alias(pool, alias, "acme-support-v1")
        stop.set()
        await relay
        await producer.stop()
        await pool.close()


async def test_killing_the_owner_mid_stream_ends_with_an_error_event_and_next_goes_elsewhere(
    stack: GatewayStack,
) -> None:
    async with httpx.AsyncClient(base_url=stack.url, headers=_auth(stack), timeout=60) as c:
        body = {**CHAT, "max_tokens": 400, "stream": True}
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            events = []
            async for event, data in _sse(r):
                events.append((event, data))
                if len(events) == 3:
                    victim = await _busy_replica(stack)
                    os.kill(stack.replicas[victim].proc.pid, signal.SIGKILL)
            lost = r.headers["x-request-id"]
        assert events[-1][0] == "error" and json.loads(events[-1][1])["error"]["code"] == "replica_lost"
        assert all(d != "[DONE]" for _, d in events)
        assert stack.replicas[victim].proc.wait(5) == -signal.SIGKILL
        survivor = next(rid for rid in stack.replicas if rid != victim)
        nxt = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})
        assert nxt.status_code == 200, nxt.text
        client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["acme"], max_retries=0)
        raw = await client.chat.completions.with_raw_response.create(**CHAT, max_tokens=400, stream=True)
        stream = raw.parse()
        async for _chunk in stream:
            state = await stack.state(survivor)  # asked of the survivor itself: it has this stream in flight
            assert state["queue_depth"] or state["tokens_in_flight"]
            break
        await stream.close()
    # The gateway's own record of each request (requests.completed) names the replica that served it.
    later = [nxt.headers["x-request-id"], raw.headers["x-request-id"]]
    served = await _completed(stack, {lost, *later})
    assert (served[lost].replica_id, served[lost].error_code) == (victim, "replica_lost")
    assert [served[rid].replica_id for rid in later] == [survivor, survivor]
    stack.replicas[victim].start()
    await wait_http(f"{stack.replicas[victim].url}/health", 120, stack.replicas[victim].proc)


async def test_no_live_replica_is_503_with_retry_after(stack: GatewayStack) -> None:
    for r in stack.replicas.values():
        r.proc.send_signal(signal.SIGSTOP)  # the state publisher gets no answer; states go stale
    try:
        await wait_until(lambda: _live_replicas_are(stack, set()), "both replicas' states to go stale", 60)
        async with httpx.AsyncClient(base_url=stack.url, headers=_auth(stack), timeout=10) as c:
            resp = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1})
        assert resp.status_code == 503 and int(resp.headers["retry-after"]) >= 1
        assert resp.json()["error"]["code"] == "no_replica_available"
    finally:
        for r in stack.replicas.values():
            r.proc.send_signal(signal.SIGCONT)
