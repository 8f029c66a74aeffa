"""Decode steps captured as CUDA graphs: one per padded batch size, with and without adapter rows.

A graph replays every kernel of a DecodeStep.forward (embedding, every layer, one adapter shrink and expand
per projection covering every rank bucket, the LM head) in one launch, on the step's static buffers. A
batch with no adapter row has a graph with no adapter kernel in it. (Without the one-launch kernels there
is a graph per set of rank buckets present, each bucket its own launches.) Graphs are captured on first use
and share one memory pool.
Capture needs kernels that neither sync with the host nor size anything from the data: the Triton LoRA and
paged-attention kernels. Without them (no Triton) the runner stays eager.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from replica.engine.decode_step import DecodeStep, PreparedBatch
from replica.kernels import ops, paged_ops

log = logging.getLogger(__name__)

WARMUP_RUNS = 2  # compile and autotune the Triton kernels before capture


def can_capture(device: torch.device) -> bool:
    """True where the decode step's kernels are all capturable: CUDA with the Triton kernels loaded."""
    return (
        device.type == "cuda" and ops.implementation_for(device) == "triton" and paged_ops.has_triton_decode()
    )


class DecodeGraphs:
    """Replays a captured graph for each prepared decode batch, capturing it the first time.

    Every graph writes its logits into one static buffer, so graphs hold no output of their own; what run()
    returns is a view of it, valid until the next run(). A key whose capture failed runs eagerly from then on.
    Capture checks only this thread's CUDA calls (thread_local), so the adapter loader's copies on other
    threads may go on.
    """

    def __init__(self, step: DecodeStep) -> None:
        self.step = step
        self.graphs: dict[tuple[int, tuple[int, ...]], Any] = {}  # torch.cuda.CUDAGraph, or None: eager
        self.pool: Any = None
        vocab = step.model.lm_head.weight.shape[0]
        self.logits = torch.empty(step.max_rows, vocab, dtype=torch.float32, device=step.device)

    def run(self, batch: PreparedBatch) -> torch.Tensor:
        """Logits [rows, vocab] of a batch the step has prepared."""
        key = (batch.padded, batch.graph_buckets)
        if key not in self.graphs:
            self.graphs[key] = self._capture(batch)
        graph = self.graphs[key]
        if graph is None:
            return self.step.forward(batch.padded, batch.buckets, batch.max_blocks, batch.distinct)[
                : batch.rows
            ]
        graph.replay()
        return self.logits[: batch.rows]

    def capture_all(self, buckets: tuple[int, ...]) -> int:
        """Capture every padded size before serving, without and with adapter rows (one graph covers every
        bucket where one launch does; else the smallest bucket alone is captured ahead). Returns the count."""
        step = self.step
        for size in step.buckets:
            for bucket in (None, *buckets[:1]):
                self.run(step.prepare(step.dummy_rows(size, bucket)))
        return sum(g is not None for g in self.graphs.values())

    def _capture(self, batch: PreparedBatch) -> Any:
        # The attention kernel reads each row's own length; the eager path's max_blocks bound is unused.
        args = (batch.padded, batch.buckets, self.step.width)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up runs redo this step's own rows: same K/V, same slots
                for _ in range(WARMUP_RUNS):
                    self.step.forward(*args)
            torch.cuda.current_stream().wait_stream(side)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                self.logits[: batch.padded].copy_(self.step.forward(*args))
        except Exception:
            log.exception("capturing a decode graph of %d rows failed; it runs eagerly", batch.padded)
            return None
        log.info("captured a decode graph: %d rows, rank buckets %s", batch.padded, list(batch.buckets))
        return graph
