"""The open-loop load generator of `lorafleet bench gateway`: one path, one rate, per-request timings.

A path is a streamed POST (the gateway's chat completions or the stand-in's generate) and the byte marker
that every token-carrying piece of its body holds once. Requests start on a fixed schedule (i / rate),
whatever the earlier ones are doing, over one httpx client. Each request records its time to the first
token, every gap between tokens as the client reads them (tokens read in one piece have a gap of 0), and
how late each token is against the stand-in's clock (token i due i / token_rate after the first).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import httpx


@dataclass(frozen=True)
class Path:
    name: str
    url: str
    headers: dict[str, str]
    body: bytes
    marker: bytes  # occurs once in each token of the body


@dataclass
class PhaseSamples:
    """What one phase measured, in seconds."""

    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)  # start of a request after its scheduled time
    tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


async def _one(client: httpx.AsyncClient, path: Path, token_period: float, out: PhaseSamples) -> None:
    start = time.perf_counter()
    first = last = 0.0
    seen = 0
    try:
        async with client.stream("POST", path.url, content=path.body, headers=path.headers) as resp:
            if resp.status_code != 200:
                await resp.aread()
                out.error(str(resp.status_code))
                return
            async for piece in resp.aiter_raw():
                k = piece.count(path.marker)
                if not k:
                    continue
                now = time.perf_counter()
                if seen == 0:
                    first = now
                    out.ttft.append(now - start)
                else:
                    out.itl.append(now - last)
                out.itl.extend([0.0] * (k - 1))
                # token seen..seen+k-1 arrive now; each was due (index * period) after the first
                out.lateness.extend(now - first - (seen + j) * token_period for j in range(k))
                last = now
                seen += k
    except httpx.HTTPError as exc:
        out.error(type(exc).__name__)
        return
    out.tokens += seen


async def run_phase(
    client: httpx.AsyncClient,
    path: Path,
    rate: float,
    duration_s: float,
    token_period: float,
    grace_s: float,
) -> tuple[PhaseSamples, float]:
    """Open-loop arrivals at rate for duration_s; returns the samples and the wall time until all ended.

    Requests still running grace_s after the last arrival are cancelled and counted as "timeout"."""
    out = PhaseSamples()
    tasks = []
    begin = time.perf_counter()
    for i in range(max(1, round(rate * duration_s))):
        due = begin + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        out.lag.append(time.perf_counter() - due)
        tasks.append(asyncio.create_task(_one(client, path, token_period, out)))
    _, late = await asyncio.wait(tasks, timeout=grace_s)
    for task in late:
        task.cancel()
        out.error("timeout")
    await asyncio.gather(*late, return_exceptions=True)
    return out, time.perf_counter() - begin


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of values, in the values' unit; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary_ms(samples: PhaseSamples) -> dict[str, float]:
    """Percentiles of one phase, in milliseconds."""
    ms = 1000.0
    return {
        "ttft_p50_ms": round(pct(samples.ttft, 0.50) * ms, 3),
        "ttft_p99_ms": round(pct(samples.ttft, 0.99) * ms, 3),
        "ttft_mean_ms": round(statistics.fmean(samples.ttft) * ms, 3) if samples.ttft else float("nan"),
        "itl_p50_ms": round(pct(samples.itl, 0.50) * ms, 3),
        "itl_p99_ms": round(pct(samples.itl, 0.99) * ms, 3),
        "lateness_p50_ms": round(pct(samples.lateness, 0.50) * ms, 3),
        "lateness_p99_ms": round(pct(samples.lateness, 0.99) * ms, 3),
        "start_lag_p99_ms": round(pct(samples.lag, 0.99) * ms, 3),
    }
