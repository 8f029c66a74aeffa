"""Bodies of the console's admin API (/console/api on the public listener, behind the service token).

The fleet snapshot is what GET /console/api/fleet answers and what /console/api/fleet/stream pushes once a
second as `event: fleet`: each replica's last replica.state with its age and its phase, the last adapter.stats
window of each adapter those replicas hold, and the latest alerts. The registry snapshot is the registry's
tenants, adapters and aliases with each tenant's serving figures over the last stats windows.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from schemas.api import AdapterView, AliasView
from schemas.events import ReplicaStateBody
from schemas.ids import AdapterId, TenantId

# A replica's phase as the console shows it: its replica.state status, `merged` for a merged replica that
# is ready, and `stale` for one whose last state is older than the gateway's staleness limit.
ReplicaPhase = Literal["starting", "warming", "ready", "draining", "merged", "stale"]


class FleetReplica(ReplicaStateBody):
    phase: ReplicaPhase
    age_s: float = Field(ge=0)  # since the replica sent its last state
    # of the last minute's requests this gateway routed there, the share served from a GPU slot
    gpu_hit_rate: float | None = None


class AdapterWindow(BaseModel):
    """One adapter's last closed stats window (adapter.stats)."""

    adapter_id: AdapterId
    window_start: datetime
    requests: int
    tokens_per_s: float
    gpu_hit_rate: float
    p50_ttft_s: float | None = None
    p95_ttft_s: float | None = None


class AlertView(BaseModel):
    occurred_at: datetime
    subject: str
    kind: str
    severity: str
    message: str
    value: float
    threshold: float


class FleetSnapshot(BaseModel):
    at: datetime
    replicas: list[FleetReplica]
    adapter_stats: list[AdapterWindow]
    gpu_hit_rate: float | None  # request-weighted over adapter_stats; None before any request
    alerts: list[AlertView]  # newest first


class TenantView(BaseModel):
    tenant_id: TenantId
    display_name: str
    requests_per_s: float
    tokens_per_min: int


class TenantStats(BaseModel):
    """A tenant's serving figures over the registry snapshot's window (the stats stream's tenant_stats)."""

    tenant_id: TenantId
    requests: int
    tokens: int
    p50_ttft_s: float | None
    p95_ttft_s: float | None
    tokens_per_s: float
    usd_per_million_tokens: float | None


class RegistrySnapshot(BaseModel):
    window_s: float
    tenants: list[TenantView]
    adapters: list[AdapterView]
    aliases: list[AliasView]
    tenant_stats: list[TenantStats]


class ReportLink(BaseModel):
    name: str
    title: str
    url: str
    modified: datetime


class ReportList(BaseModel):
    data: list[ReportLink]
