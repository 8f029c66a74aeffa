"""The environment every process of a private stack gets: the dev profile, the platform's addresses with
the stack's own database, its replica id prefix and token, single-threaded math, an offline hub and the
replica sizes the tests and benchmarks were written for."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from harness.databases import database_url
from harness.spec import ProcessSpec, StackSpec
from lorafleet.config import PlatformSettings
from lorafleet.profile import DEV_PROFILE_ENV
from ops.stack.env import FLEET_ENV

# Several stacks share the machine's cores, and a private stack never downloads a model.
QUIET_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}

# The replica's defaults are the production profile (250 rank-16 slots and more: gigabytes of slot stacks for
# even a small base). A private stack's replicas, and the suite's in-process ones (tests/conftest.py), get
# these smaller sizes unless the environment or the stack's spec sets others.
SMALL_LORA_SLOTS = {8: 16, 16: 16, 32: 8, 64: 4}
SMALL_REPLICA_ENV = {
    "LORAFLEET_REPLICA_LORA_SLOTS": json.dumps(SMALL_LORA_SLOTS),
    "LORAFLEET_REPLICA_RAM_BUDGET_BYTES": str(4 << 30),
    "LORAFLEET_REPLICA_DISK_BUDGET_BYTES": str(16 << 30),
    "LORAFLEET_REPLICA_DTYPE": "float32",
}

# A state every half second, stale after three missed: a replica's arrival or death shows within seconds.
FAST_STATE_ENV = {"LORAFLEET_REPLICA_STATE_INTERVAL_S": "0.5", "LORAFLEET_GATEWAY_REPLICA_STALE_S": "1.5"}

# The replica's own token, and the one each of its callers sends.
REPLICA_TOKEN_SETTINGS = (
    "LORAFLEET_REPLICA_SERVICE_TOKEN",
    "LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN",
    "LORAFLEET_AUTOSCALE_REPLICA_SERVICE_TOKEN",
)


def stack_platform(spec: StackSpec, platform: PlatformSettings) -> PlatformSettings:
    """platform with the stack's database (and data folder, when it has one)."""
    update: dict[str, object] = {}
    if spec.database is not None:
        update["database_url"] = database_url(platform.database_url, spec.database)
    if spec.data_dir is not None:
        update["data_dir"] = spec.data_dir
    return platform.model_copy(update=update)


def platform_env(platform: PlatformSettings) -> dict[str, str]:
    """Where Kafka, PostgreSQL and the object store are, as LORAFLEET_* variables."""
    return {
        "LORAFLEET_KAFKA_BOOTSTRAP": platform.kafka_bootstrap,
        "LORAFLEET_DATABASE_URL": platform.database_url,
        "LORAFLEET_S3_ENDPOINT": platform.s3_endpoint,
        "LORAFLEET_S3_ACCESS_KEY": platform.s3_access_key,
        "LORAFLEET_S3_SECRET_KEY": platform.s3_secret_key,
    }


def prefix_env(prefix: str) -> dict[str, str]:
    """The router, the placement worker and the stats stream count only replicas whose id starts so."""
    return {name: prefix for name in FLEET_ENV}


def stack_env(spec: StackSpec, platform: PlatformSettings) -> dict[str, str]:
    """What every process of the stack gets over the inherited environment: the base, then spec.env."""
    own = stack_platform(spec, platform)
    sizes = {k: v for k, v in SMALL_REPLICA_ENV.items() if k not in os.environ}
    env = {**sizes, **DEV_PROFILE_ENV, **platform_env(own), **QUIET_ENV}
    if spec.data_dir is not None:
        env["LORAFLEET_DATA_DIR"] = str(spec.data_dir)
    if spec.prefix:
        env |= prefix_env(spec.prefix)
    if spec.replica_token is not None:
        env |= dict.fromkeys(REPLICA_TOKEN_SETTINGS, spec.replica_token)
    if spec.fast_state:
        env |= FAST_STATE_ENV
    return {**env, **spec.env}


def process_env(shared: Mapping[str, str], process: ProcessSpec) -> dict[str, str]:
    """One process's environment: the stack's shared one, then its own."""
    return {**shared, **process.env}
