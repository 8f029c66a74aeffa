"""Step times of serving replicas, for the simulator's timing model: what `bench engine` measures, but on
the replica processes as they serve (their KV sizing, slot pools, streaming and state publishing in the
same process), through their own internal generate API.

    .venv/bin/python -m bench.replica_steps --adapter loadtest-r16-a000 --adapter loadtest-r16-a001 ... \\
        --calibration-out .data/bench/replica-steps.json

For each batch size b and each distinct count d in {1, b}: b concurrent requests (temperature 0,
ignore_eos, --tokens each) to the first replica, request i on adapter i % d, pre-warmed into GPU slots
first. With --gateway, the one-adapter points (and the single requests below) go through the public API
instead, as a client sees them (the gateway's relaying shares this machine's cores): the first adapter is
then unloaded from the other replicas so the router sends them all to the first. Decode step = median
over requests of (last token - first token) / (tokens - 1). Alone on the
replica, one request's time to first token at several prompt lengths gives the prefill rate and the fixed
cost of admitting a request (HTTP, chat template, tokenizer, the hand-over to the engine thread):
ttft = admit + step(1 row) + prompt tokens / rate. Then the same batch on every replica at once, against
one alone, gives the host contention (sim.host): how much replicas sharing this machine's cores slow each
other. Every decode step over its batch's median step gives the host's step-time spread (step_jitter, 200
quantiles): a CPU shared with other processes has a heavy tail (GC, neighbours), which p95 TTFT feels.
Repeats interleave; medians. Prints JSON; --calibration-out writes the timing runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from loadtest.client import chat_body
from lorafleet.profile import DEV_TOKEN
from schemas.replica_api import STREAM_EVENT, ChatMessage, DoneEvent, GenerateRequest, TokenEvent

PROMPT = "Tell me a long story about a dragon who guards a library."
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")


def prompt_of(words: int) -> str:
    return PROMPT if words <= 0 else " ".join(WORDS[i % len(WORDS)] for i in range(words))


async def generate(
    c: httpx.AsyncClient, rid: str, url: str, adapter: str, tokens: int, words: int = 0
) -> dict[str, Any]:
    body = GenerateRequest(
        messages=[ChatMessage(role="user", content=prompt_of(words))],
        adapter_id=adapter,
        max_tokens=tokens,
        ignore_eos=True,
        temperature=0.0,
    )
    start = time.perf_counter()
    times, prompt_tokens = [], 0
    url = f"{url}/internal/replicas/{rid}/generate"
    content, headers = body.model_dump_json(exclude_none=True), {"Content-Type": "application/json"}
    async with c.stream("POST", url, content=content, headers=headers) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.strip():
                continue
            event = STREAM_EVENT.validate_json(line)
            if isinstance(event, TokenEvent):  # a "length" finish sends its last token, then "done"
                times.append(time.perf_counter())
            elif isinstance(event, DoneEvent):
                prompt_tokens = event.usage.prompt_tokens
            else:
                raise RuntimeError(f"replica {rid}: {event.error.code}: {event.error.message}")
    return _timing(start, times, prompt_tokens)


def _timing(start: float, times: list[float], prompt_tokens: int) -> dict[str, Any]:
    return {
        "ttft_s": times[0] - start,
        "step_s": (times[-1] - times[0]) / max(len(times) - 1, 1),
        "gaps": [b - a for a, b in zip(times, times[1:], strict=False)],  # one decode step each
        "prompt_tokens": prompt_tokens,
    }


async def via_gateway(
    c: httpx.AsyncClient, a: argparse.Namespace, tokens: int, words: int = 0
) -> dict[str, Any]:
    """The same request through the public API as a client sees it (SSE content chunks, usage chunk)."""
    body = chat_body(a.model, prompt_of(words), tokens, 0.0)
    start = time.perf_counter()
    times, prompt_tokens = [], 0
    headers = {"Authorization": f"Bearer {a.key}"}
    async with aconnect_sse(
        c, "POST", f"{a.gateway}/v1/chat/completions", json=body, headers=headers
    ) as source:
        source.response.raise_for_status()
        async for sse in source.aiter_sse():
            if sse.data == "[DONE]":
                continue
            event = sse.json()
            choices = event.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                times.append(time.perf_counter())
            if event.get("usage"):
                prompt_tokens = event["usage"]["prompt_tokens"]
    return _timing(start, times, prompt_tokens)


async def batch_on(
    c: httpx.AsyncClient, replicas: dict[str, str], adapters: list[str], b: int, tokens: int
) -> list[dict[str, Any]]:
    """b requests on each of the given replicas, all at once."""
    jobs = [
        generate(c, rid, url, adapters[i % len(adapters)], tokens)
        for rid, url in replicas.items()
        for i in range(b)
    ]
    return list(await asyncio.gather(*jobs))


async def one_adapter(
    c: httpx.AsyncClient, a: argparse.Namespace, first: dict[str, str], b: int, tokens: int, words: int = 0
) -> list[dict[str, Any]]:
    """b requests on the first adapter: through the gateway when one is given, else straight to the first
    replica."""
    if a.gateway:
        return list(await asyncio.gather(*(via_gateway(c, a, tokens, words) for _ in range(b))))
    (rid, url), aid = next(iter(first.items())), a.adapter[0]
    return list(await asyncio.gather(*(generate(c, rid, url, aid, tokens, words) for _ in range(b))))


async def run(a: argparse.Namespace) -> dict[str, Any]:
    replicas = dict(spec.split("=", 1) for spec in a.replica)
    first = dict([next(iter(replicas.items()))])
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {a.token}"}, timeout=600) as c:
        for rid, url in replicas.items():
            for aid in a.adapter:
                (await c.post(f"{url}/internal/replicas/{rid}/adapters/{aid}/load")).raise_for_status()
        if a.gateway:  # the router then sends every request for a.model to the first replica
            for rid, url in list(replicas.items())[1:]:
                resp = await c.post(f"{url}/internal/replicas/{rid}/adapters/{a.adapter[0]}/unload")
                resp.raise_for_status()
            await asyncio.sleep(2.5)  # the replicas' next state report reaches the router
        await one_adapter(c, a, first, 1, 2)  # warm-up
        samples: dict[tuple[int, int], list[dict[str, Any]]] = {}
        shared: dict[int, list[float]] = {}
        alone: dict[int, list[float]] = {}
        lengths: dict[int, list[dict[str, Any]]] = {}
        direct: list[list[float]] = []  # decode-step gaps straight from the replicas (for the spread)
        other = a.adapter[-1:]
        for _ in range(a.repeats):
            for words in a.prompt_words:
                lengths.setdefault(words, []).extend(await one_adapter(c, a, first, 1, 2, words))
            for b in a.batches:
                samples.setdefault((b, 1), []).extend(await one_adapter(c, a, first, b, a.tokens))
                if min(b, len(a.adapter)) > 1:
                    rs = await batch_on(c, first, a.adapter[:b], b, a.tokens)
                    samples.setdefault((b, min(b, len(a.adapter))), []).extend(rs)
                    direct.append([g for r in rs for g in r["gaps"]])
                if len(replicas) > 1:
                    one = await batch_on(c, first, other, b, a.tokens)
                    both = await batch_on(c, replicas, other, b, a.tokens)
                    direct += [[g for r in rs for g in r["gaps"]] for rs in (one, both)]
                    alone.setdefault(b, []).append(statistics.median(r["step_s"] for r in one))
                    shared.setdefault(b, []).append(statistics.median(r["step_s"] for r in both))
    runs = []
    for b in a.batches:
        points = {d: rs for (bb, d), rs in samples.items() if bb == b}
        runs.append(
            {
                "batch": b,
                "decode_step_s": {
                    str(d): {"median": statistics.median(r["step_s"] for r in rs)} for d, rs in points.items()
                },
                "batch_prefill": {
                    str(d): {
                        "tokens": b * statistics.median(r["prompt_tokens"] for r in rs),
                        "median_s": statistics.median(r["ttft_s"] for r in rs),
                    }
                    for d, rs in points.items()
                },
            }
        )
    ratios = {b: statistics.median(shared[b]) / statistics.median(alone[b]) for b in shared}
    jitter = []  # every decode step over the median step of its batch: this host's step-time spread
    for gaps in direct:
        mid = statistics.median(gaps)
        jitter += [g / mid for g in gaps]
    jitter.sort()
    quantiles = [round(jitter[min(len(jitter) - 1, int(q / 200 * len(jitter)))], 3) for q in range(200)]
    contention = (
        min(max(statistics.median(ratios.values()) - 1.0, 0.0), 1.0)
        if ratios and len(replicas) == 2
        else None
    )
    by_length = [
        {
            "prompt_tokens": statistics.median(r["prompt_tokens"] for r in rs),
            "ttft_s": statistics.median(r["ttft_s"] for r in rs),
        }
        for _, rs in sorted(lengths.items())
    ]
    return {
        "source": "bench/replica_steps.py",
        "prefill_by_length": by_length,
        "replicas": list(replicas),
        "adapters": len(a.adapter),
        "tokens": a.tokens,
        "repeats": a.repeats,
        "runs": runs,
        "two_replicas_over_one": {str(b): round(v, 3) for b, v in ratios.items()},
        "step_jitter": quantiles,
        "host_contention": None if contention is None else round(contention, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--replica",
        action="append",
        default=None,
        help="ID=URL (default: the local stack's replica-0 and replica-1); the first one is timed alone",
    )
    p.add_argument("--token", default=DEV_TOKEN)
    p.add_argument("--gateway", default=None, help="time the one-adapter points through this public gateway")
    p.add_argument("--model", default=None, help="with --gateway: the alias of the first --adapter")
    p.add_argument("--key", default=None, help="with --gateway: its tenant's API key")
    p.add_argument("--adapter", action="append", required=True, help="a ready adapter id (repeatable)")
    p.add_argument("--batches", default="1,4,8")
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--prompt-words", default="8,32,96,192", help="prompt lengths for the prefill fit")
    p.add_argument("--calibration-out", type=Path, default=None)
    a = p.parse_args()
    a.replica = a.replica or ["replica-0=http://127.0.0.1:18100", "replica-1=http://127.0.0.1:18101"]
    a.batches = [int(b) for b in a.batches.split(",")]
    a.prompt_words = [int(w) for w in a.prompt_words.split(",")]
    result = asyncio.run(run(a))
    text = json.dumps(result, indent=2)
    if a.calibration_out is not None:
        a.calibration_out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
