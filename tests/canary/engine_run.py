"""Serve many canary requests through a replica's own request path and judge each output's markers.

Each request goes as the replica's generate route sends it: Replica.acquire (the adapter cache brings the
adapter into a GPU slot, evicting an idle one LRU, and pins it), the engine thread's continuous batching
(AsyncEngine: admission, mixed-adapter batches with base-only rows), then Replica.release. `concurrency`
requests are in flight at once, so slot writes on the event loop run beside the engine's forward passes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from canary.check import IsolationTally
from canary.markers import Marker, markers_in_tokens
from canary.prompts import PromptSource
from replica.engine.sampler import SamplingParams
from replica.errors import ReplicaError
from replica.runtime import Replica


@dataclass(frozen=True)
class CanaryRequest:
    request_id: str
    adapter_id: str | None  # None: base only
    prompt_token_ids: list[int]
    schema: dict[str, Any] | None = None  # a constrained row: its answer is held to this JSON schema


def mixed_requests(
    count: int,
    adapter_ids: list[str],
    sampler: PromptSource,
    seed: int,
    base_fraction: float = 0.2,
    schemas: Sequence[dict[str, Any]] = (),
    constrained_fraction: float = 0.0,
) -> Iterator[CanaryRequest]:
    """count requests in random order: base-only with probability base_fraction, else a random canary;
    with probability constrained_fraction a request is held to one of schemas."""
    rng = random.Random(f"canary-requests:{seed}")
    for i in range(count):
        adapter = None if rng.random() < base_fraction else rng.choice(adapter_ids)
        schema = rng.choice(schemas) if schemas and rng.random() < constrained_fraction else None
        yield CanaryRequest(f"iso-{i}", adapter, sampler.sample(rng), schema)


@dataclass
class EngineRunStats:
    max_batch: int = 0  # the most rows the engine ran together, seen as outputs arrived
    tokens: int = 0
    # a constrained row's schema and tokens, by request id: judged by its grammar, not by markers
    constrained: dict[str, tuple[dict[str, Any], list[int]]] = field(default_factory=dict)


async def run_isolation(
    replica: Replica,
    requests: Iterable[CanaryRequest],
    markers: list[Marker],
    max_new_tokens: int,
    concurrency: int = 192,
    constrained_max_tokens: int = 48,
) -> tuple[IsolationTally, EngineRunStats]:
    """Greedy-decode every request to max_new_tokens and record which markers each output carries; a
    constrained request decodes under its own grammar, up to constrained_max_tokens, into stats."""
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True)
    held = SamplingParams(temperature=0.0, max_tokens=constrained_max_tokens)
    tally, stats = IsolationTally(), EngineRunStats()
    running = replica.engine.engine.scheduler.running
    pending = iter(requests)

    async def serve(req: CanaryRequest) -> None:
        tokens: list[int] = []
        error = None
        try:
            use = await replica.acquire(req.adapter_id)
        except ReplicaError as exc:
            tally.record_error(req.request_id, req.adapter_id, f"{exc.code}: {exc}")
            return
        try:
            grammar = None
            if req.schema is not None:
                assert replica.grammars is not None, "constrained rows need the model's tokenizer"
                grammar = replica.grammars.matcher(req.schema)
            stream = replica.engine.generate(
                req.prompt_token_ids,
                held if grammar is not None else params,
                use.engine_adapter_id,
                req.request_id,
                grammar=grammar,
            )
            async for out in stream:
                stats.max_batch = max(stats.max_batch, len(running))
                if out.token_id is not None:
                    tokens.append(out.token_id)
                error = out.error
        finally:
            replica.release(use)
        stats.tokens += len(tokens)
        if req.schema is not None and error is None:
            stats.constrained[req.request_id] = (req.schema, tokens)
        elif error is not None:
            tally.record_error(req.request_id, req.adapter_id, error)
        else:
            tally.record(req.request_id, req.adapter_id, markers_in_tokens(tokens, markers))

    async def client() -> None:
        for req in pending:  # the clients share one iterator: each request is served once
            await serve(req)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return tally, stats
