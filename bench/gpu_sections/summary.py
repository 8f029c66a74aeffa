"""The table bench/gpu_check.py prints at the end: each section's status and its main figures."""

from __future__ import annotations

from typing import Any

# The goals at the calibration context: 32 distinct rank-16 adapters within 1.25x of the base-only step
# (tokens/s at least 0.8x), and the base-only step at batch 32 within 1.5x of its bandwidth floor.
TARGETS_VS_0 = {32: 1 / 1.25}
BASE_OVER_FLOOR = 1.5


def table(report: dict[str, Any]) -> str:
    """One line per figure: section, case, value."""
    rows = [
        (name, "status", f"{s['status']} ({s.get('wall_s', 0):.1f} s)")
        for name, s in report["sections"].items()
    ]
    sections = report["sections"]
    for key, rows_of in FIGURES.items():
        if sections.get(key, {}).get("status") == "ok":
            rows += rows_of(sections[key], report)
    left = max((len(section) for section, _, _ in rows), default=0)
    width = max((len(case) for _, case, _ in rows), default=0)
    return "\n".join(f"{section:<{left}}  {case:<{width}}  {value}" for section, case, value in rows)


def kernel_rows(s: dict[str, Any], report: dict[str, Any]) -> list[tuple[str, str, str]]:
    checks = s["lora"] + s["paged_decode"]
    return [("kernels", f"{len(checks)} checks ({s['implementation']})", "all ok")]


def kv_rows(s: dict[str, Any], report: dict[str, Any]) -> list[tuple[str, str, str]]:
    value = f"{s['blocks']:,} blocks, {s['tokens']:,} tokens, {s['bytes'] / 2**30:.1f} GiB"
    return [("kv_blocks", f"at {s['gpu_memory_utilization']}", value)]


def load_rows(s: dict[str, Any], report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        ("slot_load", f"rank {rank} (bucket {r['bucket']})",
         f"{r['median_s'] * 1e3:.2f} ms, {r['gb_per_s']:.1f} GB/s, x{r['over_floor']:.2f} floor")
        for rank, r in s["by_rank"].items()
    ]  # fmt: skip


def sampling_rows(s: dict[str, Any], report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [("sampling", f"batch {b}", str(v)[:60]) for b, v in s.get("by_batch", {}).items()]


def step_loop_rows(s: dict[str, Any], report: dict[str, Any]) -> list[tuple[str, str, str]]:
    ms = {side: v * 1e3 for side, v in s["median_s"].items()}
    case = f"b{s['batch']} {s['path']}, staged ahead vs not"
    value = f"{ms['after']:.2f} ms vs {ms['before']:.2f} ms (x{s['after_over_before']:.3f})"
    rows = [("step_loop", case, value)]
    if "launch_syncs" in s:
        syncs = s["launch_syncs"]
        rows.append(
            (
                "step_loop",
                "host syncs before the read",
                str(len(syncs)) + (f": {syncs[0][:50]}" if syncs else ""),
            )
        )
    return rows


def prefill_rows(s: dict[str, Any], report: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = [("prefill", f"1 x {n} tokens", rate(v)) for n, v in s["single"].items()]
    rows += [("prefill", f"{v['sequences']} prompts, {d} distinct", rate(v)) for d, v in s["multi"].items()]
    mixed = s["mixed"]
    case = f"{mixed['decode_rows']} decode + {mixed['chunk_tokens']}-token chunk"
    rows.append(
        ("prefill", case, f"{mixed['median_s'] * 1e3:.1f} ms" if "median_s" in mixed else mixed["status"])
    )
    return rows


def rate(v: dict[str, Any]) -> str:
    return f"{v['tokens_per_s']:,.0f} tok/s" if v.get("status") == "ok" else str(v.get("status"))


def decode_rows(s: dict[str, Any], report: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    context = report["calibration_context"]
    for path in ("eager", "captured"):
        entry = s[path]
        for p in entry["points"]:
            if p["context"] == context and p.get("status") == "ok":
                ms, floor = p["median_s"] * 1e3, p["over_floor"]
                value = f"{p['tokens_per_s']:,.0f} tok/s, {ms:.2f} ms, x{floor:.1f} floor"
                if p["batch"] == 32 and p["distinct"] == 0:
                    value += f" (target x{BASE_OVER_FLOOR}) " + ("ok" if floor <= BASE_OVER_FLOOR else "MISS")
                rows.append((f"decode {path}", f"b{p['batch']} c{context} d{p['distinct']}", value))
        for r in entry.get("ratio_vs_0", []):
            target = TARGETS_VS_0.get(r["distinct"])
            if r["context"] == context and target is not None:
                verdict = "ok" if r["ratio"] >= target else "MISS"
                case = f"b{r['batch']} c{context} d{r['distinct']} vs d0"
                rows.append((f"decode {path}", case, f"x{r['ratio']:.3f} (target {target}) {verdict}"))
    return rows


FIGURES = {
    "kernels": kernel_rows,
    "kv_blocks": kv_rows,
    "slot_load": load_rows,
    "sampling": sampling_rows,
    "step_loop": step_loop_rows,
    "prefill": prefill_rows,
    "decode": decode_rows,
}
