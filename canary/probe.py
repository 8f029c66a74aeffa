"""The end-to-end isolation probe: mixed concurrent streaming requests through the public API, by markers.

Two kinds of request, interleaved:
- owner: a canary's own tenant calls its alias; the answer must carry that canary's marker and no other;
- stranger: another tenant's key names the alias; the answer must be the 404 model_not_found, and any
  success is a cross-tenant leak whatever the text says.
The public API serves only aliases, so there are no base-only rows end to end; check.py's base counts stay 0.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field

import httpx
from httpx_sse import aconnect_sse

from canary.check import IsolationTally
from canary.markers import Marker
from canary.probe_setup import ProbeTarget

PROMPTS = (
    "Hello!",
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain how a refund works.",
    "Give me three tips for a job interview.",
    "Translate 'good morning' into German.",
    "What is 17 times 3?",
    "Summarize the plot of a famous film.",
)
STRANGER_EVERY = 5  # one request in five uses another tenant's key and must be refused
EXTRA_TOKENS = 4  # room after the marker's own tokens (a space or a newline before it)


@dataclass
class ProbeRun:
    """Counts of one probe run; ok() is its verdict."""

    tally: IsolationTally = field(default_factory=IsolationTally)
    stranger_requests: int = 0
    cross_tenant_success: int = 0
    stranger_errors: int = 0  # a stranger got something other than 404 or 200 (e.g. 503): not a leak
    ttft_s: dict[str, list[float]] = field(default_factory=dict)  # tier -> TTFTs of owner requests
    cross_tenant_findings: list[dict[str, str]] = field(default_factory=list)

    def ok(self, allow_missing: bool) -> bool:
        leaks = self.tally.leaks() + self.cross_tenant_success
        if leaks or self.tally.adapter_requests == 0:
            return False
        return allow_missing or (
            self.tally.missing_marker == 0 and self.tally.errors == 0 and not self.stranger_errors
        )

    def summary(self, allow_missing: bool, wall_s: float) -> dict[str, object]:
        all_ttft = [t for ts in self.ttft_s.values() for t in ts]
        base = self.tally.summary()
        return {
            **{
                k: v
                for k, v in base.items()
                if k not in ("ok", "base_requests", "base_with_marker", "findings")
            },
            "requests": self.tally.requests + self.stranger_requests,
            "owner_requests": self.tally.adapter_requests + self.tally.errors,
            "stranger_requests": self.stranger_requests,
            "cross_tenant_success": self.cross_tenant_success,
            "stranger_errors": self.stranger_errors,
            "ttft_ms": _percentiles(all_ttft),
            "ttft_ms_by_tier": {tier: _percentiles(ts) for tier, ts in sorted(self.ttft_s.items())},
            "wall_s": round(wall_s, 2),
            "allow_missing": allow_missing,
            "ok": self.ok(allow_missing),
            "findings": self.tally.finding_rows() + self.cross_tenant_findings[:20],
        }


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {"p50": round(statistics.median(ordered) * 1000, 1), "p95": round(p95 * 1000, 1)}


@dataclass(frozen=True)
class Planned:
    request_id: str
    target: ProbeTarget
    caller: ProbeTarget  # whose key is used; caller is target for owner requests
    prompt: str


def plan(targets: list[ProbeTarget], requests: int, seed: int = 0) -> list[Planned]:
    """requests mixed calls: canaries round-robin, every STRANGER_EVERY-th from the next tenant's key."""
    rng = random.Random(seed)
    out = []
    for i in range(requests):
        target = targets[i % len(targets)]
        stranger = len(targets) > 1 and i % STRANGER_EVERY == STRANGER_EVERY - 1
        caller = targets[(i + 1) % len(targets)] if stranger else target
        out.append(Planned(f"probe-{i:05d}", target, caller, rng.choice(PROMPTS)))
    rng.shuffle(out)
    return out


@dataclass(frozen=True)
class Streamed:
    """One streaming chat completion as the client saw it."""

    status: int
    text: str
    tier: str | None
    adapter_id: str | None  # x-adapter-id: the version the gateway admitted the request for
    ttft_s: float | None
    error: str  # the body of a refused request, or the data of the stream's error event; "" when none


async def stream_chat(client: httpx.AsyncClient, p: Planned, max_tokens: int) -> Streamed:
    """One streaming chat completion of p's prompt to p's alias with p's caller's key."""
    body = {
        "model": p.target.alias,
        "messages": [{"role": "user", "content": p.prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {p.caller.key}"}
    start = time.perf_counter()
    async with aconnect_sse(client, "POST", "/v1/chat/completions", json=body, headers=headers) as source:
        resp = source.response
        if resp.status_code != 200:
            error = (await resp.aread()).decode(errors="replace")
            return Streamed(resp.status_code, "", None, None, None, error)
        tier, adapter = resp.headers.get("x-adapter-tier"), resp.headers.get("x-adapter-id")
        ttft, parts, error = None, [], ""
        async for sse in source.aiter_sse():
            if sse.event == "error":
                error = sse.data
            elif sse.data != "[DONE]":
                for choice in sse.json().get("choices", []):
                    if content := choice.get("delta", {}).get("content"):
                        ttft = ttft if ttft is not None else time.perf_counter() - start
                        parts.append(content)
        return Streamed(200, "".join(parts), tier, adapter, ttft, error)


async def _one(client: httpx.AsyncClient, p: Planned, markers: list[Marker], run: ProbeRun) -> None:
    from canary.markers import markers_in_text

    stranger = p.caller is not p.target
    try:
        got = await stream_chat(client, p, p.target.marker_tokens + EXTRA_TOKENS)
    except httpx.HTTPError as exc:
        got = Streamed(0, "", None, None, None, f"{type(exc).__name__}: {exc}")
    status, text, tier, ttft, error = got.status, got.text, got.tier, got.ttft_s, got.error
    if stranger:
        run.stranger_requests += 1
        if status == 200:
            run.cross_tenant_success += 1
            finding = {"request_id": p.request_id, "alias": p.target.alias, "caller": p.caller.tenant_id}
            run.cross_tenant_findings.append(finding)
        elif status != 404:
            run.stranger_errors += 1
        return
    if status != 200 or error:
        run.tally.record_error(p.request_id, p.target.adapter_id, f"{status} {error}"[:300])
        return
    run.tally.record(p.request_id, p.target.adapter_id, markers_in_text(text, markers))
    if ttft is not None:
        run.ttft_s.setdefault(tier or "unknown", []).append(ttft)


async def run_probe(gateway: str, targets: list[ProbeTarget], requests: int, concurrency: int) -> ProbeRun:
    """Send the planned requests with at most `concurrency` in flight and judge every answer."""
    markers = [Marker(t.adapter_id, t.marker, ()) for t in targets]
    run = ProbeRun()
    gate = asyncio.Semaphore(concurrency)

    async def guarded(p: Planned) -> None:
        async with gate:
            await _one(client, p, markers, run)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=gateway, timeout=120, limits=limits) as client:
        await asyncio.gather(*(guarded(p) for p in plan(targets, requests)))
    return run
