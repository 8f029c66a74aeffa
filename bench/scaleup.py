"""`lorafleet bench scaleup`: sustained load through the public gateway until the autoscaler adds a replica.

The run's own stack (harness/stacks/scaleup.py) starts with one replica; `clients` streaming requests at a
time keep more requests queued than the threshold allows. The timeline comes from what the processes
published on Kafka (replica.state, autoscale.signals, requests.completed) and the autoscaler's pid file:
threshold crossed, signal published, process started, base loaded (first replica.state), adapters warm
(first `ready`), first request served by the new replica, queue depth back under the threshold. Times are
seconds from the start of the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import typer
from aiokafka import TopicPartition

from harness.stacks.scaleup import ADAPTERS, ScaleupConfig, ScaleupStack, scaleup_stack, wait_for
from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_consumer
from ops.autoscale.local import STARTED
from schemas import topics
from schemas.events import (
    AutoscaleSignal,
    Event,
    EventValidationError,
    ReplicaState,
    RequestCompleted,
    parse_event,
)

PROMPTS = (
    "Write a long story about a lighthouse keeper and a storm.",
    "Explain, step by step and at length, how a city water system works.",
    "Describe a journey across a desert in as much detail as you can.",
)


@dataclass
class Recorded:
    """Events of one stack as they arrived, with Kafka's record timestamp (the producer's clock)."""

    events: list[tuple[float, Event]] = field(default_factory=list)

    def of(self, kind: type[Event]) -> list[tuple[float, Any]]:
        return [(t, e) for t, e in self.events if isinstance(e, kind)]


async def record(
    platform: PlatformSettings, stack: ScaleupStack, into: Recorded, ready: asyncio.Event
) -> None:
    """Read the stack's replica.state, autoscale.signals and requests.completed from their end, forever."""
    names = (topics.REPLICA_STATE, topics.AUTOSCALE_SIGNALS, topics.REQUESTS_COMPLETED)
    consumer = make_consumer(platform, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(t.name, p) for t in names for p in range(t.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
        ready.set()
        async for rec in consumer:
            try:
                event = parse_event(rec.value, rec.topic)
            except EventValidationError:
                continue  # not this run's: the shared topics also carry other stacks' poison records
            ours = (
                (isinstance(event, ReplicaState) and event.replica_id.startswith(stack.prefix))
                or (isinstance(event, AutoscaleSignal) and event.fleet == stack.fleet)
                or (isinstance(event, RequestCompleted) and (event.replica_id or "").startswith(stack.prefix))
            )
            if ours:
                into.events.append((rec.timestamp / 1000, event))
    finally:
        await consumer.stop()


async def client_loop(
    stack: ScaleupStack, n: int, max_tokens: int, stop: asyncio.Event, out: list[dict]
) -> None:
    """One client: streamed chat completions back to back until stop."""
    aliases = itertools.cycle(ADAPTERS.values())
    prompts = itertools.cycle(PROMPTS)
    headers = {"Authorization": f"Bearer {stack.key}"}
    async with httpx.AsyncClient(base_url=stack.gateway_url, headers=headers, timeout=120) as c:
        for _ in range(n):  # offset the cycle per client
            next(aliases)
        while not stop.is_set():
            body = {
                "model": next(aliases),
                "messages": [{"role": "user", "content": next(prompts)}],
                "max_tokens": max_tokens,
                "temperature": 1.0,
                "stream": True,
            }
            started, status, chunks = time.time(), 0, 0
            try:
                async with c.stream("POST", "/v1/chat/completions", json=body) as resp:
                    status = resp.status_code
                    async for line in resp.aiter_lines():
                        chunks += line.startswith("data: {")
            except httpx.HTTPError:
                status = -1
            out.append({"started": started, "ended": time.time(), "status": status, "chunks": chunks})
            if status != 200:
                await asyncio.sleep(0.2)


def fleet_queue(states: list[tuple[float, ReplicaState]]) -> list[tuple[float, float, dict[str, int]]]:
    """(time, fleet queue depth, per replica) after each state, from each replica's latest state."""
    latest: dict[str, int] = {}
    out = []
    for _, s in sorted(states, key=lambda x: x[1].occurred_at):
        latest[s.replica_id] = s.queue_depth if s.status != "draining" else 0
        out.append((s.occurred_at.timestamp(), float(sum(latest.values())), dict(latest)))
    return out


def timeline(stack: ScaleupStack, rec: Recorded, t0: float, started_at: float | None) -> dict[str, Any]:
    """The milestones of the first scale-up, in seconds from t0 (None where it did not happen)."""
    cfg = stack.cfg
    new = stack.replica_id(cfg.unmanaged)
    threshold = cfg.queue_per_replica * cfg.unmanaged
    states = rec.of(ReplicaState)
    queue = fleet_queue(states)
    mine = sorted((s for _, s in states if s.replica_id == new), key=lambda s: s.occurred_at)
    ready = next((s for s in mine if s.status == "ready"), None)
    signals = [(t, s) for t, s in rec.of(AutoscaleSignal) if s.desired_replicas > cfg.unmanaged]
    completed = sorted(
        e.occurred_at.timestamp()
        for _, e in rec.of(RequestCompleted)
        if e.replica_id == new and e.status == "ok"
    )
    serving = [s for s in mine if s.tokens_in_flight > 0]  # a request is running there
    ready_at = ready.occurred_at.timestamp() if ready is not None else None
    crossed = next((t for t, q, _ in queue if q > threshold), None)
    under = next((t for t, q, _ in queue if ready_at is not None and t > ready_at and q <= threshold), None)
    # a request that reached the new replica before it was ready: its own state, or a completed request
    # that started before the first ready state
    before_ready = [
        f"state at {s.occurred_at.isoformat()}: {s.status}" for s in serving if s.status != "ready"
    ]
    before_ready += [
        e.request_id
        for _, e in rec.of(RequestCompleted)
        if e.replica_id == new and (ready_at is None or e.occurred_at.timestamp() - e.total_s < ready_at)
    ]

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 3)

    return {
        "replica_id": new,
        "threshold_queue_depth": threshold,
        "milestones_s": {
            "threshold_crossed": rel(crossed),
            "signal_published": rel(signals[0][0] if signals else None),
            "process_started": rel(started_at),
            "base_loaded": rel(mine[0].occurred_at.timestamp() if mine else None),
            "adapters_warm_ready": rel(ready_at),
            "first_request_served": rel(serving[0].occurred_at.timestamp() if serving else None),
            "queue_under_threshold": rel(under),
        },
        "first_status": mine[0].status if mine else None,
        "statuses_seen": sorted({s.status for s in mine}),
        "at_ready": {"owned_adapters": ready.owned_adapters, "warm_adapters": ready.warm_adapters}
        if ready is not None
        else None,
        "requests_before_ready": before_ready,
        "first_request_completed_s": rel(completed[0] if completed else None),
        "completed_by_new": len(completed),
        "queue_series": [(rel(t), q, per) for t, q, per in queue],
        "signal_series": [
            (rel(t), s.desired_replicas, s.current_replicas) for t, s in rec.of(AutoscaleSignal)
        ],
    }


async def run_scaleup(
    platform: PlatformSettings,
    work: Path,
    cfg: ScaleupConfig,
    clients: int = 6,
    max_tokens: int = 48,
    settle_s: float = 2.0,
    timeout_s: float = 240.0,
    tail_s: float = 0.0,
) -> dict[str, Any]:
    """Run the load until the new replica serves and the queue is back under the threshold (or timeout)."""
    rec, results = Recorded(), list[dict]()
    async with scaleup_stack(platform, work, cfg) as stack:
        listening = asyncio.Event()
        recorder = asyncio.create_task(record(platform, stack, rec, listening))
        await asyncio.wait_for(listening.wait(), 30)
        autoscaler = stack.autoscaler()
        autoscaler.start()
        # the stream's first signal for this fleet: it is caught up, and the load starts from a steady fleet
        await wait_for(lambda: rec.of(AutoscaleSignal), 90, "the first autoscale signal", stack)
        await asyncio.sleep(settle_s)
        stop = asyncio.Event()
        t0 = time.time()
        loops = [
            asyncio.create_task(client_loop(stack, i, max_tokens, stop, results)) for i in range(clients)
        ]
        started_at: float | None = None
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                live = [r for r in stack.records().live() if r.index == cfg.unmanaged]
                if live and started_at is None:
                    started_at = live[0].started_at
                done = timeline(stack, rec, t0, started_at)["milestones_s"]
                if done["first_request_served"] is not None and done["queue_under_threshold"] is not None:
                    await asyncio.sleep(tail_s)  # the load goes on: the queue stays under the threshold
                    break
                assert autoscaler.alive, autoscaler.tail()
                await asyncio.sleep(0.5)
        finally:
            stop.set()
            for loop in loops:  # ends the streams in flight: waiting for them would take a request's length
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await asyncio.sleep(1.0)  # the last requests.completed
            recorder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recorder
        out = timeline(stack, rec, t0, started_at)
        out["autoscaler_starts"] = len(STARTED.findall(autoscaler.log.read_text()))
        out["replica_processes_at_end"] = len(stack.replica_processes())
    ok = [r for r in results if r["status"] == 200]
    out["requests"] = {"total": len(results), "ok": len(ok), "failed": len(results) - len(ok)}
    out["config"] = {
        "clients": clients,
        "max_tokens": max_tokens,
        "queue_per_replica": cfg.queue_per_replica,
        "window_s": cfg.window_s,
        "max_num_seqs": cfg.max_num_seqs,
        "cooldown_s": cfg.cooldown_s,
    }
    return out


LABELS = {
    "threshold_crossed": "threshold crossed",
    "signal_published": "signal published",
    "process_started": "process started",
    "base_loaded": "base loaded",
    "adapters_warm_ready": "adapters warm (ready)",
    "first_request_served": "first request served",
    "queue_under_threshold": "queue under threshold",
}


def plot(result: dict[str, Any], path: Path) -> None:
    """Fleet queue depth over time with the threshold and each milestone as a labelled line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=100)
    series = [(t, q) for t, q, _ in result["queue_series"] if t is not None]
    ax.step(
        [t for t, _ in series], [q for _, q in series], where="post", color="black", label="fleet queue depth"
    )
    ax.axhline(result["threshold_queue_depth"], color="grey", linestyle=":", label="threshold")
    top = max([q for _, q in series] + [result["threshold_queue_depth"]]) or 1.0
    ax.set_ylim(0, top * 1.9)  # the upper part holds the milestone labels
    colours = plt.get_cmap("tab10")
    for i, (key, label) in enumerate(LABELS.items()):
        t = result["milestones_s"].get(key)
        if t is None:
            continue
        ax.axvline(t, color=colours(i), linewidth=1.2)
        ax.text(
            t,
            0.97 - 0.06 * i,
            f" {label} {t:.1f}s",
            color=colours(i),
            fontsize=8,
            va="top",
            transform=ax.get_xaxis_transform(),
            bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 1},
        )
    ax.set_xlabel("seconds from the start of the load")
    ax.set_ylabel("requests queued (sum over replicas)")
    ax.set_title("Scale-up timeline: one local replica to two (SmolLM2 on CPU)")
    ax.legend(loc="center left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def scaleup(
    out_dir: Path = typer.Option(Path("bench/results"), help="writes scaleup.json and scaleup.png here"),
    clients: int = typer.Option(6, help="streaming requests kept in flight through the gateway"),
    max_tokens: int = typer.Option(48),
    queue_per_replica: float = typer.Option(3.0, help="the stats stream's per-replica queue threshold"),
    max_num_seqs: int = typer.Option(2, help="rows per replica; the rest of the requests queue"),
    window_s: float = typer.Option(2.0, help="the stats stream's window"),
    timeout_s: float = typer.Option(240.0),
    tail_s: float = typer.Option(10.0, help="load kept on after the queue is back under the threshold"),
) -> None:
    """Sustained load on a fresh local stack until the autoscaler adds a replica: timeline JSON + PNG."""
    from bench._util import emit
    from lorafleet.config import get_settings

    logging.getLogger("httpx").setLevel(logging.WARNING)

    cfg = ScaleupConfig(queue_per_replica=queue_per_replica, window_s=window_s, max_num_seqs=max_num_seqs)
    work = Path(tempfile.mkdtemp(prefix="lorafleet-scaleup-"))
    result = asyncio.run(
        run_scaleup(get_settings(), work, cfg, clients, max_tokens, timeout_s=timeout_s, tail_s=tail_s)
    )
    result["logs"] = str(work)
    out_dir.mkdir(parents=True, exist_ok=True)
    series = {k: result.pop(k) for k in ("queue_series", "signal_series")}
    emit(result)
    (out_dir / "scaleup.json").write_text(json.dumps({**result, **series}, indent=1) + "\n")
    plot({**result, **series}, out_dir / "scaleup.png")
