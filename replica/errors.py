"""Replica domain errors: each failure has its own class, a machine code and an HTTP status."""

from __future__ import annotations

from schemas.api import ErrorBody, ErrorDetail


class ReplicaError(Exception):
    """Base of every error the replica reports to a caller."""

    code = "replica_error"
    type = "invalid_request_error"
    status = 400

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_body(self) -> ErrorBody:
        """Return the OpenAI-shaped error body."""
        return ErrorBody(
            error=ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        )


class UnsupportedModelError(ReplicaError):
    """The base checkpoint uses a feature this engine does not implement."""

    code = "unsupported_model"
    type = "server_error"
    status = 500


# Adapter validation: every check before an adapter takes a slot has its own error.


class AdapterError(ReplicaError):
    """An adapter could not be accepted."""

    code = "adapter_invalid"
    status = 422


class AdapterNotSafetensorsError(AdapterError):
    """Weights are missing or in a pickle format (.bin, .pt, ...); only safetensors is read."""

    code = "adapter_not_safetensors"


class AdapterConfigError(AdapterError):
    """adapter_config.json is missing, unreadable or describes something we do not serve."""

    code = "adapter_config_invalid"


class AdapterRankTooLargeError(AdapterError):
    """The rank read from the tensor shapes exceeds the configured cap."""

    code = "adapter_rank_too_large"


class AdapterTargetModuleError(AdapterError):
    """The adapter targets a module the base model does not have (or the replica does not adapt)."""

    code = "adapter_unknown_target_module"


class AdapterShapeError(AdapterError):
    """A tensor's shape does not match the base layer it adapts."""

    code = "adapter_shape_mismatch"


class AdapterNonFiniteError(AdapterError):
    """A tensor holds NaN or Inf."""

    code = "adapter_non_finite"


class AdapterBaseMismatchError(AdapterError):
    """The adapter was trained on another base checkpoint (base_model_hash differs or is missing)."""

    code = "adapter_base_model_mismatch"
    status = 409


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
