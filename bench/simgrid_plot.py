"""The PNG of `lorafleet bench simgrid`: GPU hit rate and p95 TTFT per cell, one heatmap per routing mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(result: dict[str, Any], path: Path) -> None:
    """Rows: adapters x Zipf; columns: rate. Top: GPU hit (fleet size, <= slot bound); bottom: p95 TTFT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cfg, cells = result["config"], result["cells"]
    modes = cfg["modes"]
    rows = [(a, z) for a in cfg["adapters"] for z in cfg["zipf"]]
    rates = list(cfg["rates"])
    at = {(c["adapters"], c["zipf"], c["rate"]): c for c in cells}
    fig, axes = plt.subplots(2, len(modes), figsize=(5.0 * len(modes), 11), squeeze=False)
    for col, mode in enumerate(modes):
        hit = np.full((len(rows), len(rates)), np.nan)
        p95 = np.full((len(rows), len(rates)), np.nan)
        for i, (a, z) in enumerate(rows):
            for j, r in enumerate(rates):
                c = at.get((a, z, r))
                if c is not None:
                    hit[i, j] = c["modes"][mode]["gpu_hit_rate"]
                    p95[i, j] = c["modes"][mode]["p95_ttft_s"] or np.nan
        panels = (
            (axes[0][col], hit, "RdYlGn", (0.5, 1.0), "GPU hit rate"),
            (axes[1][col], p95, "RdYlGn_r", (0.0, 2.0 * cfg["slo_p95_ttft_s"]), "p95 TTFT, s"),
        )
        for ax, values, cmap, (lo, hi), label in panels:
            ax.imshow(values, cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
            for i, (a, z) in enumerate(rows):
                for j, r in enumerate(rates):
                    c = at.get((a, z, r))
                    if c is None or np.isnan(values[i, j]):
                        continue
                    text = f"{values[i, j]:.1%}" if values is hit else f"{values[i, j]:.2f}"
                    if values is hit:
                        text += f"\n{c['replicas']} rep, <={c['slot_bound']:.0%}"
                    ax.text(j, i, text, ha="center", va="center", fontsize=7)
            ax.set_xticks(range(len(rates)), [f"{r:g}/s" for r in rates])
            ax.set_yticks(range(len(rows)), [f"{a:,} s={z:g}" for a, z in rows])
            ax.set_title(f"{mode}: {label}")
    fig.suptitle(
        f"lorafleet simulate grid{' on ' + Path(cfg['trace']).name if cfg.get('trace') else ''}: "
        f"{cfg['duration_s']:g} s per cell, fleets sized for p95 TTFT "
        f"<= {cfg['slo_p95_ttft_s']:g} s with cost routing"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
