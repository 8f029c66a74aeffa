"""Database logins for the processes: each process logs in as a login role that is a member of its own
role (schemas/principals.py DATABASE_ROLES; the migrations create the roles and grant them), and of no
other process's.

A login is named by the user and password of the database URL the process is given, so the URL in a
process's secret and the login made from it always agree. Making one needs a role that may create roles
(the migrating owner).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlparse

import asyncpg

from schemas import principals


class LoginError(ValueError):
    """A login URL without a user or password, or naming a role it may not be."""


def login_of(url: str) -> tuple[str, str]:
    """(user, password) of a database URL."""
    parsed = urlparse(url)
    if not parsed.username or not parsed.password:
        raise LoginError(f"a login URL names its user and password: {parsed.hostname}{parsed.path}")
    return parsed.username, parsed.password


async def ensure_login(admin: asyncpg.Connection, process: str, url: str) -> str:
    """Make url's user a login with url's password, a member of process's role and of no other process's;
    its name."""
    user, password = login_of(url)
    group = principals.DATABASE_ROLES[process]
    if user in principals.DATABASE_ROLES.values():
        raise LoginError(f"{user} is a process role, not a login: name another user for {process}")
    quoted = await admin.fetchrow(
        "SELECT quote_ident($1) AS ident, quote_literal($2) AS literal", user, password
    )
    assert quoted is not None
    ident, literal = quoted["ident"], quoted["literal"]
    existing = await admin.fetchrow("SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = $1", user)
    if existing is not None and (existing["rolsuper"] or existing["rolcreaterole"]):
        raise LoginError(f"{user} administers the cluster: give {process} a login of its own")
    verb = "ALTER" if existing is not None else "CREATE"
    await admin.execute(f"{verb} ROLE {ident} WITH LOGIN NOCREATEDB NOCREATEROLE PASSWORD {literal}")
    await admin.execute(f'GRANT "{group}" TO {ident}')
    for other in principals.DATABASE_ROLES.values():
        if other != group:
            member = await admin.fetchval("SELECT pg_has_role($1, $2, 'MEMBER') AND $2 <> $1", user, other)
            if member:
                await admin.execute(f'REVOKE "{other}" FROM {ident}')
    return user


async def ensure_logins(admin_url: str, logins: Mapping[str, str]) -> list[str]:
    """ensure_login for each process -> URL, over one connection as admin_url's role; the logins made."""
    conn = await asyncpg.connect(admin_url)
    try:
        return [await ensure_login(conn, process, url) for process, url in logins.items()]
    finally:
        await conn.close()


async def forget_replica(admin_url: str, replica_id: str) -> bool:
    """Release a replica id from its identity key (the replica lost its key with its volume); True when
    a registration was removed. The replica registers again under its new key."""
    conn = await asyncpg.connect(admin_url)
    try:
        removed = await conn.fetchval(
            "DELETE FROM replica_registrations WHERE replica_id = $1 RETURNING true", replica_id
        )
        return bool(removed)
    finally:
        await conn.close()
