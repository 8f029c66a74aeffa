"""Replica domain errors: each failure has its own class, a machine code and an HTTP status."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lorafleet.adapter_rules.errors import AdapterRejected, RejectCode

if TYPE_CHECKING:
    from schemas.api import ErrorBody


class ReplicaError(Exception):
    """Base of every error the replica reports to a caller."""

    code = "replica_error"
    type = "invalid_request_error"
    status = 400
    retry_after_s: float | None = None  # sent as Retry-After with a 429 or 503

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_body(self) -> ErrorBody:
        """Return the OpenAI-shaped error body."""
        # imported here: the model and slot code import this module and must run with torch alone
        from schemas.api import ErrorBody, ErrorDetail

        return ErrorBody(
            error=ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        )

    def headers(self) -> dict[str, str] | None:
        """Retry-After (whole seconds, at least 1) on a refusal the caller may retry."""
        if self.retry_after_s is None or self.status not in (429, 503):
            return None
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class UnsupportedModelError(ReplicaError):
    """The base checkpoint uses a feature this engine does not implement."""

    code = "unsupported_model"
    type = "server_error"
    status = 500


# Adapter validation: every check before an adapter takes a slot raises one of these, with the code of the
# shared rule it failed (lorafleet.adapter_rules.errors.RejectCode, the registry's reason codes).


class AdapterError(ReplicaError):
    """An adapter could not be accepted."""

    code = "adapter_invalid"
    status = 422


class AdapterNotSafetensorsError(AdapterError):
    """A file is missing, the weights are a pickle or not valid safetensors, or hold a dtype not served."""

    code = RejectCode.INVALID_SAFETENSORS.value


class AdapterConfigError(AdapterError):
    """adapter_config.json is missing, unreadable, describes a feature we do not serve, or disagrees with
    the tensors."""

    code = RejectCode.INVALID_ADAPTER_CONFIG.value


class AdapterRankTooLargeError(AdapterError):
    """The rank read from the tensor shapes exceeds the configured cap (or every bucket)."""

    code = RejectCode.RANK_OVER_CAP.value


class AdapterTargetModuleError(AdapterError):
    """The adapter targets a module the base model does not have (or the replica does not adapt)."""

    code = RejectCode.UNKNOWN_TARGET_MODULE.value


class AdapterShapeError(AdapterError):
    """A tensor's shape does not match the base layer it adapts."""

    code = RejectCode.SHAPE_MISMATCH.value


class AdapterNonFiniteError(AdapterError):
    """A tensor holds NaN or Inf."""

    code = RejectCode.NON_FINITE_WEIGHTS.value


class AdapterBaseMismatchError(AdapterError):
    """The adapter was trained on another base checkpoint (base_model_hash differs or is missing)."""

    code = RejectCode.BASE_MODEL_MISMATCH.value
    status = 409


# shared rule -> the load error that reports it (the instance carries the rule's code)
RULE_ERRORS: dict[RejectCode, type[AdapterError]] = {
    RejectCode.ARTIFACT_MISSING: AdapterNotSafetensorsError,
    RejectCode.UNSUPPORTED_FORMAT: AdapterNotSafetensorsError,
    RejectCode.ADAPTER_TOO_LARGE: AdapterNotSafetensorsError,
    RejectCode.INVALID_SAFETENSORS: AdapterNotSafetensorsError,
    RejectCode.UNSUPPORTED_DTYPE: AdapterNotSafetensorsError,
    RejectCode.INVALID_ADAPTER_CONFIG: AdapterConfigError,
    RejectCode.UNSUPPORTED_ADAPTER_FEATURE: AdapterConfigError,
    RejectCode.CONFIG_RANK_MISMATCH: AdapterConfigError,
    RejectCode.CONFIG_TARGET_MISMATCH: AdapterConfigError,
    RejectCode.BASE_MODEL_MISMATCH: AdapterBaseMismatchError,
    RejectCode.UNKNOWN_TARGET_MODULE: AdapterTargetModuleError,
    RejectCode.SHAPE_MISMATCH: AdapterShapeError,
    RejectCode.RANK_OVER_CAP: AdapterRankTooLargeError,
    RejectCode.NON_FINITE_WEIGHTS: AdapterNonFiniteError,
}


def adapter_error(rejected: AdapterRejected) -> AdapterError:
    """The load error for a failed adapter rule, carrying the rule's code, message and param."""
    error = RULE_ERRORS.get(rejected.code, AdapterError)(rejected.message, rejected.param)
    error.code = rejected.code.value
    return error


# Adapter availability.


class AdapterNotFoundError(ReplicaError):
    """No adapter with this id is registered on this replica."""

    code = "adapter_not_found"
    status = 404


class AdapterNotServedError(ReplicaError):
    """This replica does not serve the requested adapter (a merged replica serves exactly one)."""

    code = "adapter_not_served"
    status = 409


class AdapterInUseError(ReplicaError):
    """The adapter has running requests and cannot be unloaded now."""

    code = "adapter_in_use"
    status = 409


class NoFreeSlotError(ReplicaError):
    """Every slot of the adapter's rank bucket holds an adapter with running requests."""

    code = "no_free_slot"
    type = "server_error"
    status = 503

    def __init__(self, message: str, param: str | None = None, *, rank: int | None = None) -> None:
        super().__init__(message, param)
        self.rank = rank  # the adapter's rank, for a waiter to tell when its bucket has room again


class SlotMismatchError(ReplicaError):
    """A running row's slot holds another adapter than the one its request was admitted for."""

    code = "slot_mismatch"
    type = "server_error"
    status = 500


# Requests.


class InvalidRequestError(ReplicaError):
    """A generate request is malformed (bad sampling value, empty prompt, ...)."""

    code = "invalid_request"


class ContextLengthError(ReplicaError):
    """The prompt does not fit the replica's max_model_len."""

    code = "context_length_exceeded"


class UnauthorizedError(ReplicaError):
    """The service token is missing or wrong."""

    code = "invalid_service_token"
    type = "authentication_error"
    status = 401


class WrongReplicaError(ReplicaError):
    """The path names another replica id."""

    code = "wrong_replica"
    status = 404


class ReplicaDrainingError(ReplicaError):
    """The replica is draining: it takes no new request (another replica can)."""

    code = "replica_draining"
    type = "server_error"
    status = 503


class ReplicaNotReadyError(ReplicaError):
    """The replica is not ready for traffic (starting, warming or draining): GET /ready answers this."""

    code = "replica_not_ready"
    type = "server_error"
    status = 503
