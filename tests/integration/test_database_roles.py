"""Each process's PostgreSQL role, tried against a real migrated database: it does its own job, and every
statement outside it is refused by PostgreSQL itself. A replica registers its address only through
register_replica(), under its own identity key."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlparse

import asyncpg
import pytest

from gateway.registry import aliases
from harness.databases import drop_roles, throwaway_database
from harness.seed import Alias, ReadyAdapter, Seed, Tenant, write_seed
from lorafleet.db.logins import ensure_logins
from lorafleet.db.migrate import migrate
from lorafleet.state_signature import state_key
from schemas import principals

pytestmark = pytest.mark.integration

BASE = "sha256:" + "1" * 64
SEED = Seed(
    (Tenant("acme", 10, 1000),),
    (ReadyAdapter("acme-a-v1", "acme", BASE), ReadyAdapter("acme-a-v2", "acme", BASE, version=2)),
    (Alias.of("acme/a:prod", "acme-a-v1"),),
)
PENDING = """INSERT INTO adapters (adapter_id, tenant_id, version, base_model_hash, rank, alpha, target_modules,
             weights_uri, checksum) VALUES ('acme-p-v1', 'acme', 1, $1, 8, 16, '{q_proj}', 's3://b/p/', $1)"""


@dataclass
class Database:
    owner: str  # the migrating owner's URL
    logins: dict[str, str]  # process -> its login's URL


@pytest.fixture(scope="module")
async def db(services) -> AsyncIterator[Database]:
    run = uuid.uuid4().hex[:8]
    owner_url = services.database_url
    async with throwaway_database(owner_url, f"roles_{run}") as url:
        await migrate(url)
        pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
        await write_seed(pool, SEED)
        await pool.execute(PENDING, BASE)
        await pool.execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, type, payload) VALUES "
            "(gen_random_uuid(), 't', 'k', 'x', '{}')"
        )
        await pool.close()
        # a login of each process's role, of this run's own (roles belong to the whole cluster)
        logins = {
            process: _as_user(url, f"lp_{run}_{role.removeprefix('lorafleet_')}", secrets.token_urlsafe(24))
            for process, role in principals.DATABASE_ROLES.items()
        }
        await ensure_logins(url, logins)
        try:
            yield Database(url, logins)
        finally:
            await drop_roles(owner_url, [urlparse(login).username or "" for login in logins.values()])


def _as_user(url: str, user: str, password: str) -> str:
    """url on the same server and database, logged in as user."""
    parsed = urlparse(url)
    return parsed._replace(netloc=f"{user}:{password}@{parsed.netloc.rpartition('@')[2]}").geturl()


async def _as(db: Database, process: str) -> asyncpg.Connection:
    return await asyncpg.connect(db.logins[process])


# (process, what it tries, the statement): each must be refused for lack of privilege
REFUSED = [
    ("replica", "register an adapter", PENDING.replace("acme-p-v1", "acme-x-v1")),
    ("replica", "move an alias", "UPDATE aliases SET adapter_id = 'acme-a-v2'"),
    (
        "replica",
        "write a registration directly",
        "INSERT INTO replica_registrations VALUES ('r9', 'http://x')",
    ),
    ("replica", "read the registrations", "SELECT url FROM replica_registrations"),
    ("replica", "read API keys", "SELECT key_hash FROM api_keys"),
    ("replica", "write the outbox", "DELETE FROM outbox"),
    ("public-gateway", "issue an API key", "INSERT INTO api_keys VALUES ('k', 'acme', 'h', 'p')"),
    ("public-gateway", "move an alias", "UPDATE aliases SET adapter_id = 'acme-a-v2'"),
    ("public-gateway", "read identity key hashes", "SELECT key_hash FROM replica_registrations"),
    (
        "public-gateway",
        "write the outbox",
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, type, payload) "
        "VALUES (gen_random_uuid(), 't', 'k', 'x', '{}')",
    ),
    ("gateway", "read API keys", "SELECT key_hash FROM api_keys"),
    (
        "gateway",
        "mark a version ready",
        "UPDATE adapters SET status = 'ready' WHERE adapter_id = 'acme-p-v1'",
    ),
    ("gateway", "place adapters", "DELETE FROM placements"),
    ("gateway", "write a registration", "INSERT INTO replica_registrations VALUES ('r9', 'http://x')"),
    ("registry-validator", "move an alias", "UPDATE aliases SET adapter_id = 'acme-a-v2'"),
    ("registry-validator", "change a version's tenant", "UPDATE adapters SET tenant_id = 'acme'"),
    ("registry-validator", "read API keys", "SELECT key_hash FROM api_keys"),
    ("placement-worker", "read API keys", "SELECT key_hash FROM api_keys"),
    ("placement-worker", "mark a version ready", "UPDATE adapters SET status = 'ready'"),
    ("placement-worker", "move an alias", "UPDATE aliases SET adapter_id = 'acme-a-v2'"),
    ("placement-worker", "read identity key hashes", "SELECT key_hash FROM replica_registrations"),
    ("placement-worker", "write a registration", "DELETE FROM replica_registrations"),
    ("relay", "read tenants", "SELECT tenant_id FROM tenants"),
    ("relay", "read API keys", "SELECT key_hash FROM api_keys"),
    ("relay", "write placements", "DELETE FROM placements"),
    ("stats-stream", "move an alias", "UPDATE aliases SET adapter_id = 'acme-a-v2'"),
    ("stats-stream", "read API keys", "SELECT key_hash FROM api_keys"),
    ("stats-stream", "write the outbox", "DELETE FROM outbox"),
    ("stats-stream", "read identity key hashes", "SELECT key_hash FROM replica_registrations"),
    ("autoscaler", "read anything", "SELECT adapter_id FROM adapters"),
    ("autoscaler", "read dead letters", "SELECT value FROM dead_letters"),
]


@pytest.mark.parametrize(("process", "what", "sql"), REFUSED, ids=[f"{p}: {w}" for p, w, _ in REFUSED])
async def test_a_process_role_is_refused_what_is_not_its_job(db: Database, process: str, what: str, sql: str):
    conn = await _as(db, process)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(sql.replace("$1", f"'{BASE}'"))
    finally:
        await conn.close()


# (process, its job, the statement): each must succeed
ALLOWED = [
    ("replica", "read its placements", "SELECT adapter_id FROM placements WHERE replica_id = 'r0'"),
    ("replica", "read its plan mark", "SELECT planned_through FROM replicas WHERE replica_id = 'r0'"),
    (
        "public-gateway",
        "authenticate a key",
        "SELECT k.key_id FROM api_keys k JOIN tenants t USING (tenant_id)",
    ),
    ("public-gateway", "resolve an alias", "SELECT adapter_id FROM aliases"),
    ("public-gateway", "read the addresses", "SELECT replica_id, url FROM replica_registrations"),
    (
        "registry-validator",
        "settle a version",
        "UPDATE adapters SET status = 'ready', updated_at = now() WHERE adapter_id = 'acme-p-v1'",
    ),
    (
        "placement-worker",
        "place an owner",
        "INSERT INTO placements (adapter_id, replica_id, role, tier) "
        "VALUES ('acme-a-v1', 'r0', 'owner', 'ram')",
    ),
    (
        "placement-worker",
        "read the registrations and state keys",
        "SELECT replica_id, url, state_key FROM replica_registrations",
    ),
    ("relay", "mark a row sent", "UPDATE outbox SET sent_at = now()"),
    (
        "stats-stream",
        "store a window",
        "INSERT INTO adapter_stats (adapter_id, window_start, requests, "
        "tokens_per_s, gpu_hit_rate) VALUES ('acme-a-v1', now(), 1, 1, 1)",
    ),
    (
        "stats-stream",
        "read the registrations and state keys",
        "SELECT replica_id, url, state_key FROM replica_registrations",
    ),
    (
        "autoscaler",
        "record a dead letter",
        "INSERT INTO dead_letters (consumer, topic, kafka_partition, "
        "kafka_offset, reason) VALUES ('autoscale-signals', 't', 0, 0, 'r')",
    ),
]


@pytest.mark.parametrize(("process", "job", "sql"), ALLOWED, ids=[f"{p}: {j}" for p, j, _ in ALLOWED])
async def test_a_process_role_does_its_job(db: Database, process: str, job: str, sql: str) -> None:
    conn = await _as(db, process)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def test_the_gateway_role_moves_an_alias_through_the_registry_code(db: Database) -> None:
    pool = await asyncpg.create_pool(db.logins["gateway"], min_size=1, max_size=1)
    try:
        view, changed = await aliases.set_alias(pool, "acme/a:prod", "acme-a-v2", None)
        assert changed and view.adapter_id == "acme-a-v2" and view.previous_adapter_id == "acme-a-v1"
        # the retired-versions trigger ran as the table's owner: the move retired v1
        owner = await asyncpg.connect(db.owner)
        try:
            assert await owner.fetchval(
                "SELECT count(*) FROM retired_versions WHERE adapter_id = 'acme-a-v1'"
            )
        finally:
            await owner.close()
    finally:
        await pool.close()


async def test_a_replica_cannot_register_under_another_replicas_id(db: Database) -> None:
    own, other = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    conn = await _as(db, "replica")
    try:
        register = "SELECT register_replica($1, $2, $3, $4)"
        await conn.execute(register, "rp-0", "http://10.0.0.1:8100", own, state_key(own))
        # the same replica at a new address (rescheduled, same key): allowed
        await conn.execute(register, "rp-0", "http://10.0.0.2:8100", own, state_key(own))
        with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
            await conn.execute(register, "rp-0", "http://evil:8100", other, state_key(other))
        with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
            await conn.execute(register, "rp-1", "http://evil:8100", "short", None)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # nor read the keys states are signed with
            await conn.execute("SELECT state_key FROM replica_registrations")
    finally:
        await conn.close()
    owner = await asyncpg.connect(db.owner)
    try:
        row = await owner.fetchrow(
            "SELECT url, state_key FROM replica_registrations WHERE replica_id = 'rp-0'"
        )
        assert (row["url"], row["state_key"]) == ("http://10.0.0.2:8100", state_key(own))
    finally:
        await owner.close()


async def test_every_table_is_granted_to_a_process_role_and_each_login_to_its_role_only(db: Database) -> None:
    owner = await asyncpg.connect(db.owner)
    try:
        tables = {
            r["table_name"]
            for r in await owner.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        } - {"schema_migrations"}
        roles = list(principals.DATABASE_ROLES.values())
        granted = {
            r["table_name"]
            for r in await owner.fetch(
                """SELECT table_name FROM information_schema.role_table_grants WHERE grantee = ANY($1)
                   UNION SELECT table_name FROM information_schema.column_privileges WHERE grantee = ANY($1)""",
                roles,
            )
        }
        assert sorted(tables - granted) == [], "a table no process may use: grant it in a migration"
        for process, url in db.logins.items():
            member_of = {
                r["rolname"]
                for r in await owner.fetch(
                    """SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
                       JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = $1""",
                    urlparse(url).username,
                )
            }
            assert member_of == {principals.DATABASE_ROLES[process]}, process
    finally:
        await owner.close()


async def test_the_local_cluster_asks_every_role_for_its_password(services) -> None:
    """No trust: over TCP and over the socket, a role without its password is refused (ops/stack/postgres)."""
    from lorafleet.config import get_settings
    from ops.stack.postgres import _paths

    url = urlparse(services.database_url)
    host = url.netloc.rpartition("@")[2]
    socket_dir = str(_paths(get_settings())[2])
    attempts = {
        "tcp, no password": url._replace(netloc=f"{url.username}@{host}").geturl(),
        "tcp, wrong password": url._replace(netloc=f"{url.username}:wrong@{host}").geturl(),
    }
    for attempt in attempts.values():
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(attempt, timeout=5)
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(
            host=socket_dir, port=url.port, user=url.username, database="postgres", timeout=5
        )
    (await asyncpg.connect(services.database_url, timeout=5)).terminate()  # with it: in
