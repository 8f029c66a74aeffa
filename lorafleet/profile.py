"""The deployment profile, and the rule that a dev secret never guards anything outside the dev profile.

Every default token in the settings classes is DEV_TOKEN, and every Kafka principal's dev password is
dev_kafka_password(principal); anyone who has read this repository knows both. A process that holds a
credential (the token it checks or the one it sends, its Kafka password) refuses to start with one of
these well-known secrets, or with none, unless LORAFLEET_PROFILE=dev says this is a dev box. In the dev
profile an unset Kafka password is the principal's dev password. The local stack
(`lorafleet services up`) and the test suite set the dev profile explicitly; production manifests set
real secrets and leave the profile at its default.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from urllib.parse import urlparse

from pydantic import SecretStr

from lorafleet.config import DEV_S3_ACCESS_KEY, DEV_S3_SECRET_KEY, PlatformSettings
from schemas import principals

DEV_TOKEN = "dev-service-token"
# What replicas read adapter records with (LORAFLEET_GATEWAY_REGISTRY_READ_TOKEN), never the service token.
DEV_REGISTRY_READ_TOKEN = "dev-registry-read-token"
# What a scraper presents for per-tenant series (the stats stream's /metrics beyond loopback).
DEV_METRICS_TOKEN = "dev-metrics-token"
# The local Redis's password (LORAFLEET_REDIS_URL's default), and the local database owner's.
DEV_REDIS_PASSWORD = "dev-redis-password"
DEV_DATABASE_OWNER_PASSWORD = "lorafleet"
DATABASE_URL_SETTING = "LORAFLEET_DATABASE_URL"
REDIS_URL_SETTING = "LORAFLEET_REDIS_URL"
DEV_PROFILE_ENV = {"LORAFLEET_PROFILE": "dev"}
KAFKA_PASSWORD_SETTING = "LORAFLEET_KAFKA_PASSWORD"


def dev_kafka_password(principal: str) -> str:
    """The well-known dev password of a Kafka principal (the local broker's SCRAM users have these)."""
    return f"dev-kafka-{principal}"


def dev_database_password(process: str) -> str:
    """The well-known dev password of a process's PostgreSQL login on the local stack."""
    return f"dev-db-{process}"


WELL_KNOWN_SECRETS: frozenset[str] = frozenset(
    {
        DEV_TOKEN,
        DEV_REGISTRY_READ_TOKEN,
        DEV_METRICS_TOKEN,
        DEV_REDIS_PASSWORD,
        DEV_DATABASE_OWNER_PASSWORD,
        DEV_S3_ACCESS_KEY,
        DEV_S3_SECRET_KEY,
        *(dev_kafka_password(name) for name in principals.ALL),
        *(dev_database_password(name) for name in principals.DATABASE_LOGINS),
    }
)


def object_store_keys(platform: PlatformSettings) -> dict[str, str]:
    """The object store's keys, as credentials for refuse_dev_tokens (the local store's are well known)."""
    return {
        "LORAFLEET_S3_ACCESS_KEY": platform.s3_access_key,
        "LORAFLEET_S3_SECRET_KEY": platform.s3_secret_key,
    }


def url_password(url: str) -> str:
    """The password in a URL's user info ("" when it has none)."""
    return urlparse(url).password or ""


def kafka_password(platform: PlatformSettings) -> str:
    """The Kafka password to send: the setting, else (dev profile only) the principal's dev password."""
    secret = platform.kafka_password.get_secret_value() if platform.kafka_password else ""
    if secret or platform.profile != "dev":
        return secret
    return dev_kafka_password(platform.kafka_principal)


class DevTokenRefused(SystemExit):
    """A process would run with a well-known token outside the dev profile (exits with its message)."""


def token_digest(token: str) -> str:
    """The sha256 (hex) a listener may hold in place of the token it checks (a replica's _SHA256 setting)."""
    return hashlib.sha256(token.encode()).hexdigest()


# a digest of a well-known secret is as well known as the secret
WELL_KNOWN_DIGESTS: frozenset[str] = frozenset(token_digest(s) for s in WELL_KNOWN_SECRETS)


def dev_tokens(tokens: Mapping[str, str | SecretStr]) -> list[str]:
    """The setting names (of secrets, or of their digests) that hold a well-known dev secret or nothing."""
    out = []
    for name, value in tokens.items():
        secret = value.get_secret_value() if isinstance(value, SecretStr) else value
        if not secret or secret in WELL_KNOWN_SECRETS or secret in WELL_KNOWN_DIGESTS:
            out.append(name)
    return sorted(out)


def local_addresses(platform: PlatformSettings, object_store: bool) -> list[str]:
    """The backing-service addresses left unset, so on the local stack's defaults: Kafka's, and the object
    store's for a process that uses it. (The database and Redis URLs' defaults carry dev passwords.)"""
    fields = {"kafka_bootstrap": "LORAFLEET_KAFKA_BOOTSTRAP"}
    if object_store:
        fields["s3_endpoint"] = "LORAFLEET_S3_ENDPOINT"
    return sorted(name for field, name in fields.items() if field not in platform.model_fields_set)


def refuse_dev_tokens(
    platform: PlatformSettings,
    process: str,
    tokens: Mapping[str, str | SecretStr],
    database_url: bool = True,
) -> None:
    """Raise DevTokenRefused unless the profile is dev, or every token (and the database URL's password unless
    database_url is False, and the Kafka password when the platform authenticates to Kafka) is a real secret
    and no backing service's address is left on its local default (a process holding the object store's keys
    uses the store)."""
    if platform.profile == "dev":
        return
    secrets = dict(tokens)
    if database_url:
        secrets[DATABASE_URL_SETTING] = url_password(platform.database_url)
    if platform.kafka_security_protocol != "PLAINTEXT":
        secrets[KAFKA_PASSWORD_SETTING] = kafka_password(platform)
    reasons = []
    found = dev_tokens(secrets)
    if found:
        reasons.append(
            f"{', '.join(found)} still hold a well-known dev secret or none. Set a secret of its own for each"
        )
    unset = local_addresses(platform, object_store="LORAFLEET_S3_ACCESS_KEY" in tokens)
    if unset:
        names = ", ".join(unset)
        reasons.append(f"{names} unset: each would be the local stack's address. Set where each runs")
    if reasons:
        raise DevTokenRefused(
            f"{process}: {'; '.join(reasons)}; or set LORAFLEET_PROFILE=dev on a single-machine dev stack."
        )
