"""The simulator's calibration file from a gpu_check report, in the format sim.timing.load_timing reads.

One run per decode batch size at the calibration context: decode_step_s by distinct adapters (captured
when that path measured the batch, else eager, never the two mixed within one batch), the longest single
prompt's prefill in the batch-1 run and the packed prompts' in the run of their batch size, and the RAM ->
slot load of a rank-16 adapter as load_s["ram"] in the first run (load_timing reads only the runs).
"""

from __future__ import annotations

from typing import Any

RAM_TIER = "ram"  # schemas.tiers.LOAD_S's key for host RAM -> GPU slot
LOAD_RANK = "16"  # the brief's adapters


def calibration(report: dict[str, Any]) -> dict[str, Any] | None:
    """The calibration data, or None while no decode step at the calibration context was measured."""
    sections = report["sections"]
    context = report["calibration_context"]
    decode = sections.get("decode", {})
    runs: list[dict[str, Any]] = []
    for batch, (path, points) in sorted(decode_points(decode, context).items()):
        steps = {str(p["distinct"]): {"median": p["median_s"]} for p in points}
        runs.append({"batch": batch, "decode_path": path, "decode_step_s": steps})
    if not runs:
        return None
    by_batch = {run["batch"]: run for run in runs}
    prefill = sections.get("prefill", {})
    single = [(int(n), v) for n, v in prefill.get("single", {}).items() if v.get("status") == "ok"]
    if single and 1 in by_batch:
        _, longest = max(single, key=lambda item: item[0])
        by_batch[1]["prefill"] = {"0": prefill_entry(longest)}
    multi = {d: v for d, v in prefill.get("multi", {}).items() if v.get("status") == "ok"}
    if multi:
        sequences = next(iter(multi.values()))["sequences"]
        if sequences in by_batch:
            by_batch[sequences].setdefault("prefill", {}).update(
                {d: prefill_entry(v) for d, v in multi.items()}
            )
    load = sections.get("slot_load", {}).get("by_rank", {}).get(LOAD_RANK)
    if load is not None:
        runs[0]["load_s"] = {RAM_TIER: load["median_s"]}
    return {
        "source": "bench/gpu_check.py",
        "mode": report["mode"],
        "device": report["device"],
        "context": context,
        "runs": runs,
    }


def decode_points(decode: dict[str, Any], context: int) -> dict[int, tuple[str, list[dict[str, Any]]]]:
    """batch -> (path, its measured points at context): captured where it measured that batch."""
    out: dict[int, tuple[str, list[dict[str, Any]]]] = {}
    for path in ("eager", "captured"):  # captured last: it replaces eager where it has the batch
        by_batch: dict[int, list[dict[str, Any]]] = {}
        for p in decode.get(path, {}).get("points", []):
            if p.get("status") == "ok" and p["context"] == context:
                by_batch.setdefault(p["batch"], []).append(p)
        out.update({b: (path, points) for b, points in by_batch.items()})
    return out


def prefill_entry(measured: dict[str, Any]) -> dict[str, Any]:
    """What load_timing's prefill fit reads: tokens and the median seconds of their forward pass."""
    return {"tokens": measured["tokens"], "median_s": measured["median_s"]}
