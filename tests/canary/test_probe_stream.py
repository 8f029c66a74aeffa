"""The probe reads a streamed answer through httpx-sse: content in order, the tier, and an error event."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from canary.probe import Planned, Streamed, stream_chat
from canary.probe_setup import ProbeTarget

TARGET = ProbeTarget("c0", "canary-0", "canary-0/marker:probe", "key0", "ZQX-0000-KV", 8)


def _app(frames: list[str]) -> Starlette:
    async def chat(request: Request) -> StreamingResponse:
        async def body() -> AsyncIterator[str]:
            for frame in frames:
                yield frame

        headers = {"x-adapter-tier": "gpu", "x-adapter-id": "c0"}
        return StreamingResponse(body(), media_type="text/event-stream", headers=headers)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def _chunk(content: str) -> str:
    return f"data: {json.dumps({'choices': [{'delta': {'content': content}}]})}\n\n"


async def _run(frames: list[str]) -> Streamed:
    transport = httpx.ASGITransport(app=_app(frames))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        return await stream_chat(client, Planned("p0", TARGET, TARGET, "Hi"), 12)


async def test_content_chunks_are_joined_and_pings_and_done_are_skipped() -> None:
    got = await _run([": ping\n\n", _chunk("ZQX-"), _chunk("0000-KV"), ": ping\n\n", "data: [DONE]\n\n"])
    assert (got.status, got.text, got.tier, got.adapter_id, got.error) == (
        200,
        "ZQX-0000-KV",
        "gpu",
        "c0",
        "",
    )
    assert got.ttft_s is not None and got.ttft_s >= 0


async def test_an_error_event_is_reported_with_its_body() -> None:
    err = json.dumps({"error": {"code": "replica_lost"}})
    got = await _run([_chunk("ZQX-"), f"event: error\ndata: {err}\n\n"])
    assert (got.status, got.text, json.loads(got.error)["error"]["code"]) == (200, "ZQX-", "replica_lost")
