"""The dev profile rule, pure: which tokens count as the dev token, and when they stop a process."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from lorafleet.config import DEV_S3_ACCESS_KEY, DEV_S3_SECRET_KEY, PlatformSettings
from lorafleet.profile import (
    DEV_TOKEN,
    DevTokenRefused,
    dev_database_password,
    dev_kafka_password,
    dev_tokens,
    kafka_password,
    object_store_keys,
    refuse_dev_tokens,
    token_digest,
    url_password,
)
from schemas import principals

REAL_KAFKA = SecretStr("a-real-kafka-secret")
REAL_DATABASE = "postgresql://lf_relay:a-real-db-secret@db:5432/lorafleet"
KAFKA = "kafka.lorafleet.svc:9092"


def test_the_dev_token_and_an_empty_one_are_found_by_setting_name() -> None:
    tokens = {"B": SecretStr(DEV_TOKEN), "A": "", "C": "a-real-secret"}
    assert dev_tokens(tokens) == ["A", "B"]


def test_a_digest_of_a_dev_token_is_as_well_known_as_the_token() -> None:
    assert dev_tokens({"D": token_digest(DEV_TOKEN), "E": token_digest("a-real-secret")}) == ["D"]


def test_the_local_object_stores_keys_are_dev_keys_and_real_ones_are_not() -> None:
    local = PlatformSettings(s3_access_key=DEV_S3_ACCESS_KEY, s3_secret_key=DEV_S3_SECRET_KEY)
    assert dev_tokens(object_store_keys(local)) == ["LORAFLEET_S3_ACCESS_KEY", "LORAFLEET_S3_SECRET_KEY"]
    real = PlatformSettings(s3_access_key="AKIAEXAMPLE", s3_secret_key="a-real-s3-secret")
    assert dev_tokens(object_store_keys(real)) == []


def test_outside_the_dev_profile_a_dev_token_stops_the_process() -> None:
    production = PlatformSettings(
        profile="production", kafka_bootstrap=KAFKA, kafka_password=REAL_KAFKA, database_url=REAL_DATABASE
    )
    with pytest.raises(DevTokenRefused, match="X_TOKEN"):
        refuse_dev_tokens(production, "gateway", {"X_TOKEN": DEV_TOKEN})
    refuse_dev_tokens(production, "gateway", {"X_TOKEN": "s3cret"})
    refuse_dev_tokens(PlatformSettings(profile="dev"), "gateway", {"X_TOKEN": DEV_TOKEN})


@pytest.mark.parametrize("principal", principals.ALL)
def test_outside_the_dev_profile_a_dev_or_missing_kafka_password_stops_the_process(principal: str) -> None:
    for password in (SecretStr(dev_kafka_password(principal)), SecretStr(dev_kafka_password("admin")), None):
        settings = PlatformSettings(
            profile="production",
            kafka_bootstrap=KAFKA,
            kafka_username=principal,
            kafka_password=password,
            database_url=REAL_DATABASE,
        )
        with pytest.raises(DevTokenRefused, match="LORAFLEET_KAFKA_PASSWORD"):
            refuse_dev_tokens(settings, "relay", {})
    plaintext = PlatformSettings(
        profile="production",
        kafka_bootstrap=KAFKA,
        kafka_security_protocol="PLAINTEXT",
        database_url=REAL_DATABASE,
    )
    refuse_dev_tokens(plaintext, "relay", {})  # a broker without authentication: no password to check


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://lorafleet:lorafleet@db:5432/lorafleet",  # the local owner's
        f"postgresql://lf_relay:{dev_database_password(principals.RELAY)}@db:5432/lorafleet",
        f"postgresql://lf_relay:{dev_database_password(principals.REPLICA)}@db:5432/lorafleet",
        "postgresql://lf_relay@db:5432/lorafleet",  # none
    ],
)
def test_outside_the_dev_profile_a_dev_or_missing_database_password_stops_the_process(url: str) -> None:
    settings = PlatformSettings(
        profile="production", kafka_bootstrap=KAFKA, kafka_password=REAL_KAFKA, database_url=url
    )
    with pytest.raises(DevTokenRefused, match="LORAFLEET_DATABASE_URL"):
        refuse_dev_tokens(settings, "relay", {})


def test_a_url_among_the_tokens_is_judged_by_its_password() -> None:
    production = PlatformSettings(
        profile="production", kafka_bootstrap=KAFKA, kafka_password=REAL_KAFKA, database_url=REAL_DATABASE
    )
    for dev in ("redis://:dev-redis-password@r:6379/0", "redis://r:6379/0"):
        with pytest.raises(DevTokenRefused, match="LORAFLEET_REDIS_URL"):
            refuse_dev_tokens(production, "public-gateway", {"LORAFLEET_REDIS_URL": url_password(dev)})
    refuse_dev_tokens(
        production, "public-gateway", {"LORAFLEET_REDIS_URL": url_password("redis://:s3cret@r/0")}
    )


def test_in_the_dev_profile_an_unset_kafka_password_is_the_principals_dev_password() -> None:
    dev = PlatformSettings(profile="dev").as_service(principals.RELAY)
    assert dev.kafka_principal == principals.RELAY
    assert kafka_password(dev) == dev_kafka_password(principals.RELAY)
    assert kafka_password(PlatformSettings(profile="production").as_service(principals.RELAY)) == ""
    assert kafka_password(PlatformSettings(profile="dev", kafka_password=REAL_KAFKA)) == "a-real-kafka-secret"


def test_a_service_keeps_a_username_the_environment_names() -> None:
    named = PlatformSettings(kafka_username="prod-relay").as_service(principals.RELAY)
    assert named.kafka_principal == "prod-relay"
    assert PlatformSettings().kafka_principal == principals.ADMIN  # tools and tests


def test_outside_the_dev_profile_a_backing_services_local_default_address_stops_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LORAFLEET_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("LORAFLEET_S3_ENDPOINT", raising=False)
    real = {"kafka_password": REAL_KAFKA, "database_url": REAL_DATABASE}
    keys = {"s3_access_key": "AKIAEXAMPLE", "s3_secret_key": "a-real-s3-secret"}
    unset = PlatformSettings(profile="production", **real, **keys)
    with pytest.raises(DevTokenRefused, match="LORAFLEET_KAFKA_BOOTSTRAP unset: each would") as refused:
        refuse_dev_tokens(unset, "relay", {})
    assert "S3" not in str(refused.value)  # the relay uses no object store
    with pytest.raises(DevTokenRefused, match="LORAFLEET_KAFKA_BOOTSTRAP, LORAFLEET_S3_ENDPOINT unset"):
        refuse_dev_tokens(unset, "registry-validator", object_store_keys(unset))
    placed = PlatformSettings(
        profile="production", kafka_bootstrap=KAFKA, s3_endpoint="http://objectstore:9000", **real, **keys
    )
    refuse_dev_tokens(placed, "registry-validator", object_store_keys(placed))
    refuse_dev_tokens(PlatformSettings(profile="dev"), "relay", {})  # the dev stack's defaults are its own
