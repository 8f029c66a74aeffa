"""The stats stream's settings (LORAFLEET_STATS_*), read once at the entry point and passed down."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


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

    app_id: str = "lorafleet-stats"  # the Faust app: its consumer group and internal topics
    store: str = "memory://"  # where Faust keeps its tables (the changelog topics restore them)
    data_dir: Path = Path(".data/stats-stream")  # Faust's local folder
    window_s: float = Field(default=60.0, gt=0)  # the tumbling window of adapter_stats and the signals
    grace_s: float = Field(default=10.0, ge=0, description="how late an event may be and still count")
    idle_close_s: float = Field(default=30.0, gt=0, description="with no events this long, close by clock")
    tick_s: float = Field(default=1.0, gt=0)  # how often a tick looks for windows that are due to close
    session_timeout_s: float = Field(default=10.0, ge=6.0, description="Kafka group session timeout")
    metrics_port: int = Field(default=9466, ge=0, description="Prometheus /metrics; 0 disables it")
    # /metrics carries per-tenant series: on loopback by default; on any other address only behind this
    # bearer token (a scraper in another pod or container presents it)
    metrics_host: str = "127.0.0.1"
    metrics_token: SecretStr | None = None
    log_level: str = "warn"  # Faust's log level
    fleet: str = "default"  # the fleet its autoscale.signals name (LORAFLEET_AUTOSCALE_FLEET)

    slo_ttft_s: float = 1.0  # per-tenant p95 TTFT target
    slo_min_requests: int = 5  # a window with fewer requests never alerts
    thrash_evictions_per_min: float = 30.0  # a replica evicting faster than this thrashes
    gpu_hour_usd: float = 2.5  # the price of a GPU-hour, for the cost per million tokens
    replica_capacity_tps: float = 640.0  # output tokens/s one replica serves
    queue_per_replica: float = 5.0  # queued requests per replica before a scale-up (KEDA's AverageValue)
    tokens_in_flight_per_replica: float = 16384.0  # tokens in flight per replica before a scale-up
    min_replicas: int = 1  # the desired replica count stays within these
    max_replicas: int = 32
    scale_down_windows: int = 5  # quiet windows before a scale-down
    max_scale_down_step: int = 1  # replicas removed per window at most
    replica_id_prefix: str = ""  # `replica-` under `make up`: another stack on the same Kafka is not ours

    @model_validator(mode="after")
    def _metrics_beyond_loopback_need_a_token(self) -> StatsStreamSettings:
        token = self.metrics_token.get_secret_value() if self.metrics_token is not None else ""
        if self.metrics_port and self.metrics_host not in LOOPBACK and not token:
            raise ValueError(
                f"/metrics on {self.metrics_host} serves per-tenant series: set LORAFLEET_STATS_METRICS_TOKEN"
            )
        return self

    def signals(self) -> SignalSettings:
        return SignalSettings(**{name: getattr(self, name) for name in SignalSettings.model_fields})
