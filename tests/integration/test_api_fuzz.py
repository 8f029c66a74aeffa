"""Fuzzing the gateway's two APIs as they run: schemathesis from each app's own OpenAPI document, and
hostile request bodies, against the public gateway and the internal API as processes on loopback, with two
real SmolLM2 replicas behind the public one.

Pass means: no answer is a 5xx, every error is OpenAI's error object, and nothing the fuzzer sends makes a
process log a traceback. Fixed hypothesis settings (derandomize=True) keep each run the same in CI, and the
budgets keep each test under a minute on two loaded cores.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from harness.stacks.gateway import GatewayStack, gateway_stack, random_adapters
from tests.integration.internal_api_proc import InternalApi, internal_api
from tests.integration.openai_errors import openai_error
from tests.integration.services import ServiceAddresses
from tests.integration.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICE_TOKEN = "fuzz-internal-service-token"
ALIAS = "acme/support:prod"
MAX_MODEL_LEN = 2048  # the replicas' context (ReplicaSettings.max_model_len)


def fuzz_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure is reported as it was found
        suppress_health_check=list(HealthCheck),
    )


@pytest.fixture(scope="module")
async def stack(
    services: ServiceAddresses, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[GatewayStack]:
    root, base_hash = await random_adapters(tmp_path_factory.mktemp("adapters"))
    # No replica is killed here: a long staleness keeps a loaded machine's late replica.state from
    # emptying the router's view, so a 503 would be the gateway's own.
    extra = {"LORAFLEET_GATEWAY_REPLICA_STALE_S": "30"}
    work = tmp_path_factory.mktemp("gw")
    async with gateway_stack(services.settings(), root, base_hash, work, extra_env=extra) as s:
        await wait_until(lambda: _both_replicas_live(s), "both replicas to become live", 60)
        yield s


@pytest.fixture(scope="module")
async def internal(
    stack: GatewayStack, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[InternalApi]:
    """The internal API (registry and aliases) as its own process on the stack's database."""
    async with internal_api(stack, SERVICE_TOKEN, tmp_path_factory.mktemp("internal")) as api:
        yield api


async def _both_replicas_live(stack: GatewayStack) -> bool:
    async with httpx.AsyncClient() as c:
        return set((await c.get(f"{stack.url}/ready")).json()["replicas"]) == set(stack.replicas)


def _no_tracebacks(*logs: Path) -> None:
    for log in logs:
        text = log.read_text(errors="replace")
        assert "Traceback" not in text and "Exception in ASGI application" not in text, (
            f"{log}:\n{text[-4000:]}"
        )


def _logs(stack: GatewayStack) -> list[Path]:
    return [stack.gateway_log, *(r.log for r in stack.replicas.values())]


def _check(resp: Any, what: str) -> None:
    """No 5xx; every error is OpenAI's error object."""
    assert resp.status_code < 500, (what, resp.status_code, resp.text[:500])
    if resp.status_code >= 400:
        openai_error(resp)


