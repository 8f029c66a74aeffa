"""The local stack gives each process its own Kafka and database logins, never the owner's."""

from __future__ import annotations

from urllib.parse import urlparse

from lorafleet.config import get_settings
from lorafleet.profile import dev_database_password
from ops.stack.env import replica_env
from ops.stack.stack import APP_PROCESSES, app_envs
from schemas import principals


def test_each_app_process_logs_in_to_the_database_as_its_own_roles_login() -> None:
    owner = urlparse(get_settings().database_url)
    envs = app_envs(list(APP_PROCESSES))
    users = set()
    for name, env in envs.items():
        url = urlparse(env["LORAFLEET_DATABASE_URL"])
        assert (url.hostname, url.port, url.path) == (owner.hostname, owner.port, owner.path), name
        assert url.username != owner.username, f"{name} logs in as the owner"
        role = next(p for p, r in principals.DATABASE_ROLES.items() if url.username == f"{r}_login")
        assert url.password == dev_database_password(role)
        users.add(url.username)
    assert len(users) == len(envs) - 1  # replica-0 and replica-1 share the replica login
    assert replica_env()["LORAFLEET_DATABASE_URL"] == envs["replica-0"]["LORAFLEET_DATABASE_URL"]


def test_a_replica_an_autoscaler_starts_registers_in_the_autoscalers_database() -> None:
    """Not the environment's: an autoscaler of a stack on its own database (a test's, a second fleet's) starts
    replicas whose registrations its gateways read."""
    other = "postgresql://lorafleet:lorafleet@127.0.0.1:25432/fleet_b"
    url = urlparse(replica_env(other)["LORAFLEET_DATABASE_URL"])
    assert (url.port, url.path, url.username) == (
        25432,
        "/fleet_b",
        f"{principals.DATABASE_ROLES['replica']}_login",
    )
