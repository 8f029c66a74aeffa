"""The gateway's settings (env prefix LORAFLEET_GATEWAY_), read once at the entry point and passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from lorafleet.adapter_rules import caps
from lorafleet.config import PlatformSettings
from lorafleet.model.prepare import DEFAULT_MODEL_DIR
from lorafleet.profile import DEV_REGISTRY_READ_TOKEN, DEV_TOKEN


class GatewaySettings(BaseSettings):
    """Internal API listener, service token, the served base and the registry's limits."""

    model_config = SettingsConfigDict(env_prefix="LORAFLEET_GATEWAY_", extra="ignore")

    # The internal API's listener (`lorafleet gateway`): registry, aliases, the console's admin API.
    internal_host: str = "127.0.0.1"
    internal_port: int = 18081
    # Where CLIs reach the internal API; defaults to the local listener.
    internal_url: str | None = None
    # Callers of /internal/* (pipelines, deploy tooling, replicas) present this as a bearer token.
    # The default only suits a single-machine dev stack; set a real secret anywhere else.
    service_token: SecretStr = SecretStr(DEV_TOKEN)
    # Replicas present this to read a ready adapter's record (GET /internal/adapters/{id}) and nothing else:
    # it cannot register adapters, list the registry or move aliases.
    registry_read_token: SecretStr = SecretStr(DEV_REGISTRY_READ_TOKEN)

    # The served base: its hash (computed from served_model_dir when unset) and its config.json for shapes.
    served_model_dir: Path = DEFAULT_MODEL_DIR
    served_base_model_hash: str | None = None
    max_rank: int = Field(default=64, ge=1)  # the fleet's rank cap: a registration over it is refused

    # Registry validator download caps: unset means the shared cap (lorafleet.adapter_rules.caps), a value
    # may only lower it, so the replica serves whatever the registry accepts.
    max_adapter_bytes: int | None = Field(default=None, ge=1)
    max_config_bytes: int | None = Field(default=None, ge=1)
    validator_group: str = "registry-validator"  # the registry validator's Kafka consumer group
    validator_metrics_port: int = Field(default=9461, ge=0, description="validator /metrics; 0 disables")
    validator_metrics_host: str = "127.0.0.1"  # 0.0.0.0 in a container
    # The registry validator's reconciler. A pending version whose check the object store failed is
    # checked again after a backoff doubling from recheck_initial_s up to recheck_max_s; one that no check
    # reached within reconcile_after_s of its registration (its event lost) has its event published again,
    # and again every reconcile_after_s while it stays pending. The reconciler looks every
    # reconcile_interval_s.
    registry_recheck_initial_s: float = Field(default=2.0, gt=0)
    registry_recheck_max_s: float = Field(default=300.0, gt=0)
    registry_reconcile_after_s: float = Field(default=60.0, gt=0)
    registry_reconcile_interval_s: float = Field(default=2.0, gt=0)

    # The public OpenAI-compatible API (a listener of its own; tenants never see /internal).
    public_host: str = "127.0.0.1"
    public_port: int = 18080
    public_url: str | None = None  # where tools reach the public API; defaults to the local listener
    max_body_bytes: int = Field(default=1 << 20, ge=1024)  # a larger request body gets 413
    # the whole request body must arrive within this long of its headers, or 408 request_timeout
    body_read_timeout_s: float = Field(default=30.0, gt=0)
    default_max_tokens: int = Field(default=256, ge=1)  # a chat request's budget when it names none
    key_cache_ttl_s: float = Field(default=5.0, ge=0)  # how long an API key's lookup is reused
    alias_cache_ttl_s: float = Field(default=10.0, ge=0)  # how long a resolved alias is reused
    # every this long all aliases are read in one statement (under the TTL; 0: each only as requests name it),
    # at most the alias_cache_bulk_max most recently moved
    alias_cache_refresh_s: float = Field(default=5.0, ge=0)
    alias_cache_bulk_max: int = Field(default=200_000, ge=1)
    # Router (gateway/public/routing/policy.py): cost (the default) | affinity | random (the A/B
    # baseline); owners per adapter; an owner that reports no batch is overloaded past this many tokens
    # (one that does: spill_wait_s below).
    routing_mode: Literal["cost", "affinity", "random"] = "cost"
    owners_k: int = Field(default=2, ge=1)
    spill_threshold_tokens: int = Field(default=32_000, ge=0)
    # Prefer an owner that has the adapter in a GPU slot unless it is this many tokens busier.
    gpu_preference_tokens: int = Field(default=8_000, ge=0)
    # Cost routing: tokens in flight a replica finishes per second, and a GPU load's price in seconds.
    drain_tokens_per_s: float = Field(default=2_560.0, gt=0)
    slot_cost_s: float = Field(default=3.0, ge=0)
    # A replica that reports its batch is an overloaded owner when a new request would wait longer than
    # spill_wait_s to start: the prompts ahead of it at prefill_tokens_per_s, and row_wait_s for each
    # request short of a free row.
    spill_wait_s: float = Field(default=1.0, ge=0)
    prefill_tokens_per_s: float = Field(default=8_000.0, gt=0)
    row_wait_s: float = Field(default=0.4, ge=0)
    replica_stale_s: float = Field(default=3.0, gt=0)  # a replica.state older than this is not routed to
    # Route only to replicas whose id starts with this (the placement worker's replica_id_prefix).
    replica_id_prefix: str = ""
    # The replicas' service token (their LORAFLEET_REPLICA_SERVICE_TOKEN).
    replica_service_token: SecretStr = SecretStr(DEV_TOKEN)
    replica_connect_timeout_s: float = Field(default=2.0, gt=0)  # opening a connection to a replica
    replica_read_timeout_s: float = Field(default=60.0, gt=0)  # one read from a replica (httpx)
    # Connections this gateway holds open to all replicas together; a request that finds every one in use
    # waits this long for one (under first_token_timeout_s), then gets 503 gateway_overloaded: the gateway is
    # loaded, no replica has failed, and none is marked so.
    replica_max_connections: int = Field(default=2000, ge=1)
    replica_pool_timeout_s: float = Field(default=1.0, gt=0)
    # A replica that sends no first token this long after the request went to it is given up on (and
    # marked failed): the next owner gets the request, and past the last the client gets 504.
    first_token_timeout_s: float = Field(default=10.0, gt=0)
    # A streaming replica silent this long is given up on: the stream ends with an upstream_timeout error.
    stall_timeout_s: float = Field(default=10.0, gt=0)
    # Bytes one SSE stream may hold for a client that is not reading them; past this the stream is cut.
    stream_buffer_bytes: int = Field(default=256 * 1024, ge=1024)
    # A client that takes no SSE message for this long has its stream cut as well.
    client_send_timeout_s: float = Field(default=30.0, gt=0)
    # SO_SNDBUF of the public listener's connections (gateway/public/listener.py); 0 leaves it to the kernel.
    socket_send_buffer_bytes: int = Field(default=0, ge=0)
    # Per-tenant metrics: served on this second listener behind the service token, never on the public
    # /metrics; 0 disables it. At most tenant_metrics_max tenants get series of their own, the rest "other".
    tenant_metrics_host: str = "127.0.0.1"
    tenant_metrics_port: int = Field(default=0, ge=0)
    tenant_metrics_max: int = Field(default=50, ge=1)
    # Rate limits: each tenant's buckets live in Redis (LORAFLEET_REDIS_URL), shared by every public gateway.
    # "local" keeps them in this process only (one gateway). While Redis does not answer, each gateway
    # admits limit / public_gateways on its own and tries Redis again after redis_retry_s.
    rate_limit_store: Literal["redis", "local"] = "redis"
    # Requests one tenant may have open at once (streams included, until they end), across the public
    # gateways: each admits ceil(this / public_gateways) of its own; past it, 429 concurrency_limit_exceeded.
    max_concurrent_requests_per_tenant: int = Field(default=256, ge=1)
    public_gateways: int = Field(default=1, ge=1)
    redis_timeout_s: float = Field(default=0.25, gt=0)
    redis_retry_s: float = Field(default=2.0, gt=0)
    # Failed authentications per source address (gateway/public/admission/auth_failures.py): past
    # auth_failure_limit within auth_failure_window_s, the address gets 429 too_many_auth_failures until
    # the window ends; 0 disables.
    # Counted in Redis like the rate limits, at ceil(limit / public_gateways) per gateway while it is down.
    auth_failure_limit: int = Field(default=20, ge=0)
    auth_failure_window_s: float = Field(default=60.0, gt=0)
    # Idempotency-Key (gateway/public/idempotency.py): a completed answer is replayed for
    # idempotency_ttl_s; a claim whose gateway never finished it is given back after idempotency_lock_s.
    idempotency_ttl_s: float = Field(default=86_400.0, gt=0)
    idempotency_lock_s: float = Field(default=600.0, gt=0)
    # requests.completed (gateway/public/usage_events.py): each event is committed to a local sqlite spool,
    # sent to Kafka from there and deleted once the broker acknowledged it. One file per gateway process (a
    # second process on the same file refuses to start); unset, <data_dir>/gateway/usage-<public_port>.sqlite.
    # At most usage_spool_max_events wait in it (`lorafleet bench spool-size` prints the disk they take);
    # past that the newest are dropped, logged and counted. On shutdown the gateway sends for up to
    # usage_drain_timeout_s and leaves the rest in the spool for its next start.
    usage_spool_path: Path | None = None
    usage_spool_max_events: int = Field(default=1_000_000, ge=1)
    usage_drain_timeout_s: float = Field(default=5.0, ge=0)
    # When set, the public gateway runs under cProfile (CPU time) and writes its stats here when it stops.
    profile_path: Path | None = None

    @field_validator("max_adapter_bytes", "max_config_bytes")
    @classmethod
    def _within_shared_cap(cls, value: int | None, info: ValidationInfo) -> int | None:
        cap = caps.MAX_WEIGHTS_BYTES if info.field_name == "max_adapter_bytes" else caps.MAX_CONFIG_BYTES
        if value is not None and value > cap:
            raise ValueError(f"{info.field_name} may only lower the shared cap of {cap} bytes")
        return value

    def weights_cap(self) -> int:
        """The byte cap on adapter_model.safetensors: the setting, else the shared cap."""
        return self.max_adapter_bytes or caps.MAX_WEIGHTS_BYTES

    def config_cap(self) -> int:
        """The byte cap on adapter_config.json: the setting, else the shared cap."""
        return self.max_config_bytes or caps.MAX_CONFIG_BYTES

    def internal_base_url(self) -> str:
        return self.internal_url or f"http://{self.internal_host}:{self.internal_port}"

    def public_base_url(self) -> str:
        return self.public_url or f"http://{self.public_host}:{self.public_port}"


class GatewayConfig:
    """One configuration object per process: platform addresses plus the gateway's own settings."""

    def __init__(self, platform: PlatformSettings, gateway: GatewaySettings) -> None:
        self.platform = platform
        self.gateway = gateway

    def usage_spool_path(self) -> Path:
        """The public gateway's requests.completed spool: the setting, else one per port in the data dir."""
        own = self.gateway.usage_spool_path
        return own or self.platform.data_path / "gateway" / f"usage-{self.gateway.public_port}.sqlite"

    @classmethod
    def from_env(cls, service: str | None = None) -> GatewayConfig:
        """From the environment; a service process passes its Kafka principal (schemas/principals.py)."""
        platform = PlatformSettings()
        return cls(platform.as_service(service) if service else platform, GatewaySettings())
