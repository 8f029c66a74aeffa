"""What a client is told when no replica took its request: the public error for the replicas' answers.

A replica's refusal of the request itself passes through with its code: a bad request as 400, a cap of
the tenant's (its cold loads) as 429, anything else as 503, each with the replica's Retry-After. When the
last owner tried answered 503 because of the adapter's load (it failed, or its cold loads are full), the
client gets that code and Retry-After. A replica that sent no first token in time is 504; any other end
(owners unreachable, draining, without a slot) is 503 `no_replica_available`, and a gateway out of
connections to replicas is 503 `gateway_overloaded`.
"""

from __future__ import annotations

from gateway.errors import BadRequest, GatewayError, GatewayTimeout, Overloaded, ServiceUnavailable
from gateway.public.admission.rate_limit import retry_after_of
from gateway.public.upstream.replica_client import ReplicaRejected, ReplicaUnavailable

LOAD_REFUSALS = frozenset({"adapter_loading_failed", "cold_loads_full"})  # a replica's 503 about the adapter


def public_error(exc: ReplicaRejected | ReplicaUnavailable) -> GatewayError:
    """The error in the public API's shape (its code is also the request's recorded error code)."""
    if isinstance(exc, ReplicaRejected):
        code, message, param = exc.error.code, exc.error.message, exc.error.param
        if exc.status in (400, 413, 422):
            return BadRequest(code or "invalid_request", message, param)
        retry = {"Retry-After": retry_after_of(exc.retry_after)}
        if exc.status == 429:
            return Overloaded(code or "replica_overloaded", message, None, retry)
        return ServiceUnavailable(code or "replica_error", message, None, retry)
    if exc.pool_exhausted:
        return ServiceUnavailable(
            "gateway_overloaded", "this gateway is at its connection limit; retry", None, {"Retry-After": "1"}
        )
    if exc.timed_out:
        return GatewayTimeout(
            "upstream_timeout", "no replica sent a first token in time", None, {"Retry-After": "1"}
        )
    refused = exc.refusal
    if refused is not None and refused.status == 503 and refused.error.code in LOAD_REFUSALS:
        retry = {"Retry-After": retry_after_of(refused.retry_after)}
        return ServiceUnavailable(refused.error.code or "", refused.error.message, None, retry)
    return ServiceUnavailable(
        "no_replica_available", "no replica can take this request now", None, {"Retry-After": "1"}
    )
