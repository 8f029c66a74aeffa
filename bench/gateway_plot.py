"""The PNG of `lorafleet bench gateway`: added TTFT, added inter-token latency and gateway CPU per rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(result: dict[str, Any], path: Path) -> None:
    """Three panels over the request rate, with the goals drawn as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["summary"]
    goals = result["goals"]
    rates = [r["rate_per_s"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ttft, itl, cpu = axes
    ttft.plot(rates, [r["added_ttft_p50_ms"] for r in rows], "o-", label="p50")
    ttft.plot(rates, [r["added_ttft_p99_ms"] for r in rows], "s-", label="p99")
    ttft.axhline(goals["added_ttft_p99_ms"], ls="--", c="gray", lw=1, label="p99 goal")
    ttft.axhline(goals["added_ttft_p50_ms"], ls=":", c="gray", lw=1, label="p50 goal")
    ttft.set(title="added TTFT (gateway - direct)", xlabel="requests/s", ylabel="ms")
    itl.plot(rates, [r["added_itl_p50_ms"] for r in rows], "o-", label="ITL p50")
    itl.plot(rates, [r["added_itl_p99_ms"] for r in rows], "s-", label="ITL p99")
    itl.plot(rates, [r["added_lateness_p99_ms"] for r in rows], "^-", label="token lateness p99")
    itl.axhline(goals["added_itl_p99_ms"], ls="--", c="gray", lw=1, label="p99 goal")
    itl.set(title="added per-token latency", xlabel="requests/s", ylabel="ms")
    cpu.plot(rates, [r["gateway_cores"] for r in rows], "o-", label="gateway cores")
    cpu.axhline(goals["gateway_cores"], ls="--", c="gray", lw=1, label="goal at 40/s")
    cpu.set(title="gateway CPU", xlabel="requests/s", ylabel="cores")
    per_1k = cpu.twinx()
    per_1k.plot(rates, [r["gateway_cpu_s_per_1k_tokens"] for r in rows], "x:", c="C3", label="CPU-s / 1k tok")
    per_1k.set_ylabel("CPU-s per 1,000 tokens")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    per_1k.legend(fontsize=8, loc="lower right")
    env = result["environment"]
    fig.suptitle(
        f"lorafleet bench gateway @ {env['git_commit']}: {result['config']['max_tokens']} tokens/request, "
        f"load average {env['load_average_1m_at_start']} (shared machine, noisy)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
