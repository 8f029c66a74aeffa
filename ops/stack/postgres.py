"""PostgreSQL from Debian's package, in a cluster of the project's own under the data folder.

Clients authenticate by password (SCRAM) on every connection, over TCP and the socket alike; only the
cluster's own superuser, `postgres`, connects without one, over the socket as the OS user that runs the
cluster (peer). The project's role (LORAFLEET_DATABASE_URL's user) owns the database and may create roles:
the migrations create each process's role, and `services up` a login of each.
"""

from __future__ import annotations

import getpass
import os
import pwd
import shutil
import subprocess
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from lorafleet.config import PlatformSettings
from lorafleet.pids import pid_alive
from ops.stack.paths import log_dir, service_dir
from ops.stack.process import wait_until

NAME = "postgres"


def _bin(tool: str) -> str:
    """Newest /usr/lib/postgresql/N/bin/tool, else tool on PATH."""
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True
    )
    for bindir in versions:
        if (bindir / tool).exists():
            return str(bindir / tool)
    found = shutil.which(tool)
    if found is None:
        raise RuntimeError(f"{tool} not found: install Debian's postgresql package (make deps does, as root)")
    return found


def _as_owner(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its tools as the postgres system user then."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


def _paths(settings: PlatformSettings) -> tuple[Path, Path, Path]:
    base = service_dir(settings, NAME)
    return base, base / "data", base / "socket"


def _chown_tree(path: Path) -> None:
    if os.geteuid() != 0:
        return
    pw = pwd.getpwnam("postgres")
    for p in [path, *path.rglob("*")]:
        os.chown(p, pw.pw_uid, pw.pw_gid)


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_as_owner(argv), check=True, capture_output=True, text=True, **kwargs)


def ready(settings: PlatformSettings) -> bool:
    result = subprocess.run(
        [_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(settings.postgres_port), "-q"], capture_output=True
    )
    return result.returncode == 0


def _pg_ctl(settings: PlatformSettings, *args: str) -> subprocess.CompletedProcess[str]:
    _, data, _ = _paths(settings)
    return _run([_bin("pg_ctl"), "-D", str(data), *args])


def up(settings: PlatformSettings, timeout: float = 60.0) -> str:
    base, data, socket = _paths(settings)
    if ready(settings) and (data / "postmaster.pid").exists():
        _ensure_password_auth(settings)
        _ensure_role_and_db(settings)
        _ensure_statement_stats(settings)
        return "already running"
    logs = log_dir(settings)
    for d in (base, socket, logs / NAME):
        d.mkdir(parents=True, exist_ok=True)
    _chown_tree(base)
    _chown_tree(logs / NAME)
    if not (data / "PG_VERSION").exists():
        _run(
            [
                _bin("initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth-local=peer",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ]
        )
    options = f"-p {settings.postgres_port} -k {socket} -c listen_addresses=127.0.0.1"
    if _has_statement_stats():
        options += " -c shared_preload_libraries=pg_stat_statements"
    _pg_ctl(
        settings,
        "-l",
        str(logs / NAME / "postgres.log"),
        "-o",
        options,
        "-w",
        "-t",
        str(int(timeout)),
        "start",
    )
    if not wait_until(lambda: ready(settings), timeout):
        raise RuntimeError("PostgreSQL did not become ready")
    _ensure_password_auth(settings)
    _ensure_role_and_db(settings)
    _ensure_statement_stats(settings)
    return "started"


# Who may connect how: the superuser by OS identity over the socket, every other role by password.
HBA = """# written by lorafleet (ops/stack/postgres.py): password authentication, no trust
local   all   postgres                  peer map=lorafleet
local   all   all                       scram-sha-256
host    all   all       127.0.0.1/32    scram-sha-256
host    all   all       ::1/128         scram-sha-256
"""


def _ident() -> str:
    """pg_ident.conf: the OS user that runs the cluster's tools (postgres when we are root) is `postgres`."""
    runner = "postgres" if os.geteuid() == 0 else getpass.getuser()
    return f"# written by lorafleet (ops/stack/postgres.py)\nlorafleet   {runner}   postgres\n"


def _ensure_password_auth(settings: PlatformSettings) -> None:
    """pg_hba.conf and pg_ident.conf as above; a cluster set up before (trust) is reloaded with them."""
    _, data, _ = _paths(settings)
    wanted = {data / "pg_hba.conf": HBA, data / "pg_ident.conf": _ident()}
    changed = False
    for path, text in wanted.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            _chown_tree(path)
            changed = True
    if changed:
        _pg_ctl(settings, "reload")


def _psql(settings: PlatformSettings, sql: str, db: str = "postgres") -> str:
    _, _, socket = _paths(settings)
    out = _run(
        [
            _bin("psql"),
            "-h",
            str(socket),
            "-p",
            str(settings.postgres_port),
            "-U",
            "postgres",
            "-d",
            db,
            "-v",
            "ON_ERROR_STOP=1",
            "-tAc",
            sql,
        ]
    )
    return out.stdout.strip()


def _ensure_role_and_db(settings: PlatformSettings) -> None:
    """Create the lorafleet role (it may create databases and roles) and the database named in
    database_url, once."""
    url = urlparse(settings.database_url)
    user, password, db = url.username or "lorafleet", url.password or "lorafleet", url.path.lstrip("/")
    if _psql(settings, f"SELECT 1 FROM pg_roles WHERE rolname = '{user}'") != "1":
        _psql(settings, f"CREATE ROLE \"{user}\" LOGIN PASSWORD '{password}' CREATEDB CREATEROLE")
    elif _psql(settings, f"SELECT rolcreaterole FROM pg_roles WHERE rolname = '{user}'") != "t":
        _psql(settings, f'ALTER ROLE "{user}" CREATEROLE')
    if _psql(settings, f"SELECT 1 FROM pg_database WHERE datname = '{db}'") != "1":
        _psql(settings, f'CREATE DATABASE "{db}" OWNER "{user}"')


def _has_statement_stats() -> bool:
    """Whether pg_stat_statements is installed beside the server (Debian's postgresql package ships it)."""
    return (Path(_bin("postgres")).parent.parent / "lib" / "pg_stat_statements.so").is_file()


def _ensure_statement_stats(settings: PlatformSettings) -> None:
    """pg_stat_statements in the `postgres` database (the platform's own schema stays as its migrations made
    it), readable by the platform's role, so a benchmark can count the statements each database ran
    (`lorafleet bench fleet`); skipped where the module is not loaded."""
    if _psql(settings, "SELECT 1 FROM pg_settings WHERE name = 'pg_stat_statements.max'") != "1":
        return
    user = urlparse(settings.database_url).username or "lorafleet"
    _psql(settings, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    _psql(settings, f'GRANT pg_read_all_stats TO "{user}"')


def pid(settings: PlatformSettings) -> int | None:
    """The postmaster's pid, from the first line of postmaster.pid, if that process is alive."""
    _, data, _ = _paths(settings)
    try:
        found = int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    return found if pid_alive(found) else None


def down(settings: PlatformSettings, mode: Literal["fast", "immediate"] = "fast") -> bool:
    """Stop the server: `fast` rolls back and checkpoints; `immediate` kills every backend at once, as a crash
    does, and the next start runs crash recovery."""
    _, data, _ = _paths(settings)
    if not (data / "postmaster.pid").exists():
        return False
    _pg_ctl(settings, "-m", mode, "-w", "stop")
    return True
