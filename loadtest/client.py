"""One streamed chat completion through the public API, timed: TTFT, time per output token, tier, status,
and the token counts the server reports in its usage chunk."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
from httpx_sse import aconnect_sse

from sim.workload import Request


@dataclass
class RequestRecord:
    """What the load test saw of one request (times in seconds; -1 when it never came)."""

    request_id: int
    rate: float
    model: str
    prompt_tokens: int  # the trace's prompt length (the words sent)
    max_tokens: int
    arrival_s: float = 0.0  # the trace's arrival time, from the start of its rate
    trace_adapter: str = ""  # the trace's adapter (sim.workload id by popularity rank)
    status: int = 0
    error: str = ""
    tier: str = ""
    adapter_id: str = ""
    ttft_s: float = -1.0
    tpot_s: float = -1.0
    total_s: float = -1.0
    chunks: int = 0
    usage_prompt_tokens: int = -1  # what the server counted (chat template included)
    usage_completion_tokens: int = -1  # may be under max_tokens: the model can stop at its end token


def prompt_text(tokens: int) -> str:
    """A prompt of about `tokens` tokens (one short English word is about one token)."""
    words = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
    return " ".join(words[i % len(words)] for i in range(max(1, tokens)))


def chat_body(model: str, text: str, max_tokens: int, temperature: float | None) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if temperature is not None:
        body["temperature"] = temperature
    return body


async def send(
    client: httpx.AsyncClient,
    req: Request,
    model: str,
    key: str,
    rate: float,
    text: str | None = None,
    temperature: float | None = None,
) -> RequestRecord:
    """POST /v1/chat/completions with stream: true and time the content chunks as they arrive."""
    rec = RequestRecord(
        req.request_id, rate, model, req.prompt_tokens, req.output_tokens, req.arrival_s, req.adapter_id
    )
    body = chat_body(model, text or prompt_text(req.prompt_tokens), req.output_tokens, temperature)
    start = time.perf_counter()
    first = last = 0.0
    try:
        async with aconnect_sse(
            client, "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as source:
            resp = source.response
            rec.status = resp.status_code
            rec.tier = resp.headers.get("x-adapter-tier", "")
            rec.adapter_id = resp.headers.get("x-adapter-id", "")
            if resp.status_code != 200:
                rec.error = (await resp.aread()).decode(errors="replace")[:200]
                return rec
            async for sse in source.aiter_sse():
                if sse.data == "[DONE]":
                    break
                event = sse.json()
                if "error" in event:
                    rec.error = str(event["error"].get("code"))
                    continue
                if event.get("usage"):
                    rec.usage_prompt_tokens = event["usage"]["prompt_tokens"]
                    rec.usage_completion_tokens = event["usage"]["completion_tokens"]
                choices = event.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    rec.chunks += 1
    except httpx.HTTPError as exc:
        rec.error = type(exc).__name__
    rec.total_s = time.perf_counter() - start
    if first:
        rec.ttft_s = first - start
        if rec.chunks > 1:
            rec.tpot_s = (last - first) / (rec.chunks - 1)
    return rec
