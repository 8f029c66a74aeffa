"""The prefill section: prompt tokens/s through ModelRunner.run, alone, packed with adapters, and mixed in
with decode rows in one step (what chunked prefill does to a running batch)."""

from __future__ import annotations

import logging
from typing import Any

from bench.gpu_sections.common import Bench, block_tables, blocks_for, slot_for, time_calls
from replica.engine.model_runner import DEFAULT_BLOCK_SIZE, ModelRunner, StepInput

log = logging.getLogger("gpu_check")

MULTI_DISTINCT = (0, 8)


def measure(bench: Bench, out: dict[str, Any]) -> None:
    """Single prompts of each length, several prompts with 0 and 8 adapters, one mixed step."""
    mode = bench.mode
    seqs, seq_len = mode.prefill_multi
    rows, context, chunk = mode.mixed
    shapes = {
        **{f"single {n}": [n] for n in mode.prefill_lens},
        "multi": [seq_len] * seqs,
        "mixed": [context] * rows + [chunk],
    }
    runner = ModelRunner(
        bench.need_model(),
        max_num_seqs=max(len(lengths) for lengths in shapes.values()),
        max_model_len=max(n for lengths in shapes.values() for n in lengths),
        num_blocks=max(blocks_for(lengths, DEFAULT_BLOCK_SIZE) for lengths in shapes.values()),
    )
    timed = Timed(bench, runner)
    out["single"] = {str(n): timed([StepInput([3] * n, 0, block_tables([n], DEFAULT_BLOCK_SIZE)[0])])
                     for n in mode.prefill_lens}  # fmt: skip
    bench.save()
    tables = block_tables(shapes["multi"], DEFAULT_BLOCK_SIZE)
    out["multi"] = {
        str(d): timed([StepInput([3] * seq_len, 0, t, slot_for(i, d)) for i, t in enumerate(tables)])
        for d in MULTI_DISTINCT
    }
    bench.save()
    # every row its own adapter: the decode rows and the chunk together use rows + 1 distinct ones
    *decode_tables, chunk_table = block_tables(shapes["mixed"], DEFAULT_BLOCK_SIZE)
    steps = [StepInput([2], context - 1, t, slot_for(i, rows + 1)) for i, t in enumerate(decode_tables)]
    steps.append(StepInput([3] * chunk, 0, chunk_table, slot_for(rows, rows + 1)))
    out["mixed"] = dict(decode_rows=rows, context=context, chunk_tokens=chunk, distinct=rows + 1)
    out["mixed"].update(timed(steps))


class Timed:
    """Median seconds of runner.run(steps) and tokens/s of its new tokens; skipped past the deadline."""

    def __init__(self, bench: Bench, runner: ModelRunner) -> None:
        self.bench, self.runner = bench, runner

    def __call__(self, steps: list[StepInput]) -> dict[str, Any]:
        tokens = sum(len(s.token_ids) for s in steps)
        row: dict[str, Any] = dict(sequences=len(steps), tokens=tokens)
        if self.bench.past_deadline():
            return {**row, "status": "skipped: deadline"}

        def run() -> object:
            return self.runner.run(steps)

        try:
            t = time_calls(run, self.bench.device, 1, self.bench.mode.prefill_iters)
        except Exception as exc:
            log.exception("prefill of %s failed", row)
            return {**row, "status": f"failed: {type(exc).__name__}: {exc}"}
        return {**row, "status": "ok", **t, "tokens_per_s": tokens / t["median_s"]}
