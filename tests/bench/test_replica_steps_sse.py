"""bench.replica_steps times a gateway stream from its SSE content chunks and reads the usage chunk."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from bench.replica_steps import via_gateway


def _app() -> Starlette:
    async def chat(request: Request) -> StreamingResponse:
        tokens = (await request.json())["max_tokens"]

        async def body() -> AsyncIterator[str]:
            yield ": ping\n\n"
            for i in range(tokens):
                yield f"data: {json.dumps({'choices': [{'delta': {'content': f't{i}'}}]})}\n\n"
            usage = {"prompt_tokens": 30, "completion_tokens": tokens, "total_tokens": 30 + tokens}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


async def test_one_time_per_content_chunk_and_the_prompt_tokens_from_usage() -> None:
    args = argparse.Namespace(gateway="http://gw", model="acme/a:prod", key="k")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app())) as client:
        timing = await via_gateway(client, args, 5)
    assert len(timing["gaps"]) == 4 and timing["prompt_tokens"] == 30
    assert timing["ttft_s"] >= 0 and timing["step_s"] >= 0
