"""How a process written for a pod or a compose container runs natively beside the others on one machine.

Each pod or container has a network and a file system of its own; natively they share one. So:
- every port a pod or container listens on becomes a port of its own on loopback, and every name the
  files give it (a Service, a pod's name under a headless Service, a compose service) resolves there;
- a listener on 0.0.0.0 listens on 127.0.0.1, the only interface the tests use;
- a backing service the files name (Kafka, PostgreSQL, S3, Redis) resolves to the one the test runs, and
  the database the files name is the test's throwaway one;
- every volume is a folder of the run's own.
Nothing else in a value changes: a secret, a size, a path outside a volume and every other setting are
passed as the files give them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

LOOPBACK = "127.0.0.1"
LISTEN_ANYWHERE = "0.0.0.0"
# host:port in a URL (user info kept) or bare, as in a Kafka bootstrap list
HOST_PORT = re.compile(
    r"(?P<lead>[a-z][a-z0-9+.-]*://(?:[^\s@/]*@)?|(?<![\w.-]))(?P<host>[A-Za-z0-9_.-]+):(?P<port>\d{2,5})\b"
)
# ('host', port) in a health check's Python one-liner
HOST_PORT_TUPLE = re.compile(r"\((?P<q>['\"])(?P<host>[A-Za-z0-9_.-]+)(?P=q),\s*(?P<port>\d{2,5})\)")


def backing_services(
    kafka_bootstrap: str, database_url: str, s3_endpoint: str, redis_port: int
) -> dict[tuple[str, int], tuple[str, int]]:
    """Where the files' kafka:9092, postgres:5432, objectstore:9000 and redis:6379 are natively: a run's own
    broker and Redis, the local PostgreSQL and object store."""
    pg, s3 = urlparse(database_url), urlparse(s3_endpoint)
    return {
        ("kafka", 9092): (LOOPBACK, int(kafka_bootstrap.rsplit(":", 1)[1])),
        ("postgres", 5432): (pg.hostname or LOOPBACK, pg.port or 5432),
        ("objectstore", 9000): (s3.hostname or LOOPBACK, s3.port or 80),
        ("redis", 6379): (LOOPBACK, redis_port),
    }


@dataclass
class Network:
    """Names and ports the files use -> loopback ports, and the backing services' addresses."""

    namespace: str = ""  # Kubernetes: a name may carry .<namespace>.svc[.cluster.local]
    ports: dict[tuple[str, int], int] = field(default_factory=dict)  # (name, port) -> loopback port
    backing: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)  # -> (host, port)
    database: str | None = None  # the database every PostgreSQL URL names, in place of the files' own

    def add(self, name: str, port: int, loopback_port: int) -> None:
        self.ports[(name, port)] = loopback_port

    def short(self, host: str) -> str:
        """A Kubernetes name without its namespace and cluster suffixes."""
        if not self.namespace:
            return host
        for suffix in (f".{self.namespace}.svc.cluster.local", f".{self.namespace}.svc"):
            if host.endswith(suffix):
                return host[: -len(suffix)]
        return host

    def resolve(self, host: str, port: int, own: Mapping[int, int]) -> tuple[str, int] | None:
        """Where (host, port) is natively; own: the calling pod's or container's own ports (loopback)."""
        if host in (LOOPBACK, "localhost"):
            return (LOOPBACK, own[port]) if port in own else None
        name = self.short(host)
        if (name, port) in self.ports:
            return LOOPBACK, self.ports[(name, port)]
        if (name, port) in self.backing:
            return self.backing[(name, port)]
        return None

    def rewrite(self, value: str, own: Mapping[int, int], volumes: Mapping[str, Path]) -> str:
        """value with every known host:port moved to loopback, a PostgreSQL URL's database replaced, and a
        path under a volume's mount moved to that volume's folder."""

        def url(match: re.Match[str]) -> str:
            found = self.resolve(match["host"], int(match["port"]), own)
            return match[0] if found is None else f"{match['lead']}{found[0]}:{found[1]}"

        def pair(match: re.Match[str]) -> str:
            found = self.resolve(match["host"], int(match["port"]), own)
            return match[0] if found is None else f"({match['q']}{found[0]}{match['q']}, {found[1]})"

        out = HOST_PORT_TUPLE.sub(pair, HOST_PORT.sub(url, value))
        if self.database is not None and out.startswith(("postgresql://", "postgres://")):
            out = urlparse(out)._replace(path=f"/{self.database}").geturl()
        for mount, folder in sorted(volumes.items(), key=lambda m: -len(m[0])):
            if out == mount or out.startswith(mount.rstrip("/") + "/"):
                return str(folder) + out[len(mount.rstrip("/")) :]
        return out


def listen_locally(env: dict[str, str], own: Mapping[int, int]) -> dict[str, str]:
    """A process's listener settings moved to its loopback ports: *_HOST 0.0.0.0 -> 127.0.0.1, and a
    *_PORT that names one of its own ports -> that port's loopback number."""
    out = dict(env)
    for name, value in env.items():
        if name.endswith("_HOST") and value == LISTEN_ANYWHERE:
            out[name] = LOOPBACK
        elif name.endswith("_PORT") and value.isdigit() and int(value) in own:
            out[name] = str(own[int(value)])
    return out
