"""The gateway↔replica join with both sides real: the gateway's request builder, replica client and stream
reader against the replica server on SmolLM2, over a real socket."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from gateway.errors import BadRequest
from gateway.public.online import RequestRecord
from gateway.public.routes.chat import CHAT
from gateway.public.routes.completions import COMPLETIONS
from gateway.public.routing.policy import ReplicaLoad
from gateway.public.upstream.errors import public_error
from gateway.public.upstream.events import completion_events
from gateway.public.upstream.replica_client import ReplicaClient, ReplicaRejected, UpstreamStream
from lorafleet.model.base_hash import base_model_hash
from replica.config import ReplicaSettings
from replica.engine.admission_queue import FairQueue
from replica.engine.sampler import SamplingParams
from replica.runtime import Replica, build_replica
from replica.server import create_app
from schemas.openai import ChatCompletionRequest
from schemas.openai_completions import CompletionRequest
from schemas.replica_api import DoneEvent, GenerateRequest, LoadResponse, StateResponse, TokenEvent
from tests.replica.peft_util import AdapterRecipe, make_peft_adapters
from tests.replica.server.serving import serving

TOKEN = "join-token"


@pytest.fixture(scope="module")
async def served(
    smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Replica, ReplicaLoad]]:
    out = tmp_path_factory.mktemp("join-adapters")
    recipes = [AdapterRecipe("join-a", 8, 16, targets=("q_proj", "v_proj"), seed=3)]
    _, dirs = make_peft_adapters(smollm2_dir, out, recipes, base_hash=base_model_hash(smollm2_dir), std=0.2)
    settings = ReplicaSettings(
        replica_id="rj",
        service_token=TOKEN,
        model_dir=smollm2_dir,
        device="cpu",
        max_num_seqs=2,
        max_model_len=256,
        lora_slots={8: 1},
        adapter_dirs={"join-a": dirs["join-a"]},
        registry_url=None,
        control_enabled=False,
        cache_dir=out / "cache",
    )
    replica = build_replica(settings)
    async with serving(create_app(replica)) as url:
        yield replica, ReplicaLoad("rj", url, 0)


@pytest.fixture
async def client() -> AsyncIterator[ReplicaClient]:
    c = ReplicaClient(TOKEN)
    yield c
    await c.aclose()


def _failed(replica_id: str) -> None:
    raise AssertionError(f"replica {replica_id} should answer")


async def _read(upstream: UpstreamStream, rec: RequestRecord) -> list[TokenEvent | DoneEvent]:
    try:
        return [ev async for ev in completion_events(upstream, rec)]
    finally:
        await upstream.aclose()


async def test_every_generated_token_reaches_the_gateway_in_order(served, client: ReplicaClient) -> None:
    replica, load = served
    prompt = [1, 2, 3, 4, 5, 6, 7]
    body = GenerateRequest(
        prompt_token_ids=prompt, adapter_id="join-a", temperature=0, max_tokens=9, ignore_eos=True
    )
    rec = RequestRecord(request_id="join-1", tenant_id="acme", started=0.0)
    upstream = await client.open([load], body, _failed)
    assert upstream.response.headers["x-adapter-id"] == "join-a" and upstream.adapter_tier in {
        "remote",
        "gpu",
    }
    events = await _read(upstream, rec)

    params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    use = await replica.acquire("join-a")
    try:
        direct = [o async for o in replica.engine.generate(prompt, params, use.engine_adapter_id)]
    finally:
        replica.release(use)
    tokens, done = events[:-1], events[-1]
    assert all(isinstance(e, TokenEvent) for e in tokens) and isinstance(done, DoneEvent)
    assert [e.token_id for e in tokens] == [o.token_id for o in direct]  # type: ignore[union-attr]
    assert done.finish_reason == "length" and done.usage.completion_tokens == len(tokens) == 9
    assert rec.usage == done.usage and done.usage.prompt_tokens == len(prompt)


async def test_the_gateways_chat_request_is_one_the_replica_serves(served, client: ReplicaClient) -> None:
    replica, load = served
    chat = ChatCompletionRequest.model_validate(
        {
            "model": "acme/support:prod",
            "messages": [
                {"role": "developer", "content": "Answer briefly."},
                {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
            ],
            "temperature": 0,
            "stop": ["\n\n"],
        }
    )
    rec = RequestRecord(request_id="join-2", tenant_id="acme", started=0.0)
    events = await _read(
        await client.open([load], CHAT.replica_body(chat, "join-a", "join-2", 12, "acme"), _failed), rec
    )
    done = events[-1]
    assert isinstance(done, DoneEvent) and "".join(e.text for e in events).strip()
    stopped = done.finish_reason == "stop"
    assert done.usage.completion_tokens == len(events) - 1 + stopped <= 12
    # the caller's tenant reached the replica's fair admission, charged with the prompt and the completion
    fair = replica.engine.engine.scheduler.waiting
    assert isinstance(fair, FairQueue) and fair.served["acme"] >= done.usage.total_tokens - 1


async def test_the_gateways_completion_request_is_the_raw_prompt_the_replica_serves(
    served, client: ReplicaClient
) -> None:
    """A legacy completion's prompt reaches the model as its own tokens, no chat template around them."""
    replica, load = served
    assert replica.tokenizer is not None
    text = "The capital of France is"
    parsed = COMPLETIONS.parse(json.dumps({"model": "acme/support:prod", "prompt": text, "seed": 1}).encode())
    body = COMPLETIONS.replica_body(parsed, "join-a", "join-5", 4, "acme")
    assert (body.prompt, body.messages, body.max_tokens_is_default) == (text, None, True)
    rec = RequestRecord(request_id="join-5", tenant_id="acme", started=0.0)
    done = (await _read(await client.open([load], body, _failed), rec))[-1]
    assert isinstance(done, DoneEvent)
    assert done.usage.prompt_tokens == len(replica.tokenizer.encode(text, add_special_tokens=True))


