"""A stack's environment from its spec: the base every process gets, the spec's own over it, then the
process's own over that."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.env import SMALL_REPLICA_ENV, process_env, stack_env, stack_platform
from harness.spec import ProcessSpec, StackSpec
from lorafleet.config import PlatformSettings

PLATFORM = PlatformSettings(
    kafka_bootstrap="127.0.0.1:9",
    database_url="postgresql://u:p@127.0.0.1:5/admin?sslmode=disable",
    s3_endpoint="http://127.0.0.1:7",
    s3_access_key="ak",
    s3_secret_key="sk",
)
PLATFORM_ENV = {
    "LORAFLEET_KAFKA_BOOTSTRAP": "127.0.0.1:9",
    "LORAFLEET_S3_ENDPOINT": "http://127.0.0.1:7",
    "LORAFLEET_S3_ACCESS_KEY": "ak",
    "LORAFLEET_S3_SECRET_KEY": "sk",
    "LORAFLEET_PROFILE": "dev",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    **SMALL_REPLICA_ENV,
}


@pytest.fixture(autouse=True)
def _no_sizes_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replica sizes are the stack's unless the environment sets them (tests/conftest.py sets some)."""
    for name in SMALL_REPLICA_ENV:
        monkeypatch.delenv(name, raising=False)


def test_a_full_spec_gives_its_database_prefix_token_fast_states_and_data_folder() -> None:
    spec = StackSpec(
        database="gw_abc",
        prefix="gwt1-",
        replica_token="tok",
        fast_state=True,
        data_dir=Path("/srv/stack"),
        env={"LORAFLEET_REPLICA_MAX_NUM_SEQS": "8"},
    )
    assert stack_env(spec, PLATFORM) == {
        **PLATFORM_ENV,
        "LORAFLEET_DATABASE_URL": "postgresql://u:p@127.0.0.1:5/gw_abc?sslmode=disable",
        "LORAFLEET_DATA_DIR": "/srv/stack",
        "LORAFLEET_GATEWAY_REPLICA_ID_PREFIX": "gwt1-",
        "LORAFLEET_PLACEMENT_REPLICA_ID_PREFIX": "gwt1-",
        "LORAFLEET_STATS_REPLICA_ID_PREFIX": "gwt1-",
        "LORAFLEET_REPLICA_SERVICE_TOKEN": "tok",
        "LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN": "tok",
        "LORAFLEET_AUTOSCALE_REPLICA_SERVICE_TOKEN": "tok",
        "LORAFLEET_REPLICA_STATE_INTERVAL_S": "0.5",
        "LORAFLEET_GATEWAY_REPLICA_STALE_S": "1.5",
        "LORAFLEET_REPLICA_MAX_NUM_SEQS": "8",
    }


def test_a_bare_spec_keeps_the_platforms_database_and_sets_no_prefix_token_or_intervals() -> None:
    env = stack_env(StackSpec(), PLATFORM)
    assert env == {**PLATFORM_ENV, "LORAFLEET_DATABASE_URL": PLATFORM.database_url}


def test_replica_sizes_set_in_the_environment_are_left_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORAFLEET_REPLICA_RAM_BUDGET_BYTES", "1")
    env = stack_env(StackSpec(), PLATFORM)
    assert "LORAFLEET_REPLICA_RAM_BUDGET_BYTES" not in env
    assert env["LORAFLEET_REPLICA_LORA_SLOTS"] == SMALL_REPLICA_ENV["LORAFLEET_REPLICA_LORA_SLOTS"]


def test_the_specs_env_wins_over_the_base_and_the_processs_over_both() -> None:
    spec = StackSpec(prefix="a-", env={"LORAFLEET_GATEWAY_REPLICA_ID_PREFIX": "b-", "OMP_NUM_THREADS": "2"})
    shared = stack_env(spec, PLATFORM)
    assert shared["LORAFLEET_GATEWAY_REPLICA_ID_PREFIX"] == "b-" and shared["OMP_NUM_THREADS"] == "2"
    assert shared["LORAFLEET_STATS_REPLICA_ID_PREFIX"] == "a-"
    gateway = ProcessSpec("public-gateway", ("public-gateway",), 8, env={"OMP_NUM_THREADS": "3"})
    assert process_env(shared, gateway) == {**shared, "OMP_NUM_THREADS": "3"}


def test_the_stacks_platform_points_at_its_database_and_data_folder() -> None:
    own = stack_platform(StackSpec(database="mg_1", data_dir=Path("/d")), PLATFORM)
    assert own.database_url == "postgresql://u:p@127.0.0.1:5/mg_1?sslmode=disable"
    assert own.data_dir == Path("/d") and own.kafka_bootstrap == PLATFORM.kafka_bootstrap
    assert stack_platform(StackSpec(), PLATFORM) == PLATFORM


def test_a_process_runs_the_cli_after_its_wrapper_and_logs_under_its_name() -> None:
    spec = ProcessSpec("replica-0", ("replica", "serve"), 9000, wrapper=("taskset", "-c", "1"))
    assert spec.argv("py") == ["taskset", "-c", "1", "py", "-m", "lorafleet.cli", "replica", "serve"]
    assert spec.url == "http://127.0.0.1:9000" and spec.log_name() == "replica-0.log"
    assert (
        ProcessSpec("autoscaler", ("autoscale",), log="autoscaler-first").log_name() == "autoscaler-first.log"
    )
