"""Platform settings shared by every process: where the data folder and the backing services are."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas import principals

DEV_S3_ACCESS_KEY = "lorafleet"  # the local object store's keys (`lorafleet services up`)
DEV_S3_SECRET_KEY = "lorafleet-secret"


class PlatformSettings(BaseSettings):
    """Addresses of Kafka, PostgreSQL and the object store; every one can be overridden by env."""

    model_config = SettingsConfigDict(env_prefix="LORAFLEET_", extra="ignore")

    data_dir: Path = Field(default=Path(".data"), description="git-ignored folder for data, logs and pids")
    # "dev" allows the well-known default tokens (lorafleet/profile.py); otherwise a process refuses them.
    profile: Literal["dev", "production"] = "production"

    kafka_bootstrap: str = "127.0.0.1:19092"  # host:port of the brokers, comma-separated
    kafka_controller_port: int = 19093  # the local broker's KRaft controller (`lorafleet services up`)
    # Every client authenticates with SASL/SCRAM as its own principal (schemas/principals.py). Unset, the
    # username is the service's own principal (admin for tools and tests), and in the dev profile the
    # password is that principal's well-known dev password (lorafleet/profile.py), refused elsewhere.
    kafka_security_protocol: Literal["SASL_PLAINTEXT", "SASL_SSL", "PLAINTEXT"] = "SASL_PLAINTEXT"
    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256"] = "SCRAM-SHA-512"
    kafka_username: str | None = None
    kafka_password: SecretStr | None = None
    # Topics are created with this many copies, and a write (acks=all) needs this many in sync: 1 and 1 on
    # the local one-broker stack, 3 and 2 in infra/k8s, so that one broker lost loses no event. An existing
    # topic keeps its own (changing it is a partition reassignment, done with Kafka's tools).
    kafka_replication_factor: int = Field(default=1, ge=1)
    kafka_min_insync_replicas: int = Field(default=1, ge=1)

    database_url: str = "postgresql://lorafleet:lorafleet@127.0.0.1:15432/lorafleet"  # PostgreSQL
    postgres_port: int = 15432  # the local cluster's port (`lorafleet services up`)
    # Time bounds on every pool (lorafleet.db.pool): a database outage becomes an error, never a hang.
    db_connect_timeout_s: float = Field(default=3.0, gt=0, description="opening one connection")
    db_acquire_timeout_s: float = Field(default=5.0, gt=0, description="waiting for a pooled connection")
    db_command_timeout_s: float = Field(default=10.0, gt=0, description="one query, on the client")
    db_statement_timeout_ms: int = Field(default=10_000, ge=0, description="server statement_timeout")
    # A read with a cached answer to fall back on (the public gateway's keys and aliases) gives up after
    # db_read_deadline_s; after a failed one the caches answer alone for db_read_pause_s.
    db_read_deadline_s: float = Field(default=2.0, gt=0)
    db_read_pause_s: float = Field(default=1.0, ge=0)
    # A worker whose Kafka or PostgreSQL fails starts over after an exponential backoff between these.
    retry_initial_s: float = Field(default=0.5, gt=0)
    retry_max_s: float = Field(default=10.0, gt=0)
    # `lorafleet services` restarts a dead app process after a backoff that doubles from restart_initial_s
    # up to restart_max_s while it keeps dying; one that ran restart_reset_after_s starts the backoff over.
    restart_initial_s: float = Field(default=1.0, gt=0)
    restart_max_s: float = Field(default=30.0, gt=0)
    restart_reset_after_s: float = Field(default=60.0, gt=0)

    # Redis holds what the public gateways share live: rate-limit buckets and idempotent replays (tenants'
    # answers). It requires a password: the URL's (redis://:PASSWORD@host:port/db); the default is the
    # local server's dev one, refused outside the dev profile.
    redis_url: str = "redis://:dev-redis-password@127.0.0.1:16379/0"  # lorafleet.profile.DEV_REDIS_PASSWORD
    redis_port: int = 16379  # the local server's port (`lorafleet services up`)

    s3_endpoint: str = "http://127.0.0.1:19000"  # the S3-compatible store that holds adapter files
    # the object store's keys; the defaults are the local store's dev ones (lorafleet.profile refuses them
    # outside the dev profile)
    s3_access_key: str = DEV_S3_ACCESS_KEY
    s3_secret_key: str = DEV_S3_SECRET_KEY
    s3_region: str = "us-east-1"  # the region the S3 client signs for
    s3_bucket: str = "lorafleet-adapters"  # where `lorafleet adapters register` uploads adapter files
    # Adapter downloads (the replica's cache, the registry validator): a total deadline per download, a
    # read timeout per socket read (a stalled stream), and at most s3_fetch_attempts tries with jittered
    # backoff between them (lorafleet.fetch_retry).
    s3_fetch_deadline_s: float = Field(default=60.0, gt=0)
    s3_fetch_attempts: int = Field(default=4, ge=1)
    s3_read_timeout_s: float = Field(default=10.0, gt=0)
    s3_connect_timeout_s: float = Field(default=5.0, gt=0)
    s3_retry_initial_s: float = Field(default=0.2, gt=0)
    s3_retry_max_s: float = Field(default=2.0, gt=0)

    prometheus_port: int = 19090  # the local stack's Prometheus (`lorafleet services up`)

    # Every HTTP listener (the gateways, the replicas): a request's headers must arrive within this long of
    # the connection opening (or of the first byte after the previous response), and the listener holds this
    # many connections in all; on the public listener one client address, unless it is a trusted proxy
    # (FORWARDED_ALLOW_IPS), holds at most this many (lorafleet/http_limits.py).
    http_header_timeout_s: float = Field(default=10.0, gt=0)
    http_max_connections_per_client: int = Field(default=256, ge=1)
    http_max_connections: int = Field(default=10_000, ge=1)

    # Object-store prefixes adapters may be registered from; file:// is the single-machine default.
    object_store_prefixes: list[str] = Field(default_factory=lambda: ["s3://lorafleet-adapters/"])

    @model_validator(mode="after")
    def _in_sync_within_the_copies(self) -> PlatformSettings:
        if self.kafka_min_insync_replicas > self.kafka_replication_factor:
            raise ValueError(
                "LORAFLEET_KAFKA_MIN_INSYNC_REPLICAS is more than LORAFLEET_KAFKA_REPLICATION_FACTOR: "
                "no write could ever succeed"
            )
        return self

    @property
    def data_path(self) -> Path:
        return self.data_dir.resolve()

    @property
    def kafka_principal(self) -> str:
        return self.kafka_username or principals.ADMIN

    def listener_options(self, public: bool = False) -> dict[str, Any]:
        """uvicorn.Config keyword arguments that apply the listener limits above; the cap per client address
        only on a public listener (an internal one's callers are the fleet's own gateways)."""
        from lorafleet.http_limits import ListenerLimits, uvicorn_options

        limits = ListenerLimits(
            header_timeout_s=self.http_header_timeout_s,
            max_connections_per_client=self.http_max_connections_per_client if public else None,
            max_connections=self.http_max_connections,
        )
        return uvicorn_options(limits)

    def as_service(self, principal: str) -> PlatformSettings:
        """These settings for a service: its own Kafka principal unless LORAFLEET_KAFKA_USERNAME names one."""
        return self if self.kafka_username else self.model_copy(update={"kafka_username": principal})


class DatabaseLoginSettings(BaseSettings):
    """Each process's database login, as the URL it is given (LORAFLEET_DB_LOGIN_<PROCESS>): `lorafleet db
    logins` and `services init` make each user a login of that process's role with that password."""

    model_config = SettingsConfigDict(env_prefix="LORAFLEET_DB_LOGIN_", extra="ignore")

    # each the LORAFLEET_DATABASE_URL that process is given: its user becomes a login of the process's role
    gateway: SecretStr | None = None
    public_gateway: SecretStr | None = None
    registry_validator: SecretStr | None = None
    placement_worker: SecretStr | None = None
    relay: SecretStr | None = None
    stats_stream: SecretStr | None = None
    replica: SecretStr | None = None
    autoscaler: SecretStr | None = None

    def logins(self) -> dict[str, str]:
        """process (schemas/principals.py DATABASE_ROLES key) -> its URL, for those given."""
        out = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is not None:
                out[name.replace("_", "-")] = value.get_secret_value()
        return out


@lru_cache(maxsize=1)
def get_settings() -> PlatformSettings:
    return PlatformSettings()


class RelaySettings(BaseSettings):
    """The outbox relay's knobs."""

    model_config = SettingsConfigDict(env_prefix="LORAFLEET_RELAY_", extra="ignore")

    batch_size: int = Field(default=500, ge=1, le=10000)  # outbox rows per publish batch
    poll_interval_s: float = Field(default=0.2, gt=0)  # how long an idle relay waits before polling again
    retention_s: float = Field(default=3600.0, ge=0, description="sent rows older than this are pruned")
    # Fault injection for tests only: "crash_after_publish" exits the process after Kafka acked a batch
    # and before the rows are marked sent.
    fault: str | None = None
    metrics_port: int = Field(default=9460, ge=0, description="Prometheus /metrics; 0 disables it")
    # Loopback on one machine; 0.0.0.0 in a container, so Prometheus in another one can scrape it.
    metrics_host: str = "127.0.0.1"