async def test_a_completion_prompt_past_the_context_is_refused_naming_prompt(
    served, client: ReplicaClient
) -> None:
    _, load = served
    parsed = COMPLETIONS.parse(json.dumps({"model": "m/a:b", "prompt": "word " * 300}).encode())
    with pytest.raises(ReplicaRejected) as err:
        await client.open([load], COMPLETIONS.replica_body(parsed, "join-a", "join-6", 4, "acme"), _failed)
    assert err.value.status == 400 and err.value.error.code == "context_length_exceeded"
    assert err.value.error.param == "prompt"


async def test_a_refused_request_comes_back_as_the_replicas_error(served, client: ReplicaClient) -> None:
    _, load = served
    with pytest.raises(ReplicaRejected) as err:
        await client.open([load], GenerateRequest(prompt_token_ids=[1] * 300), _failed)
    assert err.value.status == 400 and err.value.error.code == "context_length_exceeded"
    assert err.value.error.type == "invalid_request_error" and err.value.error.param == "messages"


async def test_load_and_state_bodies_parse_as_the_contract(served) -> None:
    _, load = served
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=f"{load.url}/internal/replicas/rj", headers=headers) as c:
        loaded = LoadResponse.model_validate_json((await c.post("/adapters/join-a/load")).content)
        state = StateResponse.model_validate_json((await c.get("/state")).content)
    assert loaded.adapter_id == "join-a" and loaded.rank_bucket == 8
    assert "join-a" in state.gpu_adapters and state.replica_id == "rj" and state.url
    assert state.replica_state().gpu_adapters == state.gpu_adapters


def _chat(**fields: object) -> ChatCompletionRequest:
    body = {"model": "acme/support:prod", "messages": [{"role": "user", "content": "Say hello."}]}
    return CHAT.parse(json.dumps(body | fields).encode())


