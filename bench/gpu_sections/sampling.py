"""The sampling section: bench/sampling.py's sampling_cost at decode batch sizes, when that bench exists."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from bench.gpu_sections.common import Bench, Skipped
from bench.gpu_sections.modes import SHAPES

SAMPLING_ITERS = 20


def measure(bench: Bench, out: dict[str, Any]) -> None:
    """sampling_cost(device, batch, vocab, iters) for each of the mode's sampling batch sizes."""
    if importlib.util.find_spec("bench.sampling") is None:
        raise Skipped("bench/sampling.py is not there")
    module = importlib.import_module("bench.sampling")
    cost = getattr(module, "sampling_cost", None)
    if cost is None:
        raise Skipped("bench/sampling.py has no sampling_cost")
    vocab = SHAPES[bench.mode.shape]["vocab_size"]
    iters = SAMPLING_ITERS if bench.mode.device == "cuda" else 3
    out.update(vocab=vocab, iters=iters, by_batch={})
    for batch in bench.mode.sampling_batches:
        out["by_batch"][str(batch)] = cost(bench.device, batch, vocab, iters)
        bench.save()
