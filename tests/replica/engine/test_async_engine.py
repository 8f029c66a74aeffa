"""AsyncEngine: requests from the event loop reach the engine thread at once, and each stream gets its own
outputs in order, alone or sharing steps with others."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from replica.engine.async_engine import AsyncEngine
from replica.engine.engine import LLMEngine, StepOutput
from replica.engine.model_runner import ModelRunner
from replica.engine.trace import AdmissionTrace
from replica.model.loader import load_model
from tests.replica.engine.engine_util import EOS, CharDetokenizer, greedy


def _engine(tiny_model_dir: Path) -> AsyncEngine:
    runner = ModelRunner(load_model(tiny_model_dir, "float32", "cpu"), max_num_seqs=4, max_model_len=64)
    return AsyncEngine(LLMEngine(runner, None, {EOS}, detokenizer_factory=CharDetokenizer))


async def _collect(
    engine: AsyncEngine, prompt: list[int], n: int, trace: AdmissionTrace | None = None
) -> list:
    return [out async for out in engine.generate(prompt, greedy(n), trace=trace)]


async def test_concurrent_streams_get_their_own_tokens_as_when_alone(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    engine.start()
    try:
        prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
        alone = [await _collect(engine, p, 5 + i) for i, p in enumerate(prompts)]
        together = await asyncio.gather(*(_collect(engine, p, 5 + i) for i, p in enumerate(prompts)))
    finally:
        engine.stop()
    for solo, shared, n in zip(alone, together, (5, 6, 7), strict=True):
        assert [o.token_id for o in shared] == [o.token_id for o in solo] and len(shared) == n
        assert [o.finished for o in shared] == [False] * (n - 1) + [True]
        assert isinstance(shared[0], StepOutput) and len({o.request_id for o in shared}) == 1


async def test_an_idle_engine_marks_no_step_wait_and_its_marks_in_order(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    engine.start()
    try:
        await _collect(engine, [1, 2], 1)
        await asyncio.sleep(0.6)  # idle for longer than any wake-up timer would run
        trace = AdmissionTrace(time.perf_counter())
        outs = await _collect(engine, [1, 2, 3], 2, trace)
    finally:
        engine.stop()
    assert len(outs) == 2
    assert trace.queued <= trace.boundary <= trace.picked <= trace.step_start <= trace.step_end
    assert trace.boundary == trace.queued  # idle: no step to wait for