def _run_schemathesis(
    url: str, auth: dict[str, str], max_examples: int
) -> tuple[dict[int, int], set[tuple[str, str]]]:
    """Positive and negative cases over every operation of url's OpenAPI document: status -> count, and the
    (method, path) operations called."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=auth)
    cases = st.one_of(
        schema.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE),
        schema.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE),
    )
    statuses: dict[int, int] = {}
    called: set[tuple[str, str]] = set()

    @fuzz_settings(max_examples)
    @given(case=cases, keep_generated_auth=st.booleans())
    def run(case: schemathesis.Case, keep_generated_auth: bool) -> None:
        resp = case.call(base_url=url, headers=None if keep_generated_auth else auth, timeout=60)
        statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
        called.add((case.method.upper(), case.path))
        _check(resp, f"{case.method} {case.formatted_path} {case.body!r:.300}")

    run()
    return statuses, called


async def test_schemathesis_on_the_public_api_finds_no_5xx_and_only_openai_errors(
    stack: GatewayStack,
) -> None:
    auth = {"Authorization": f"Bearer {stack.keys['acme']}"}
    statuses, called = await asyncio.to_thread(_run_schemathesis, stack.url, auth, 150)
    assert sum(statuses.values()) >= 150 and any(400 <= s < 500 for s in statuses), statuses
    assert {("POST", "/v1/chat/completions"), ("POST", "/v1/completions")} <= called, called
    _no_tracebacks(*_logs(stack))


async def test_schemathesis_on_the_internal_api_finds_no_5xx_and_only_openai_errors(
    stack: GatewayStack, internal: InternalApi
) -> None:
    auth = {"Authorization": f"Bearer {SERVICE_TOKEN}"}
    statuses, _ = await asyncio.to_thread(_run_schemathesis, internal.url, auth, 300)
    assert sum(statuses.values()) >= 300 and any(s < 300 for s in statuses), statuses
    _no_tracebacks(internal.log)


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": ALIAS, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2} | fields


def _raw(fields: dict[str, str]) -> bytes:
    """A body whose listed fields are spliced in as raw JSON text (for what json.dumps cannot write)."""
    base = {k: v for k, v in _body().items() if k not in fields}
    text = json.dumps(base, separators=(",", ":"))[:-1]
    return (text + "".join(f',"{k}":{v}' for k, v in fields.items()) + "}").encode()


DEEP = 100_000
HOSTILE: dict[str, bytes] = {
    "max_tokens_1e30": _raw({"max_tokens": "1e30"}),
    "max_tokens_400_digits": _raw({"max_tokens": "1" + "0" * 400}),
    "max_tokens_negative": _raw({"max_tokens": "-1"}),
    "max_tokens_2_64": _raw({"max_completion_tokens": str(2**64)}),
    "seed_2_70": _raw({"seed": str(2**70)}),
    "seed_minus_2_70": _raw({"seed": str(-(2**70))}),
    "temperature_nan": _raw({"temperature": "NaN"}),
    "temperature_infinity": _raw({"temperature": "Infinity"}),
    "top_p_minus_infinity": _raw({"top_p": "-Infinity"}),
    "temperature_1e400": _raw({"temperature": "1e400"}),
    "deep_list": _raw({"messages": "[" * DEEP + "]" * DEEP}),
    "deep_object": _raw({"stream_options": '{"a":' * DEEP + "1" + "}" * DEEP}),
    "deep_unknown_field": _raw({"extra": "[" * DEEP + "]" * DEEP}),
    "invalid_utf8": json.dumps(_body(user="XX")).encode().replace(b"XX", b"\xff\xfe"),
    "invalid_utf8_content": json.dumps(_body()).encode().replace(b"Say hi.", b"Say \xc0\xaf hi."),
    "lone_surrogate": json.dumps(_body()).encode().replace(b"Say hi.", b"Say \\ud800 hi."),
    "nul_in_content": json.dumps(_body()).encode().replace(b"Say hi.", b"Say \\u0000 hi."),
    "nul_in_model": _raw({"model": '"acme/support:prod\\u0000"'}),
    "surrogate_in_model": _raw({"model": '"acme/\\udfff:prod"'}),
    "nul_in_user": _raw({"user": '"a\\u0000b"'}),
    "duplicate_keys": json.dumps(_body()).encode()[:-1] + b', "model": "nobody/else:prod", "max_tokens": 1}',
    "wrong_types": _raw({"messages": '"not a list"', "stream": '"yes"'}),
    "not_an_object": b"[1, 2, 3]",
    "empty": b"",
    "truncated": json.dumps(_body()).encode()[:-7],
}


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_hostile_bodies_are_refused_in_openai_s_shape(stack: GatewayStack, name: str) -> None:
    headers = {"Authorization": f"Bearer {stack.keys['acme']}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=60) as c:
        resp = await c.post(f"{stack.url}/v1/chat/completions", content=HOSTILE[name], headers=headers)
    _check(resp, name)
    if name not in (
        "duplicate_keys",
        "nul_in_content",
        "lone_surrogate",
        "deep_unknown_field",
        "nul_in_user",
    ):
        assert resp.status_code in (400, 404, 413), (name, resp.status_code, resp.text[:300])
    _no_tracebacks(*_logs(stack))


HOSTILE_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.sampled_from([-1, 0, 1, 2, 2049, 10**6, 10**6 + 1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
FIELDS = [
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "n",
    "stream", "stream_options", "user", "tools", "logprobs", "presence_penalty", "logit_bias", "metadata",
    "response_format",
]  # fmt: skip


def _mutated_bodies(url: str, key: str, max_examples: int) -> dict[int, int]:
    """A valid request for the real alias with one to three fields replaced by hostile JSON."""
    statuses: dict[int, int] = {}

    @fuzz_settings(max_examples)
    @given(st.dictionaries(st.sampled_from(FIELDS), HOSTILE_JSON, min_size=1, max_size=3))
    def run(changes: dict[str, Any]) -> None:
        body = _body(**changes)  # a valid max_tokens drawn is 1, 2 or past the context: short either way
        resp = httpx.post(
            f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
        )
        statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
        _check(resp, json.dumps(changes)[:300])

    run()
    return statuses


async def test_bodies_with_hostile_fields_never_answer_5xx(stack: GatewayStack) -> None:
    statuses = await asyncio.to_thread(_mutated_bodies, stack.url, stack.keys["acme"], 80)
    assert statuses.get(200, 0) > 0 and sum(v for s, v in statuses.items() if s == 400) > 0, statuses
    _no_tracebacks(*_logs(stack))


async def _tokens_in_flight(stack: GatewayStack) -> int:
    return sum([(await stack.state(rid))["tokens_in_flight"] for rid in stack.replicas])


@pytest.mark.parametrize(
    ("words", "max_tokens", "param"),
    [(3000, None, "messages"), (1200, MAX_MODEL_LEN, "max_tokens"), (200, MAX_MODEL_LEN - 100, "max_tokens")],
)
async def test_a_prompt_plus_max_tokens_over_the_context_is_refused_up_front(
    stack: GatewayStack, words: int, max_tokens: int | None, param: str
) -> None:
    body = _body(messages=[{"role": "user", "content": "hello " * words}])
    body.pop("max_tokens")
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    headers = {"Authorization": f"Bearer {stack.keys['acme']}"}
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=60) as c:
        resp = await c.post(f"{stack.url}/v1/chat/completions", json=body, headers=headers)
        assert resp.status_code == 400, resp.text[:300]
        err = openai_error(resp)
        assert err["code"] == "context_length_exceeded" and err["param"] == param, err
        assert str(MAX_MODEL_LEN) in err["message"]
        # refused before queuing: nothing was generated, and no replica holds tokens for it
        assert time.perf_counter() - started < 30
        assert await _tokens_in_flight(stack) == 0


INTERNAL_HOSTILE: list[tuple[str, str, Any]] = [
    ("GET", "/internal/adapters/a%00b", None),
    ("GET", "/internal/adapters/%ED%A0%80", None),
    ("GET", "/internal/adapters?tenant_id=a%00b", None),
    ("GET", "/internal/adapters?status=a%00b", None),
    ("GET", "/internal/aliases?tenant_id=a%00b", None),
    ("GET", "/internal/aliases/acme/x%00:prod", None),
    ("PUT", "/internal/aliases/acme/support:prod", {"adapter_id": "a\u0000b"}),
    ("PUT", "/internal/aliases/acme/support:prod", {"adapter_id": "x" * 100_000}),
    ("POST", "/internal/adapters", {"adapter_id": "a\u0000b"}),
]


@pytest.mark.parametrize(("method", "path", "body"), INTERNAL_HOSTILE)
async def test_hostile_internal_requests_are_refused_in_openai_s_shape(
    internal: InternalApi, method: str, path: str, body: Any
) -> None:
    headers = {"Authorization": f"Bearer {SERVICE_TOKEN}"}
    async with httpx.AsyncClient(timeout=60) as c:
        resp = await c.request(method, f"{internal.url}{path}", json=body, headers=headers)
    _check(resp, f"{method} {path}")
    _no_tracebacks(internal.log)


HOSTILE_AUTH: dict[str, bytes] = {
    "latin1_key": b"Bearer sk-\xff\xfe\x80",
    "long_key": b"Bearer " + b"k" * 16_000,
    "no_scheme": b"sk-lf-abc",
    "basic": b"Basic YTpi",
    "bare_bearer": b"Bearer",
    "double_space": b"Bearer  sk-lf-abc",
}


@pytest.mark.parametrize("name", list(HOSTILE_AUTH))
async def test_hostile_authorization_headers_get_openai_s_401(stack: GatewayStack, name: str) -> None:
    headers = [(b"Authorization", HOSTILE_AUTH[name]), (b"Content-Type", b"application/json")]
    async with httpx.AsyncClient(timeout=60) as c:
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
            resp = await c.request(method, f"{stack.url}{path}", content=json.dumps(_body()), headers=headers)
            assert resp.status_code == 401, (name, path, resp.status_code, resp.text[:300])
            assert openai_error(resp)["code"] == "invalid_api_key"
    _no_tracebacks(*_logs(stack))


OFF_SCHEMA: list[tuple[str, str, int]] = [
    ("GET", "/nope", 404),
    ("GET", "/v1/chat/completions", 405),
    ("DELETE", "/v1/models", 405),
    ("GET", "/v1/models/acme%2F%00", 404),
    ("GET", "/v1/models/" + "x" * 5000, 404),
    ("PUT", "/v1/chat/completions", 405),
]


@pytest.mark.parametrize(("method", "path", "status"), OFF_SCHEMA)
async def test_requests_off_the_schema_get_openai_errors(
    stack: GatewayStack, method: str, path: str, status: int
) -> None:
    headers = {"Authorization": f"Bearer {stack.keys['acme']}"}
    async with httpx.AsyncClient(timeout=60) as c:
        resp = await c.request(method, f"{stack.url}{path}", headers=headers)
    assert resp.status_code == status, (method, path, resp.status_code, resp.text[:300])
    openai_error(resp)
    _no_tracebacks(*_logs(stack))
