"""Decode steps compiled by torch.compile: where no CUDA graph can replay a step (the CPU), the same step
function on the same static buffers, fused into a few generated loops instead of one dispatch per operator.

Off by default (ReplicaSettings.compile_decode): it needs a C++ compiler where the replica runs, and the
first steps compile (seconds on a tiny model, longer on a real one), which warm() does before serving. Under
compilation the adapter path reads each row's slot in place (kernels.gathered.indexed_term) rather than
gathering copies. Shapes that change (the padded batch, the longest row's blocks) are compiled once more as
dynamic. A compile that fails, or a compiled step that raises, logs it and leaves the step eager from then
on; the eager step then redoes that step's rows, writing the same K/V into the same slots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from replica.engine.decode_step import DecodeStep, PreparedBatch

log = logging.getLogger(__name__)


class CompiledDecode:
    """Runs prepared decode batches through the compiled step, or eagerly once compiling has failed."""

    def __init__(self, step: DecodeStep) -> None:
        self.step = step
        self.compiled: Callable[..., torch.Tensor] | None = torch.compile(step.forward)
        self.failures = 0

    def run(self, batch: PreparedBatch) -> torch.Tensor:
        """Logits [rows, vocab] of a batch the step has prepared."""
        args = (batch.padded, batch.buckets, batch.max_blocks, batch.distinct)
        if self.compiled is not None:
            try:
                return self.compiled(*args)[: batch.rows]
            except Exception:  # a compiler missing or failing: serve eagerly rather than fail the step
                log.exception("the compiled decode step failed; decode steps run eagerly from now on")
                self.compiled, self.failures = None, self.failures + 1
        return self.step.forward(*args)[: batch.rows]

    def warm(self, buckets: tuple[int, ...]) -> bool:
        """Compile before the first request: two batch sizes (the second compiles the dynamic shape), without
        and with adapter rows of the smallest bucket. Returns whether the step is still compiled."""
        step = self.step
        sizes = step.buckets[:1] + step.buckets[-1:]
        for size in sizes:
            for bucket in (None, *buckets[:1]):
                self.run(step.prepare(step.dummy_rows(size, bucket)))
        return self.compiled is not None