async def test_the_callers_logit_bias_and_penalties_reach_the_replicas_sampler(
    served, client: ReplicaClient
) -> None:
    """Through the gateway's parser and request builder: +100 on one id makes every greedy token that id."""
    _, load = served
    chat = _chat(temperature=0, logit_bias={"42": 100}, presence_penalty=0.5, frequency_penalty=-0.5)
    body = CHAT.replica_body(chat, "join-a", "join-3", 6, "acme")
    assert (body.presence_penalty, body.frequency_penalty, body.logit_bias) == (0.5, -0.5, {"42": 100.0})
    rec = RequestRecord(request_id="join-3", tenant_id="acme", started=0.0)
    events = await _read(await client.open([load], body, _failed), rec)
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
    assert tokens and set(tokens) == {42}


async def test_a_logit_bias_past_the_vocabulary_is_the_replicas_400_naming_it(
    served, client: ReplicaClient
) -> None:
    _, load = served
    body = CHAT.replica_body(_chat(logit_bias={"99999999": 1}), "join-a", "join-4", 4, "acme")
    with pytest.raises(ReplicaRejected) as err:
        await client.open([load], body, _failed)
    public = public_error(err.value)
    assert isinstance(public, BadRequest) and (public.status, public.param) == (400, "logit_bias")


@pytest.mark.parametrize(
    "fields",
    [
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
        {"logit_bias": {"5": 101}},
        {"logit_bias": {"abc": 1}},
        {"logit_bias": {str(i): 1 for i in range(301)}},
        {"messages": [{"role": "user", "content": "Hi", "foo": 1}]},
        {"temperature": -1},
    ],
    ids=lambda f: next(iter(f)),
)
async def test_the_gateway_and_the_replica_refuse_a_field_alike(served, fields: dict) -> None:
    """The same bad field sent to the gateway (as a chat body) and to a replica directly (as a generate
    body) gets the same error object."""
    _, load = served
    with pytest.raises(BadRequest) as at_gateway:
        _chat(**fields)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    generate = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4} | fields
    async with httpx.AsyncClient(base_url=load.url, headers=headers) as c:
        resp = await c.post("/internal/replicas/rj/generate", json=generate)
    assert resp.status_code == at_gateway.value.status == 400
    assert resp.json() == at_gateway.value.body(), fields


async def test_n_choices_with_logprobs_reach_the_gateway_tagged_and_counted(
    served, client: ReplicaClient
) -> None:
    """The gateway's n and logprobs through the real replica: every line names its choice, every token
    carries its logprobs, the second choice finds the prompt cached, and the usage counts both choices."""
    _, load = served
    text = "A long prompt about the sea, the wind and the boats that sail on it every day. " * 3
    body = CompletionRequest.model_validate(
        {"model": "acme/support:prod", "prompt": text, "n": 2, "logprobs": 3, "seed": 5, "max_tokens": 5}
    )
    rec = RequestRecord(request_id="join-n", tenant_id="acme", started=0.0)
    upstream = await client.open(
        [load], COMPLETIONS.replica_body(body, "join-a", "join-n", 5, "acme"), _failed
    )
    try:
        events = [ev async for ev in completion_events(upstream, rec, 2)]
    finally:
        await upstream.aclose()
    dones = {e.index: e for e in events if isinstance(e, DoneEvent)}
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert sorted(dones) == [0, 1] and {e.index for e in tokens} == {0, 1}
    assert all(e.logprobs is not None and len(e.logprobs.top_logprobs) == 3 for e in tokens)
    assert dones[0].usage.prompt_tokens_details.cached_tokens == 0
    assert dones[1].usage.prompt_tokens_details.cached_tokens >= 16
    assert rec.usage is not None and rec.usage.prompt_tokens == dones[0].usage.prompt_tokens
    assert rec.usage.completion_tokens == dones[0].usage.completion_tokens + dones[1].usage.completion_tokens
