"""The replica HTTP service on SmolLM2: streamed generation, load/unload/state, service token, error shapes."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from lorafleet.model.base_hash import base_model_hash
from replica.config import ReplicaSettings
from replica.runtime import Replica, build_replica
from replica.server import create_app
from tests.replica.peft_util import AdapterRecipe, make_peft_adapters

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE = "/internal/replicas/r1"


@pytest.fixture(scope="module")
async def replica(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Replica]:
    out = tmp_path_factory.mktemp("smol-adapters")
    recipes = [AdapterRecipe("smol-a", 8, 16, targets=("q_proj", "v_proj"), seed=1)]
    _, dirs = make_peft_adapters(smollm2_dir, out, recipes, base_hash=base_model_hash(smollm2_dir), std=0.2)
    _, bad = make_peft_adapters(
        smollm2_dir, out / "bad", [AdapterRecipe("smol-bad", 8, 16, targets=("q_proj",))]
    )
    settings = ReplicaSettings(
        replica_id="r1",
        service_token=TOKEN,
        model_dir=smollm2_dir,
        device="cpu",
        max_num_seqs=4,
        max_model_len=256,
        lora_slots={8: 2, 16: 1},
        adapter_dirs={"smol-a": dirs["smol-a"], "smol-bad": bad["smol-bad"]},
        registry_url=None,
        control_enabled=False,
        cache_dir=out / "cache",
    )
    rep = build_replica(settings)
    await rep.start()  # httpx's ASGITransport does not run the app's lifespan
    yield rep
    await rep.stop()


@pytest.fixture
async def client(replica: Replica) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(replica))
    async with httpx.AsyncClient(transport=transport, base_url="http://replica") as c:
        yield c


def _events(body: str) -> list[dict]:
    return [json.loads(line) for line in body.splitlines() if line]


async def _generate(client: httpx.AsyncClient, **changes: object) -> tuple[list[dict], dict]:
    """(token events, done event) of one generate call."""
    body = {"messages": [{"role": "user", "content": "Say hello."}], "temperature": 0, "max_tokens": 8}
    resp = await client.post(f"{BASE}/generate", json=body | changes, headers=AUTH)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/x-ndjson")
    events = _events(resp.text)
    assert [e["type"] for e in events] == ["token"] * (len(events) - 1) + ["done"]
    return events[:-1], events[-1]


async def test_generate_streams_tokens_then_usage(client: httpx.AsyncClient) -> None:
    """Every generated token is counted; each is streamed as a token event except the one that stops."""
    tokens, done = await _generate(client, ignore_eos=True)  # no end token: runs to max_tokens
    assert done["finish_reason"] == "length" and done["text"] == ""
    assert done["usage"]["completion_tokens"] == len(tokens) == 8
    text = "".join(e["text"] for e in tokens)
    assert text.strip()  # real text came back
    # The same greedy answer, told to stop at a piece of its own text: it ends there, or earlier on its
    # end token. Either way the token that stopped it is counted in usage but not streamed.
    stop = next(e["text"] for e in tokens[1:] if e["text"].strip())
    stopped, done = await _generate(client, stop=[stop])
    assert done["finish_reason"] == "stop"
    assert done["usage"]["completion_tokens"] == len(stopped) + 1 <= 8
    assert stop not in "".join(e["text"] for e in stopped) + done["text"]
    assert text.startswith("".join(e["text"] for e in stopped) + done["text"])


async def test_a_raw_prompt_is_tokenized_as_is_without_the_chat_template(
    client: httpx.AsyncClient, replica: Replica
) -> None:
    """A legacy completion's prompt: the tokenizer's ids of the text, the same answer as those ids sent."""
    assert replica.tokenizer is not None
    text = "The capital of France is"
    ids = replica.tokenizer.encode(text, add_special_tokens=True)
    tokens, done = await _generate(client, messages=None, prompt=text, ignore_eos=True)
    assert done["usage"]["prompt_tokens"] == len(ids) < 16  # no template around it
    same, _ = await _generate(client, messages=None, prompt_token_ids=ids, ignore_eos=True)
    assert [e["token_id"] for e in tokens] == [e["token_id"] for e in same]


async def test_adapter_request_reports_tier_and_differs_from_base(
    client: httpx.AsyncClient, replica: Replica
) -> None:
    body = {"prompt_token_ids": [1, 2, 3, 4, 5, 6], "temperature": 0, "max_tokens": 6, "ignore_eos": True}
    base = _events((await client.post(f"{BASE}/generate", json=body, headers=AUTH)).text)
    resp = await client.post(f"{BASE}/generate", json=body | {"adapter_id": "smol-a"}, headers=AUTH)
    # first use: pulled from its folder (the single-machine object store) through disk and RAM to a slot
    assert resp.headers["x-adapter-id"] == "smol-a" and resp.headers["x-adapter-tier"] == "remote"
    adapted = _events(resp.text)
    again = await client.post(f"{BASE}/generate", json=body | {"adapter_id": "smol-a"}, headers=AUTH)
    assert again.headers["x-adapter-tier"] == "gpu"
    ids = lambda evs: [e.get("token_id") for e in evs]  # noqa: E731
    assert ids(_events(again.text)) == ids(adapted) and ids(adapted) != ids(base)
    assert replica.cache is not None and replica.cache.gpu.ref_count("smol-a") == 0  # holds ended


async def test_load_state_unload(client: httpx.AsyncClient) -> None:
    resp = await client.post(f"{BASE}/adapters/smol-a/load", headers=AUTH)
    assert resp.status_code == 200 and resp.json()["tier"] == "gpu" and resp.json()["rank_bucket"] == 8
    state = (await client.get(f"{BASE}/state", headers=AUTH)).json()
    assert "smol-a" in state["gpu_adapters"] and "smol-a" in state["disk_adapters"]
    assert state["queue_depth"] == 0 and state["loads_per_min"] >= 1 and "evictions_per_min" in state
    assert (await client.post(f"{BASE}/adapters/smol-a/unload", headers=AUTH)).json()["unloaded"] is True
    state = (await client.get(f"{BASE}/state", headers=AUTH)).json()
    assert "smol-a" not in state["gpu_adapters"] + state["ram_adapters"] + state["disk_adapters"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/adapters/smol-a/load"),
        ("post", "/adapters/smol-a/unload"),
        ("get", "/state"),
        ("post", "/generate"),
    ],
)
async def test_internal_routes_need_the_service_token(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = await client.request(method, BASE + path, headers=headers, json={"prompt_token_ids": [1]})
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_service_token"


async def test_a_replica_holding_only_the_digest_accepts_the_token_and_nothing_else(
    replica: Replica, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What infra/k8s gives a replica: the token's sha256, not the token, so a replica that reads its own
    settings learns nothing another replica's routes accept; the digest itself is not a token."""
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    settings = replica.settings.model_copy(update={"service_token": "", "service_token_sha256": digest})
    monkeypatch.setattr(replica, "settings", settings)
    state = BASE + "/state"
    assert (await client.get(state, headers=AUTH)).status_code == 200
    for token in (digest, "", "wrong", digest.upper()):
        resp = await client.get(state, headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_service_token"
    assert (await client.get(state, headers={"Authorization": TOKEN})).status_code == 401  # no scheme
    # a replica with neither accepts nothing, not even an empty token
    monkeypatch.setattr(replica, "settings", settings.model_copy(update={"service_token_sha256": None}))
    for headers in (AUTH, {"Authorization": "Bearer "}, {}):
        assert (await client.get(state, headers=headers)).status_code == 401


async def test_a_prompt_too_long_in_bytes_is_refused_before_the_template_or_tokenizer_runs(
    replica: Replica, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1 MiB message can never fit 256 tokens: 400 context_length_exceeded from its length alone."""
    tokenizer = replica.tokenizer
    assert tokenizer is not None and 1 < tokenizer.max_token_bytes <= 128

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tokenizer or the template ran on a prompt that can never fit")

    monkeypatch.setattr(tokenizer, "encode", never)
    monkeypatch.setattr(tokenizer, "render_chat", never)
    for content in ("x" * (1 << 20), "é" * (256 * tokenizer.max_token_bytes // 2 + 1)):
        body = {"messages": [{"role": "user", "content": content}]}
        resp = await client.post(BASE + "/generate", json=body, headers=AUTH)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "context_length_exceeded"


async def test_bad_input_gets_error_json_not_500(client: httpx.AsyncClient) -> None:
    cases = [
        ("post", f"{BASE}/adapters/smol-bad/load", None, 409, "base_model_mismatch"),
        ("post", f"{BASE}/adapters/nope/load", None, 404, "adapter_not_found"),
        ("post", f"{BASE}/adapters/..%2Fetc/load", None, 404, "not_found"),
        ("post", f"{BASE}/adapters/-x/load", None, 400, "invalid_parameter"),
        (
            "post",
            f"{BASE}/generate",
            {"prompt_token_ids": [1], "adapter_id": "nope"},
            404,
            "adapter_not_found",
        ),
        ("post", f"{BASE}/generate", {"prompt_token_ids": [1], "temperature": -1}, 400, "invalid_parameter"),
        ("post", f"{BASE}/generate", {"prompt_token_ids": [1] * 300}, 400, "context_length_exceeded"),
        ("post", f"{BASE}/generate", {}, 400, "invalid_parameter"),
        (
            "post",
            f"{BASE}/generate",
            {"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}]},
            400,
            "invalid_parameter",
        ),
        ("post", f"{BASE}/generate", {"prompt": ""}, 400, "invalid_parameter"),
        ("post", f"{BASE}/generate", {"prompt": "word " * 2000}, 400, "context_length_exceeded"),
        ("get", "/internal/replicas/other/state", None, 404, "wrong_replica"),
    ]
    for method, url, body, status, code in cases:
        resp = await client.request(method, url, headers=AUTH, json=body)
        assert resp.status_code == status, (url, resp.text)
        err = resp.json()["error"]
        assert err["code"] == code and set(err) == {"message", "type", "param", "code"}


async def test_cancelled_stream_frees_its_blocks(replica: Replica) -> None:
    from replica.engine.sampler import SamplingParams

    blocks = replica.engine.engine.blocks
    free_before = blocks.num_free
    gen = replica.engine.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    first = await anext(gen)
    assert first.token_id is not None and blocks.num_free < free_before
    await gen.aclose()
    for _ in range(100):
        if blocks.num_free == free_before:
            break
        await asyncio.sleep(0.05)
    assert blocks.num_free == free_before and not replica.engine.engine.scheduler.running
    assert not blocks.tables


async def test_a_prompt_plus_max_tokens_over_the_context_is_refused_before_it_is_queued(
    client: httpx.AsyncClient, replica: Replica
) -> None:
    body = {"prompt_token_ids": [1] * 200, "max_tokens": 57, "ignore_eos": True}  # 257 > 256
    resp = await client.post(f"{BASE}/generate", json=body, headers=AUTH)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    assert "256" in err["message"] and "257" in err["message"]
    assert replica.engine.engine.seqs == {} and replica.running == set()
    resp = await client.post(f"{BASE}/generate", json=body | {"max_tokens": 56}, headers=AUTH)
    assert resp.status_code == 200 and _events(resp.text)[-1]["usage"]["completion_tokens"] == 56


async def test_a_default_max_tokens_shrinks_to_what_the_context_leaves(client: httpx.AsyncClient) -> None:
    for body in (
        {"prompt_token_ids": [1] * 250, "ignore_eos": True},
        {"prompt_token_ids": [1] * 250, "ignore_eos": True, "max_tokens": 200, "max_tokens_is_default": True},
    ):
        resp = await client.post(f"{BASE}/generate", json=body, headers=AUTH)
        assert resp.status_code == 200, resp.text
        assert _events(resp.text)[-1]["usage"]["completion_tokens"] == 6


async def test_logit_bias_reaches_the_sampler(client: httpx.AsyncClient) -> None:
    """+100 on one id outweighs every other logit: each greedy token is that id."""
    tokens, done = await _generate(client, ignore_eos=True, logit_bias={"42": 100})
    assert [e["token_id"] for e in tokens] == [42] * 8 and done["usage"]["completion_tokens"] == 8


async def test_penalties_reach_the_sampler(client: httpx.AsyncClient, replica: Replica) -> None:
    """The served tokens are the engine's under the same penalties, and not its unpenalised ones."""
    from replica.engine.sampler import SamplingParams

    prompt = [1, 2, 3, 4, 5, 6, 7]
    body = {"prompt_token_ids": prompt, "temperature": 0, "max_tokens": 24, "ignore_eos": True}
    penalties = {"presence_penalty": 1.5, "frequency_penalty": 2.0}
    resp = await client.post(f"{BASE}/generate", json=body | penalties, headers=AUTH)
    served = [e["token_id"] for e in _events(resp.text) if e["type"] == "token"]

    async def direct(**changes: float) -> list[int | None]:
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, **changes)
        return [o.token_id async for o in replica.engine.generate(prompt, params)]

    assert served == await direct(**penalties) != await direct()


@pytest.mark.parametrize(
    ("change", "param", "code"),
    [
        ({"logit_bias": {"99999999": 5}}, "logit_bias", "invalid_request"),  # past the vocabulary
        ({"logit_bias": {"5": 101}}, "logit_bias", "invalid_parameter"),
        ({"presence_penalty": -3}, "presence_penalty", "invalid_parameter"),
        ({"messages": [{"role": "user", "content": "Hi", "foo": 1}]}, "messages[0].foo", "unknown_parameter"),
        ({"top_k": 5}, "top_k", "unknown_parameter"),
    ],
)
async def test_a_refused_sampling_field_is_named(
    client: httpx.AsyncClient, change: dict, param: str, code: str
) -> None:
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4} | change
    resp = await client.post(f"{BASE}/generate", json=body, headers=AUTH)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] | {"message": ""} == {
        "message": "",
        "type": "invalid_request_error",
        "param": param,
        "code": code,
    }
