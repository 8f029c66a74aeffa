"""The environment of every process the local stack starts: the dev profile, the fleet's id prefixes,
the local replica sizing and listeners, and each process's own Kafka and PostgreSQL logins."""

from __future__ import annotations

import os
from urllib.parse import urlparse

from lorafleet.config import get_settings
from lorafleet.profile import DEV_PROFILE_ENV, dev_database_password, dev_kafka_password
from ops.stack.profile import LOCAL_REPLICA_ENV
from ops.stack.scrape import LOCAL_ENV
from schemas import principals


def kafka_env(principal: str) -> dict[str, str]:
    """A local process's Kafka login: the principal and its dev password (the local broker's users have
    these; the local stack runs in the dev profile)."""
    return {"LORAFLEET_KAFKA_USERNAME": principal, "LORAFLEET_KAFKA_PASSWORD": dev_kafka_password(principal)}


def dev_login_url(owner_url: str, process: str) -> str:
    """The local stack's database URL for a process: owner_url's server and database, logged in as the
    process's own login (`<its role>_login`, with its dev password; services up makes it)."""
    url = urlparse(owner_url)
    user = f"{principals.DATABASE_ROLES[process]}_login"
    host = url.netloc.rpartition("@")[2]
    return url._replace(netloc=f"{user}:{dev_database_password(process)}@{host}").geturl()


def dev_logins(owner_url: str) -> dict[str, str]:
    """Every process's local-stack database URL on owner_url's database (what `services up` makes)."""
    return {p: dev_login_url(owner_url, p) for p in principals.DATABASE_LOGINS}


def database_env(process: str, owner_url: str | None = None) -> dict[str, str]:
    """A local process's database login (its role's, not the owner's) on owner_url's database (by default
    the environment's)."""
    return {"LORAFLEET_DATABASE_URL": dev_login_url(owner_url or get_settings().database_url, process)}


# The local fleet's replica ids start with this; the router and the placement worker ignore replicas of
# any other stack that shares the same Kafka (a test run, a second checkout).
FLEET_ENV: dict[str, str] = {
    "LORAFLEET_GATEWAY_REPLICA_ID_PREFIX": "replica-",
    "LORAFLEET_PLACEMENT_REPLICA_ID_PREFIX": "replica-",
    "LORAFLEET_STATS_REPLICA_ID_PREFIX": "replica-",
}


def process_env() -> dict[str, str]:
    """The dev profile (the local stack runs on the default tokens), the fleet's id prefixes, the local
    profile's replica sizing and the local listeners, except what the environment sets."""
    wanted = {**DEV_PROFILE_ENV, **FLEET_ENV, **LOCAL_REPLICA_ENV, **LOCAL_ENV}
    return {k: v for k, v in wanted.items() if k not in os.environ}


def replica_env(owner_url: str | None = None) -> dict[str, str]:
    """process_env() for a replica the autoscaler starts, with the replica's Kafka and database logins, on
    owner_url's database (the autoscaler's own: where its gateways look for registrations)."""
    return {**process_env(), **kafka_env(principals.REPLICA), **database_env(principals.REPLICA, owner_url)}
