"""Errors of the adapter cache: each failure to bring an adapter in has its own code and HTTP status."""

from __future__ import annotations

from lorafleet.adapter_rules.errors import RejectCode
from replica.errors import ReplicaError


class AdapterCacheError(ReplicaError):
    """An adapter could not be brought into the cache."""

    code = "adapter_loading_failed"
    type = "server_error"
    status = 503
    retry_after_s: float | None = 1.0


class ObjectStoreUnavailableError(AdapterCacheError):
    """The object store did not deliver the bytes now (a 5xx, a broken or stalled stream, the deadline);
    a later try may succeed."""


class RegistryUnavailableError(AdapterCacheError):
    """The registry did not answer now (unreachable, or a 5xx); a later try may succeed."""


class AdapterNotRegisteredError(AdapterCacheError):
    """The registry has no ready version under this adapter id."""

    code = "adapter_not_found"
    type = "invalid_request_error"
    status = 404


class ChecksumMismatchError(AdapterCacheError):
    """The fetched bytes do not hash to the registered checksum; they never enter any tier."""

    code = RejectCode.CHECKSUM_MISMATCH.value
    type = "invalid_request_error"
    status = 424


class ArtifactTooLargeError(AdapterCacheError):
    """A file is larger than its shared cap (lorafleet.adapter_rules.caps)."""

    code = RejectCode.ADAPTER_TOO_LARGE.value
    type = "invalid_request_error"
    status = 424


class UnsupportedUriError(AdapterCacheError):
    """weights_uri is not under an object-store prefix this replica may read."""

    code = "adapter_invalid"
    type = "invalid_request_error"
    status = 424


class TierFullError(AdapterCacheError):
    """Every byte of a tier is held by adapters in use; nothing idle can be evicted to make room."""

    code = "overloaded"


# Admission of cold loads (replica.adapter_cache.cold_loads): refusals to start a load, not load failures.


class TenantColdLoadsError(ReplicaError):
    """The tenant already has its share of cold loads in progress on this replica."""

    code = "too_many_cold_loads"
    type = "rate_limit_exceeded"
    status = 429
    retry_after_s: float | None = 1.0


class ColdLoadsFullError(ReplicaError):
    """The replica already runs as many cold loads as it admits at once."""

    code = "cold_loads_full"
    type = "server_error"
    status = 503
    retry_after_s: float | None = 1.0
