"""The placement worker's settings (env prefix LORAFLEET_PLACEMENT_), read once at the entry point."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from lorafleet.config import PlatformSettings
from placement_worker.merge_policy import MergePolicy
from placement_worker.planner import Policy
from schemas import principals


class PlacementSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LORAFLEET_PLACEMENT_", extra="ignore")

    group_id: str = "placement-worker"  # its Kafka consumer group
    default_owners: int = Field(default=2, ge=1)  # owners per adapter (rendezvous) before traffic raises it
    # Output tokens/s one replica serves (the sizing in docs/architecture.md: 32 rows at 50 ms a step); owners
    # grow past it.
    replica_capacity_tokens_per_s: float = Field(default=640.0, gt=0)
    # An adapter with at least this much traffic (its latest window) may be asked into GPU slots: on as many
    # owners as its traffic needs (one per replica capacity), hottest first, within the share below. 10 tok/s
    # is a few requests a minute; 1 (one request in a 60 s window) cost hit rate in `lorafleet simulate`.
    gpu_tokens_per_s: float = Field(default=Policy.gpu_tokens_per_s, ge=0)
    # The most of a replica's GPU slots (as its replica.state reports them) its GPU placements take; the
    # rest are its LRU's.
    gpu_slot_fraction: float = Field(default=Policy.gpu_slot_fraction, ge=0, le=1)
    # Hysteresis of the owner count: an adapter gives up an owner once the remaining ones would each run at
    # most this share of replica_capacity_tokens_per_s (it gains one as soon as its traffic needs it).
    shrink_utilization: float = Field(default=Policy.shrink_utilization, gt=0, le=1)
    # A replica whose last replica.state is older than this has left the fleet.
    membership_ttl_s: float = Field(default=10.0, gt=0)
    # Unless more than this share of the members (and at least two) went silent together (quiet for over half
    # the TTL when one passes it): that looks like a stall on the way to the worker, so they stay members for
    # up to silence_hold_s before the fleet is replanned without them (placement_worker/membership.py).
    silence_share: float = Field(default=0.34, gt=0, le=1)
    silence_hold_s: float = Field(default=30.0, ge=0)
    # Traffic windows older than this no longer raise the owner count: an adapter whose traffic stopped
    # falls back to default_owners (and out of GPU shares) once its last window is this old.
    demand_ttl_s: float = Field(default=300.0, gt=0)
    # How often the worker replans the adapters whose placement its traffic shaped (more owners than the
    # default, or a GPU share), so that demand which aged out of demand_ttl_s releases them.
    decay_check_s: float = Field(default=10.0, gt=0)
    # A spill copy (an adapter a replica holds without owning it) unused this long is unloaded there.
    spill_idle_s: float = Field(default=600.0, gt=0)
    # Waiting for the plan lock (another instance replanning) has its own bound, longer than one statement's
    # timeout: the holder's replan is several statements.
    plan_lock_wait_s: float = Field(default=60.0, gt=0)
    # Merged replicas: an adapter version whose own window traffic is over merge_tokens_per_s (default:
    # replica_capacity_tokens_per_s, it fills a replica) for merge_windows consecutive windows gets a
    # dedicated merged replica; under demote_tokens_per_s (default: half the merge threshold) for
    # demote_windows consecutive windows it loses it. merge_check_s: how often silent adapters are looked at.
    merge_tokens_per_s: float | None = Field(default=None, gt=0)
    demote_tokens_per_s: float | None = Field(default=None, ge=0)
    merge_windows: int = Field(default=3, ge=1)
    demote_windows: int = Field(default=3, ge=1)
    merge_check_s: float = Field(default=1.0, gt=0)
    # Only replicas whose id starts with this belong to the fleet this worker places for.
    replica_id_prefix: str = ""
    tick_s: float = Field(default=1.0, gt=0)  # how often it replans what changed and checks membership
    metrics_port: int = Field(default=9462, ge=0, description="Prometheus /metrics; 0 disables it")
    metrics_host: str = "127.0.0.1"  # 0.0.0.0 in a container

    def merge_policy(self) -> MergePolicy:
        promote = self.merge_tokens_per_s or self.replica_capacity_tokens_per_s
        demote = promote / 2 if self.demote_tokens_per_s is None else min(self.demote_tokens_per_s, promote)
        return MergePolicy(promote, demote, self.merge_windows, self.demote_windows)


class PlacementConfig:
    """Platform addresses plus the placement settings: the one configuration object of the process."""

    def __init__(self, platform: PlatformSettings, placement: PlacementSettings) -> None:
        self.platform = platform
        self.placement = placement

    @classmethod
    def from_env(cls) -> PlacementConfig:
        """The placement worker's process settings, authenticating to Kafka as its own principal."""
        return cls(PlatformSettings().as_service(principals.PLACEMENT_WORKER), PlacementSettings())
