"""The step_loop section: decode steps run back to back as the engine runs them, with and without the next
step staged ahead.

Each iteration builds the rows (one token each, at the next position, the last draw's ids as their
tokens), launches the decode step (captured where ModelRunner can capture), queues the draw
(launch_sample, temperature 1.0), stages the next step's rows when staging ahead (ModelRunner.stage_ahead),
and reads the chosen ids: LLMEngine.step's order, without its scheduler. Both variants alternate over
LOOP_REPEATS runs on one runner; the result is each one's median iteration and after / before. On CUDA,
one more iteration's launches run under torch.cuda.set_sync_debug_mode("warn") and every host sync they
caused is recorded: there should be none before the read. That mode does not see an Event wait, so the
staging counts its own waits for a copy still in flight (staging.copy_waits; none in the engine's order,
whose read of each step's tokens comes after that step's copy).
"""

from __future__ import annotations

import statistics
import time
import warnings
from typing import Any

import torch

from bench.gpu_sections.common import NUM_ADAPTERS, Bench, block_tables, slot_for
from bench.gpu_sections.decode import build_runner, captured_unavailable
from replica.engine.model_runner import DEFAULT_BLOCK_SIZE, ModelRunner, StepInput
from replica.engine.sampler import PendingSample, SamplingParams, launch_sample

LOOP_BATCH = 32
LOOP_REPEATS = 3


def measure(bench: Bench, out: dict[str, Any]) -> None:
    """The median engine-order iteration with and without staging ahead, and the launches' host syncs."""
    mode = bench.mode
    steps = mode.warmup + mode.iters
    context = mode.calibration_context
    first = max(1, context - steps - 2)  # the position of the first row's token; the last stays in context
    path = "captured" if captured_unavailable(bench) is None else "eager"
    runner = build_runner(bench, path, context)
    loop = _Loop(runner, LOOP_BATCH, first, min(NUM_ADAPTERS, LOOP_BATCH), context)
    out.update(path=path, batch=LOOP_BATCH, first_position=first, steps=steps, repeats=LOOP_REPEATS)
    medians: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(LOOP_REPEATS):
        for side, ahead in (("before", False), ("after", True)):
            times = loop.run(steps, ahead)[mode.warmup :]
            medians[side].append(statistics.median(times))
            bench.save()
    out["median_s"] = {side: statistics.median(v) for side, v in medians.items()}
    out["after_over_before"] = out["median_s"]["after"] / out["median_s"]["before"]
    out["staging"] = dict(runner.decode.staging.counts)
    if bench.device.type == "cuda":
        out["launch_syncs"] = loop.launch_syncs()


class _Loop:
    """Rows decoding from position first; run() restarts there each time, rewriting the same KV."""

    def __init__(self, runner: ModelRunner, batch: int, first: int, distinct: int, context: int) -> None:
        self.runner, self.first = runner, first
        self.tables = block_tables([context] * batch, DEFAULT_BLOCK_SIZE)
        self.slots = [slot_for(i, distinct) for i in range(batch)]
        self.params = [SamplingParams(temperature=1.0)] * batch
        self.seeds = list(range(batch))

    def rows(self, step: int, tokens: list[int]) -> list[StepInput]:
        pos = self.first + step
        return [
            StepInput([t], pos, tab, s) for t, tab, s in zip(tokens, self.tables, self.slots, strict=True)
        ]

    def launch(self, step: int, tokens: list[int], ahead: bool, outputs: list[list[int]]) -> PendingSample:
        logits = self.runner.run(self.rows(step, tokens))
        pending = launch_sample(logits, self.params, self.seeds, outputs)
        if ahead:
            self.runner.stage_ahead(self.rows(step + 1, tokens))
        return pending

    def run(self, steps: int, ahead: bool) -> list[float]:
        """Seconds of each of steps iterations, the first one's wait for the device included."""
        tokens, times = [2] * len(self.seeds), []
        outputs: list[list[int]] = [[] for _ in self.seeds]
        for step in range(steps):
            start = time.perf_counter()
            tokens = self.launch(step, tokens, ahead, outputs).read().token_ids
            times.append(time.perf_counter() - start)
            for o, t in zip(outputs, tokens, strict=True):
                o.append(t)
        return times

    def launch_syncs(self) -> list[str]:
        """The host syncs one iteration's launches (step, draw, staging) caused, before its read."""
        tokens = [2] * len(self.seeds)
        outputs: list[list[int]] = [[] for _ in self.seeds]
        self.launch(0, tokens, True, outputs).read()  # the first step's graph and allocations
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                pending = self.launch(1, tokens, True, outputs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        pending.read()
        return [str(w.message)[:300] for w in caught]
