"""Parse a registration's weights_uri and confine it to the configured object-store prefixes.

weights_uri comes from a pipeline, not a tenant, but it is still untrusted: only `s3://bucket/key` is
accepted, the bucket must be a plain DNS-style name (never an IP literal in any encoding), there is no
userinfo, port, query, fragment, percent-encoding, backslash, empty segment, `.` or `..`, and the result
must sit under one of the configured prefixes at a segment boundary. Nothing here does any I/O.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from gateway.errors import InvalidRegistration

CODE = "invalid_weights_uri"
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
KEY_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_\-.=+]+$")
# Hosts that decode to an IP in some resolver: dotted/short forms, hex, octal, a single integer.
NUMERIC_HOST_RE = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$", re.IGNORECASE)


@dataclass(frozen=True)
class ObjectLocation:
    """A bucket and a key prefix (no leading or trailing slash) inside it."""

    bucket: str
    key: str

    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.key else f"s3://{self.bucket}/"

    def contains(self, other: ObjectLocation) -> bool:
        if other.bucket != self.bucket:
            return False
        return not self.key or other.key == self.key or other.key.startswith(self.key + "/")


def _reject(why: str) -> InvalidRegistration:
    return InvalidRegistration(CODE, f"weights_uri {why}", "weights_uri")


def _check_bucket(bucket: str) -> None:
    if "@" in bucket or ":" in bucket or "[" in bucket:
        raise _reject("must not carry userinfo, a port or an IP literal")
    if NUMERIC_HOST_RE.fullmatch(bucket):
        raise _reject("must not name an IP address")
    try:
        ipaddress.ip_address(bucket)
    except ValueError:
        pass
    else:
        raise _reject("must not name an IP address")
    if not BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise _reject("must name a bucket (lowercase letters, digits, '.', '-')")


def parse_s3_uri(uri: str) -> ObjectLocation:
    """Split s3://bucket/key/... into a location, or raise InvalidRegistration(invalid_weights_uri)."""
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in uri) or "\\" in uri or "%" in uri:
        raise _reject("must not contain whitespace, control characters, backslashes or percent-encoding")
    if not uri.startswith("s3://"):
        raise _reject("must be an s3:// URI under a configured object-store prefix")
    rest = uri[len("s3://") :]
    if "?" in rest or "#" in rest:
        raise _reject("must not carry a query or fragment")
    bucket, _, key = rest.partition("/")
    _check_bucket(bucket)
    key = key[:-1] if key.endswith("/") else key
    segments = key.split("/") if key else []
    for seg in segments:
        if seg in ("", ".", "..") or not KEY_SEGMENT_RE.fullmatch(seg):
            raise _reject("has an empty, '.', '..' or invalid path segment")
    return ObjectLocation(bucket, key)


def parse_prefix(prefix: str) -> ObjectLocation:
    """A configured prefix in the same syntax (configuration errors surface at start-up)."""
    return parse_s3_uri(prefix)


def confine(uri: str, prefixes: list[ObjectLocation]) -> ObjectLocation:
    """The location of uri when it is a folder strictly under one of prefixes; raise otherwise."""
    location = parse_s3_uri(uri)
    if not location.key:
        raise _reject("must name a folder inside the bucket")
    if not any(p.contains(location) and location.key != p.key for p in prefixes):
        raise _reject("is not under a configured object-store prefix")
    return location
