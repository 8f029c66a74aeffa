"""Settings of `lorafleet autoscale --local` (env prefix LORAFLEET_AUTOSCALE_)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

from lorafleet.autoscale.decide import Limits


class AutoscaleSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LORAFLEET_AUTOSCALE_", extra="ignore")

    fleet: str = "default"
    min_replicas: int = 2
    max_replicas: int = 4
    unmanaged_replicas: int = 2  # replica-0 and replica-1 of `lorafleet services up`
    first_port: int = 18100
    group_id: str = "lorafleet-autoscale-local"

    def limits(self) -> Limits:
        return Limits(self.min_replicas, self.max_replicas, self.unmanaged_replicas, self.first_port)
