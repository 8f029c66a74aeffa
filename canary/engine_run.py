"""Drive many canary requests through a real LLMEngine (its scheduler, slot pins and batching) and judge them.

Requests are fed through add_request and the engine's own step(), so admission, adapter loads and LRU
evictions, mixed-adapter batches and base-only rows all take the production path. The feeder keeps the
waiting queue short: the scheduler scans it every step, and a queue of 10,000 would measure that scan
instead of the batching.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from canary.check import IsolationTally
from canary.markers import Marker, markers_in_tokens
from canary.prompts import PromptSampler
from replica.engine.engine import LLMEngine
from replica.engine.sampler import SamplingParams


@dataclass(frozen=True)
class CanaryRequest:
    request_id: str
    adapter_id: str | None  # None: base only
    prompt_token_ids: list[int]


def mixed_requests(
    count: int, adapter_ids: list[str], sampler: PromptSampler, seed: int, base_fraction: float = 0.2
) -> Iterator[CanaryRequest]:
    """count requests in random order: base-only with probability base_fraction, else a random canary."""
    rng = random.Random(f"canary-requests:{seed}")
    for i in range(count):
        adapter = None if rng.random() < base_fraction else rng.choice(adapter_ids)
        yield CanaryRequest(f"iso-{i}", adapter, sampler.sample(rng))


@dataclass
class EngineRunStats:
    steps: int = 0
    max_batch: int = 0
    tokens: int = 0


def run_isolation(
    engine: LLMEngine,
    requests: Iterator[CanaryRequest],
    markers: list[Marker],
    max_new_tokens: int,
    waiting_window: int = 128,
) -> tuple[IsolationTally, EngineRunStats]:
    """Greedy-decode every request to max_new_tokens and record which markers each output carries."""
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True)
    tally, stats = IsolationTally(), EngineRunStats()
    admitted: dict[str, str | None] = {}
    outputs: dict[str, list[int]] = {}
    pending = iter(requests)
    exhausted = False
    while True:
        while not exhausted and len(engine.scheduler.waiting) < waiting_window:
            req = next(pending, None)
            if req is None:
                exhausted = True
                break
            engine.add_request(req.request_id, req.prompt_token_ids, params, req.adapter_id)
            admitted[req.request_id] = req.adapter_id
            outputs[req.request_id] = []
        if exhausted and not engine.has_work():
            break
        stats.max_batch = max(stats.max_batch, len(engine.scheduler.running))
        step_outputs = engine.step()
        stats.steps += 1
        for out in step_outputs:
            if out.token_id is not None:
                outputs[out.request_id].append(out.token_id)
                stats.tokens += 1
            if not out.finished:
                continue
            adapter_id = admitted.pop(out.request_id)
            tokens = outputs.pop(out.request_id)
            if out.error is not None:
                tally.record_error(out.request_id, adapter_id, out.error)
            else:
                tally.record(out.request_id, adapter_id, markers_in_tokens(tokens, markers))
    return tally, stats
