"""What a chat client gets over a replica stream, through the gateway's own error handlers and SSE response:
the completion, or an OpenAI-shaped error (never a 500, never a completion missing a token)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI, Response
from httpx_sse import aconnect_sse
from sse_starlette.event import ServerSentEvent

from gateway.errors import install_error_handlers
from gateway.public.online import RequestRecord
from gateway.public.upstream.chat_response import TEXT_SHAPE, completion_response, sse_chunks
from gateway.sse_response import SseResponse
from schemas.openai import ChatCompletionChunk, ChunkChoice, Delta, Usage
from tests.gateway.public.upstream.replica_lines import failed, outputs, record, replica_bytes, upstream

MODEL = "acme/support:prod"
ERROR_KEYS = {"message", "type", "param", "code"}
GOOD = replica_bytes(outputs(["Hel", "lo", " 世"], "stop", "界"))
MALFORMED = GOOD.replace(b'"text":"lo"', b'"text":"lo","logprob":-0.2')


class Finished:
    """Online.finish's record of how each request ended."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    async def __call__(self, rec: RequestRecord, status: str, code: str | None) -> None:
        self.calls.append((status, code))


@pytest.fixture
async def relay() -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, bytes], Finished]]:
    """A gateway app whose one route answers over the replica body in bodies['next']."""
    app = FastAPI()
    install_error_handlers(app)
    bodies: dict[str, bytes] = {}
    finished = Finished()

    @app.post("/chat")
    async def chat(stream: bool) -> Response:
        up, rec = upstream(bodies["next"], chunk=7), record()
        if stream:
            return SseResponse(sse_chunks(rec, up, MODEL, True, finished))
        return await completion_response(rec, up, MODEL, {"x-request-id": rec.request_id}, finished)

    @app.post("/text")
    async def text(stream: bool) -> Response:
        up, rec = upstream(bodies["next"], chunk=7), record()
        if stream:
            return SseResponse(sse_chunks(rec, up, MODEL, True, finished, TEXT_SHAPE))
        return await completion_response(rec, up, MODEL, {}, finished, TEXT_SHAPE)

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield client, bodies, finished


async def _sse(client: httpx.AsyncClient, path: str = "/chat") -> list[tuple[str, str]]:
    async with aconnect_sse(client, "POST", path, params={"stream": "true"}) as source:
        assert source.response.status_code == 200
        return [(sse.event, sse.data) async for sse in source.aiter_sse()]


async def test_streamed_completion_relays_every_token_then_usage_and_done(relay) -> None:
    client, bodies, finished = relay
    bodies["next"] = GOOD
    events = await _sse(client)
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert events[-1] == ("message", "[DONE]")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks if c["choices"])
    assert text == "Hello 世界"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert finished.calls == [("ok", None)]


async def test_streamed_bytes_are_the_models_json_in_sse_frames(relay) -> None:
    client, bodies, finished = relay
    bodies["next"] = GOOD
    async with client.stream("POST", "/chat", params={"stream": "true"}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["cache-control"] == "no-store"
        raw = await resp.aread()
    first = json.loads(raw[len(b"data: ") : raw.index(b"\r\n")])

    def frame(choices: list[ChunkChoice], usage: Usage | None = None) -> bytes:
        chunk = ChatCompletionChunk(
            id=first["id"], created=first["created"], model=MODEL, choices=choices, usage=usage
        )
        return ServerSentEvent(data=chunk.model_dump_json(exclude_none=False)).encode()

    expected = frame([ChunkChoice(delta=Delta(role="assistant", content="Hel"))])
    for text in ("lo", " 世", "界"):
        expected += frame([ChunkChoice(delta=Delta(content=text))])
    expected += frame([ChunkChoice(delta=Delta(), finish_reason="stop")])
    expected += frame([], Usage(prompt_tokens=5, completion_tokens=4, total_tokens=9))
    assert raw == expected + ServerSentEvent(data="[DONE]").encode()
    assert first["id"].startswith("chatcmpl-")
    assert finished.calls == [("ok", None)]


async def test_json_completion_has_the_whole_text_and_usage(relay) -> None:
    client, bodies, finished = relay
    bodies["next"] = GOOD
    resp = await client.post("/chat", params={"stream": "false"})
    assert resp.status_code == 200
    done = resp.json()
    assert done["choices"][0]["message"]["content"] == "Hello 世界"
    assert done["choices"][0]["finish_reason"] == "stop" and done["usage"]["total_tokens"] == 9
    assert finished.calls == [("ok", None)]


async def test_a_text_completion_streams_text_chunks_then_usage_and_done(relay) -> None:
    client, bodies, finished = relay
    bodies["next"] = GOOD
    events = await _sse(client, "/text")
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert events[-1] == ("message", "[DONE]")
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "Hello 世界"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert finished.calls == [("ok", None)]


async def test_a_whole_text_completion_has_the_text_and_usage(relay) -> None:
    client, bodies, finished = relay
    bodies["next"] = GOOD
    done = (await client.post("/text", params={"stream": "false"})).json()
    assert done["object"] == "text_completion" and done["usage"]["total_tokens"] == 9
    assert done["choices"] == [{"text": "Hello 世界", "index": 0, "logprobs": None, "finish_reason": "stop"}]
    assert finished.calls == [("ok", None)]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (MALFORMED, 502, "bad_replica_response"),
        (GOOD.replace(b'"type":"token"', b'"type":"tok"', 1), 502, "bad_replica_response"),
        (replica_bytes(failed(["Hel"])), 503, "generation_failed"),
        (GOOD[: GOOD.index(b'{"type":"done"')], 503, "replica_lost"),
    ],
    ids=["extra-field", "unknown-type", "error-line", "cut-short"],
)
async def test_a_failed_upstream_is_an_openai_error_on_both_paths(
    relay, body: bytes, status: int, code: str
) -> None:
    client, bodies, finished = relay
    bodies["next"] = body
    resp = await client.post("/chat", params={"stream": "false"})
    assert resp.status_code == status
    assert set(resp.json()["error"]) == ERROR_KEYS and resp.json()["error"]["code"] == code
    assert resp.json()["error"]["type"] == "server_error"

    events = await _sse(client)
    kind, data = events[-1]
    assert kind == "error" and ("message", "[DONE]") not in events
    error = json.loads(data)["error"]
    assert set(error) == ERROR_KEYS and error["code"] == code
    assert finished.calls == [("error", code), ("error", code)]
