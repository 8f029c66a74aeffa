"""The decode section: one decode step's time over batch x context x distinct adapters, eager and captured.

No prefill fills the cache (64 rows of 2,048 tokens would take longer than the grid): each row gets a
block table covering `context` positions and decodes at start_pos context - 1, over whatever the cache
holds, which times the same reads. Eager is ModelRunner.run per step, host packing included; captured is a
runner built with cuda_graphs=True, which replays a CUDA graph per batch-size bucket, when ModelRunner has
that keyword. Each runner's KV cache is sized for its largest grid point only. The calibration context is
measured first on both paths, so a deadline leaves what the simulator needs.

The floor of a step is the bytes it must read once at HBM_BYTES_PER_S: every weight but the embedding
table (a gather of batch rows), the K and V of batch x context positions, and each distinct adapter's A
and B.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from bench.gpu_sections.common import (
    HBM_BYTES_PER_S,
    RANK,
    Bench,
    block_tables,
    free_memory,
    slot_for,
    time_calls,
)
from replica.engine.model_runner import DEFAULT_BLOCK_SIZE, ModelRunner, StepInput
from replica.kv.paged_cache import bytes_per_block

log = logging.getLogger("gpu_check")

PATHS = ("eager", "captured")


def measure(bench: Bench, out: dict[str, Any]) -> None:
    """Every grid point on each path that can run here; the calibration context first."""
    mode = bench.mode
    out["floor"] = floor_terms(bench)
    for path in PATHS:
        reason = None if path == "eager" else captured_unavailable(bench)
        out[path] = {"status": reason or "ok", "points": []}
    others = tuple(c for c in mode.contexts if c != mode.calibration_context)
    groups = [g for g in ((mode.calibration_context,), others) if g and set(g) <= set(mode.contexts)]
    for contexts in groups:
        for path in PATHS:
            if out[path]["status"] == "ok":
                run_phase(bench, path, contexts, out[path], out["floor"])
                free_memory(bench.device)
    for path in PATHS:
        out[path]["ratio_vs_0"] = ratios(out[path]["points"])
    bench.save()


def captured_unavailable(bench: Bench) -> str | None:
    """Why the captured path cannot run here, as a skip status; None when it can."""
    if bench.device.type != "cuda":
        return "skipped: no CUDA"
    if "cuda_graphs" not in inspect.signature(ModelRunner.__init__).parameters:
        return "skipped: ModelRunner has no cuda_graphs keyword"
    return None


def grid(bench: Bench, contexts: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(batch, context, distinct) points; a distinct count above the batch is left out."""
    m = bench.mode
    return [(b, c, d) for c in contexts for b in m.batches for d in m.distinct if d <= b]


def run_phase(
    bench: Bench, path: str, contexts: tuple[int, ...], entry: dict[str, Any], floor: dict[str, Any]
) -> None:
    """One runner for the path, every point of these contexts; the report saved after each point."""
    points = grid(bench, contexts)
    if bench.past_deadline():
        entry["points"] += [point(b, c, d, status="skipped: deadline") for b, c, d in points]
        return
    try:
        runner = build_runner(bench, path, max(contexts))
    except Exception as exc:
        log.exception("building the %s runner failed", path)
        entry["status"] = f"failed: {type(exc).__name__}: {exc}"
        return
    for b, c, d in points:
        row = point(b, c, d)
        if bench.past_deadline():
            row["status"] = "skipped: deadline"
        else:
            try:
                row.update(step_time(bench, runner, b, c, d, floor))
            except Exception as exc:  # one failing point must not stop the grid
                log.exception("decode %s %s failed", path, row)
                row["status"] = f"failed: {type(exc).__name__}: {exc}"
        entry["points"].append(row)
        bench.save()


def point(batch: int, context: int, distinct: int, **extra: str) -> dict[str, Any]:
    return dict(batch=batch, context=context, distinct=distinct, **extra)


def build_runner(bench: Bench, path: str, longest: int) -> ModelRunner:
    """A runner whose cache holds the largest batch at the longest context of this phase, no more."""
    mode = bench.mode
    blocks_per_seq = -(-max(mode.contexts) // DEFAULT_BLOCK_SIZE)
    num_blocks = max(max(mode.batches) * -(-longest // DEFAULT_BLOCK_SIZE), blocks_per_seq)
    options: dict[str, Any] = {"cuda_graphs": True} if path == "captured" else {}
    return ModelRunner(
        bench.need_model(),
        max_num_seqs=max(mode.batches),
        max_model_len=max(mode.contexts),
        num_blocks=num_blocks,
        **options,
    )


def step_time(
    bench: Bench, runner: ModelRunner, batch: int, context: int, distinct: int, floor: dict[str, Any]
) -> dict[str, Any]:
    """Median seconds of one decode step (run() on batch one-token rows), and its bandwidth floor."""
    tables = block_tables([context] * batch, DEFAULT_BLOCK_SIZE)
    steps = [StepInput([2], context - 1, t, slot_for(i, distinct)) for i, t in enumerate(tables)]

    def run() -> object:
        return runner.run(steps)

    t = time_calls(run, bench.device, bench.mode.warmup, bench.mode.iters)
    floor_s = step_floor_s(floor, batch, context, distinct)
    return dict(
        status="ok",
        **t,
        tokens_per_s=batch / t["median_s"],
        floor_s=floor_s,
        over_floor=t["median_s"] / floor_s,
    )


def floor_terms(bench: Bench) -> dict[str, Any]:
    """The byte counts a step's floor is made of."""
    model = bench.need_model()
    weights = sum(p.nbytes for name, p in model.named_parameters() if "embed_tokens" not in name)
    arena = next(iter(bench.wrappers.values())).pools[RANK].arena
    return dict(
        hbm_bytes_per_s=HBM_BYTES_PER_S,
        weight_bytes=weights,
        kv_bytes_per_token=bytes_per_block(model.config, 1, bench.dtype),
        adapter_bytes=arena.layout.row_numel * arena.data.element_size(),
    )


def step_floor_s(floor: dict[str, Any], batch: int, context: int, distinct: int) -> float:
    """Seconds to read the weights, batch x context positions of K and V, and distinct adapters once."""
    nbytes = (
        floor["weight_bytes"]
        + batch * context * floor["kv_bytes_per_token"]
        + distinct * floor["adapter_bytes"]
    )
    return float(nbytes / floor["hbm_bytes_per_s"])


def ratios(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tokens/s with d distinct adapters over tokens/s with none, at each batch and context with both."""
    ok = {(p["batch"], p["context"], p["distinct"]): p for p in points if p.get("status") == "ok"}
    return [
        dict(batch=b, context=c, distinct=d, ratio=p["tokens_per_s"] / ok[(b, c, 0)]["tokens_per_s"])
        for (b, c, d), p in ok.items()
        if d > 0 and (b, c, 0) in ok
    ]
