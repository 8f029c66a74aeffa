"""Settings of `lorafleet autoscale --local` (env prefix LORAFLEET_AUTOSCALE_)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from lorafleet.profile import DEV_TOKEN
from ops.autoscale.decide import Limits
from ops.autoscale.merged_decide import MergedLimits


class AutoscaleSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LORAFLEET_AUTOSCALE_", extra="ignore")

    fleet: str = "default"  # the stats stream's LORAFLEET_STATS_FLEET
    # The desired count from the signal is clamped to these (the hysteresis is in the signal).
    min_replicas: int = Field(default=2, ge=0)
    max_replicas: int = Field(default=4, ge=1)
    unmanaged_replicas: int = Field(default=2, ge=0)  # replica-0 and replica-1 of `lorafleet services up`
    replica_id_prefix: str = "replica-"  # our replicas are <prefix><index>, like the stack's
    first_port: int = 18100  # replica <index> listens on first_port + index
    host: str = "127.0.0.1"  # the address its replicas listen on
    cooldown_s: float = Field(default=60.0, ge=0, description="after an action completes, before the next")
    start_timeout_s: float = Field(
        default=300.0, gt=0, description="a new replica not ready by then is stopped"
    )
    drain_deadline_s: float = Field(default=30.0, gt=0, description="sent with POST /internal/drain")
    drain_grace_s: float = Field(default=10.0, ge=0, description="past the drain deadline, then SIGKILL")
    signal_max_age_s: float = Field(default=180.0, gt=0, description="older signals are not acted on")
    tick_s: float = Field(default=1.0, gt=0)  # how often it looks at the newest signal and its replicas
    replica_service_token: SecretStr = SecretStr(DEV_TOKEN)  # the replicas' service token
    # Merged replicas (merged.targets from the placement worker): ids <replica_id_prefix>merged-<index>,
    # ports merged_first_port + index, at most merged_max_replicas of them.
    merged_enabled: bool = True
    merged_max_replicas: int = Field(default=2, ge=0)
    merged_first_port: int = 18300

    def merged_replica_id_prefix(self) -> str:
        return f"{self.replica_id_prefix}merged-"

    def merged_limits(self) -> MergedLimits:
        return MergedLimits(self.merged_max_replicas, self.start_timeout_s, self.drain_grace_s)

    def limits(self) -> Limits:
        return Limits(
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            unmanaged_replicas=self.unmanaged_replicas,
            cooldown_s=self.cooldown_s,
            start_timeout_s=self.start_timeout_s,
            drain_grace_s=self.drain_grace_s,
        )
