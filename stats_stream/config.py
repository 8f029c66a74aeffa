"""The stats stream's settings (LORAFLEET_STATS_*), read once at the entry point and passed down."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class SignalSettings(BaseModel):
    """The thresholds and prices the pure signal functions need; a plain value, no environment."""

    window_s: float = Field(default=60.0, gt=0)
    slo_ttft_s: float = Field(default=1.0, gt=0, description="per-tenant p95 TTFT target")
    slo_min_requests: int = Field(default=5, ge=1, description="fewer requests in a window never alert")
    thrash_evictions_per_min: float = Field(default=30.0, gt=0, description="per-replica thrashing line")
    gpu_hour_usd: float = Field(default=2.5, ge=0)
    replica_capacity_tps: float = Field(default=640.0, gt=0, description="output tokens/s one replica serves")
    queue_per_replica: float = Field(default=5.0, gt=0, description="KEDA AverageValue threshold, queue")
    tokens_in_flight_per_replica: float = Field(default=16384.0, gt=0, description="KEDA threshold, tokens")
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=32, ge=1)
    scale_down_windows: int = Field(default=5, ge=1, description="quiet windows before a scale-down")
    max_scale_down_step: int = Field(default=1, ge=1, description="replicas removed per window at most")
    replica_id_prefix: str = Field(default="", description="only the fleet's replicas count")


class StatsStreamSettings(BaseSettings):
    """Everything `lorafleet stats-stream` needs besides the platform addresses."""

    model_config = SettingsConfigDict(env_prefix="LORAFLEET_STATS_", extra="ignore")

    app_id: str = "lorafleet-stats"
    store: str = "memory://"
    data_dir: Path = Path(".data/stats-stream")
    window_s: float = Field(default=60.0, gt=0)
    grace_s: float = Field(default=10.0, ge=0, description="how late an event may be and still count")
    idle_close_s: float = Field(default=30.0, gt=0, description="with no events this long, close by clock")
    tick_s: float = Field(default=1.0, gt=0)
    session_timeout_s: float = Field(default=10.0, ge=6.0, description="Kafka group session timeout")
    metrics_port: int = Field(default=9466, ge=0, description="Prometheus /metrics; 0 disables it")
    log_level: str = "warn"
    fleet: str = "default"

    slo_ttft_s: float = 1.0
    slo_min_requests: int = 5
    thrash_evictions_per_min: float = 30.0
    gpu_hour_usd: float = 2.5
    replica_capacity_tps: float = 640.0
    queue_per_replica: float = 5.0
    tokens_in_flight_per_replica: float = 16384.0
    min_replicas: int = 1
    max_replicas: int = 32
    scale_down_windows: int = 5
    max_scale_down_step: int = 1
    replica_id_prefix: str = ""  # `replica-` under `make up`: another stack on the same Kafka is not ours

    def signals(self) -> SignalSettings:
        return SignalSettings(**{name: getattr(self, name) for name in SignalSettings.model_fields})
