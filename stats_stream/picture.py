"""The ops picture from stats events: top adapters, hit rates, recent alerts, the autoscaler's wish (pure)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from schemas.events import AdapterStats, Alert, AutoscaleSignal, Event
from stats_stream.aggregates import dedupe


def summarize(events: Iterable[Event], top: int = 10, alerts: int = 20) -> dict[str, Any]:
    unique = dedupe(events)
    stats = [e for e in unique if isinstance(e, AdapterStats)]
    latest: dict[str, AdapterStats] = {}
    for s in sorted(stats, key=lambda s: s.window_start):
        latest[s.adapter_id] = s
    newest_window = max((s.window_start for s in stats), default=None)
    in_newest = [s for s in stats if s.window_start == newest_window]
    requests = sum(s.requests for s in in_newest)
    signals = sorted((e for e in unique if isinstance(e, AutoscaleSignal)), key=lambda e: e.occurred_at)
    recent_alerts = sorted(
        (e for e in unique if isinstance(e, Alert)), key=lambda e: e.occurred_at, reverse=True
    )
    return {
        "window_start": newest_window.isoformat() if newest_window else None,
        "fleet": {
            "adapters_active": len(in_newest),
            "requests": requests,
            "tokens_per_s": sum(s.tokens_per_s for s in in_newest),
            "gpu_hit_rate": (sum(s.gpu_hit_rate * s.requests for s in in_newest) / requests)
            if requests
            else None,
        },
        "top_adapters": [
            {
                "adapter_id": s.adapter_id,
                "window_start": s.window_start.isoformat(),
                "requests": s.requests,
                "tokens_per_s": round(s.tokens_per_s, 2),
                "gpu_hit_rate": round(s.gpu_hit_rate, 4),
            }
            for s in sorted(latest.values(), key=lambda s: (-s.tokens_per_s, -s.requests, s.adapter_id))[:top]
        ],
        "alerts": [
            {
                "at": a.occurred_at.isoformat(),
                "kind": a.kind,
                "severity": a.severity,
                "subject": a.subject,
                "value": a.value,
                "threshold": a.threshold,
                "message": a.message,
            }
            for a in recent_alerts[:alerts]
        ],
        "autoscale": signals[-1].model_dump(mode="json") if signals else None,
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def render(picture: dict[str, Any]) -> str:
    """A few plain-text tables for a terminal."""
    fleet = picture["fleet"]
    lines = [
        f"window {picture['window_start'] or '-'}: {fleet['adapters_active']} adapters, "
        f"{fleet['requests']} requests, "
        f"{fleet['tokens_per_s']:.1f} tokens/s, GPU hit rate {_pct(fleet['gpu_hit_rate'])}",
        "",
        f"{'adapter':<40} {'requests':>9} {'tokens/s':>10} {'gpu hit':>8}",
    ]
    for a in picture["top_adapters"]:
        hit = _pct(a["gpu_hit_rate"])
        lines.append(f"{a['adapter_id']:<40} {a['requests']:>9} {a['tokens_per_s']:>10.1f} {hit:>8}")
    scale = picture["autoscale"]
    lines.append("")
    if scale:
        hot = ", ".join(f"{h['adapter_id']}x{h['owners']}" for h in scale["hot_adapters"]) or "none"
        lines.append(
            f"autoscale ({scale['fleet']}): "
            f"{scale['current_replicas']} -> {scale['desired_replicas']} replicas; "
            f"{scale['reason']}; hot adapters: {hot}"
        )
    else:
        lines.append("autoscale: no signal yet")
    lines.append("")
    lines.append(f"alerts ({len(picture['alerts'])} most recent):" if picture["alerts"] else "alerts: none")
    for a in picture["alerts"]:
        lines.append(f"  {a['at']} {a['severity']:<8} {a['kind']:<9} {a['message']}")
    return "\n".join(lines)
