"""The one code table for adapter rejections: the registry stores the code as a version's reason_code, the
replica reports it as its load error's code."""

from __future__ import annotations

from enum import StrEnum


class RejectCode(StrEnum):
    """Why an adapter artifact is refused; the value is the machine code both doors report."""

    # the folder and its transfer
    ARTIFACT_MISSING = "artifact_missing"  # adapter_config.json or adapter_model.safetensors is absent
    ARTIFACT_FORBIDDEN = "artifact_forbidden"  # the object store refuses the registry's read
    UNSUPPORTED_FORMAT = "unsupported_format"  # pickle or zip weights, never opened
    ADAPTER_TOO_LARGE = "adapter_too_large"  # a file is over its byte cap
    CHECKSUM_MISMATCH = "checksum_mismatch"  # the weights do not hash to the registered checksum
    # adapter_config.json
    INVALID_ADAPTER_CONFIG = "invalid_adapter_config"  # not strict JSON, or a field of the wrong type
    UNSUPPORTED_ADAPTER_FEATURE = "unsupported_adapter_feature"  # DoRA, biases, modules_to_save, ...
    BASE_MODEL_MISMATCH = "base_model_mismatch"  # trained on another base than the served one
    # adapter_model.safetensors
    INVALID_SAFETENSORS = "invalid_safetensors"  # the header or the offsets break the format
    UNSUPPORTED_DTYPE = "unsupported_dtype"  # a tensor dtype other than F32, F16, BF16
    # the tensors against the base and the config
    UNKNOWN_TARGET_MODULE = "unknown_target_module"  # a tensor or target that adapts no served linear
    SHAPE_MISMATCH = "shape_mismatch"  # lora_A / lora_B do not pair up or do not fit the base
    RANK_OVER_CAP = "adapter_rank_exceeds_limit"  # a module's rank is over the fleet cap
    CONFIG_RANK_MISMATCH = "config_rank_mismatch"  # a module's tensor rank is not its r / rank_pattern
    CONFIG_TARGET_MISMATCH = "config_target_mismatch"  # the tensors adapt other modules than configured
    NON_FINITE_WEIGHTS = "non_finite_weights"  # a value is NaN or Inf
    # the registration against the artifact (registry only: the replica has no registration body)
    RANK_MISMATCH = "rank_mismatch"  # registered rank is not the tensors' largest rank
    TARGET_MODULES_MISMATCH = "target_modules_mismatch"  # registered modules are not the adapted ones
    ALPHA_MISMATCH = "adapter_config_mismatch"  # registered alpha is not the config's lora_alpha


class AdapterRejected(Exception):
    """An artifact fails a rule: code, a message for people, and the field or tensor it concerns."""

    def __init__(self, code: RejectCode, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
