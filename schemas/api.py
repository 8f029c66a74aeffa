"""Bodies of the internal HTTP API (registry and aliases), and the adapter artifact layout behind weights_uri.

Artifact layout (a contract between the registering pipeline, the registry validator and the replicas):
weights_uri names a PEFT folder in the object store, `s3://<bucket>/<key prefix>` (a trailing slash is
optional). The folder holds exactly two objects that matter:
    <key prefix>/adapter_config.json          the PEFT config (r, lora_alpha, target_modules, ...)
    <key prefix>/adapter_model.safetensors    the LoRA tensors
checksum is "sha256:" + the hex sha256 of the adapter_model.safetensors bytes. Pickle files (.bin, .pt, ...)
under the prefix make the version rejected; nothing is ever unpickled.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.ids import AdapterId, Alias, TenantId

ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"

AdapterStatus = Literal["pending", "ready", "rejected"]


def artifact_keys(key_prefix: str) -> tuple[str, str]:
    """(config key, weights key) of the PEFT folder at key_prefix inside its bucket."""
    base = key_prefix.rstrip("/")
    return f"{base}/{ADAPTER_CONFIG_NAME}", f"{base}/{ADAPTER_WEIGHTS_NAME}"


class AdapterRegistration(BaseModel):
    """POST /internal/adapters: one immutable adapter version. Field formats are checked by the registry,
    which answers each bad field with its own machine code, so they are plain types here."""

    model_config = ConfigDict(extra="forbid")

    adapter_id: AdapterId
    tenant_id: TenantId  # the brief's body plus the owning tenant (adapters.tenant_id is required)
    version: Annotated[int, Field(ge=1, le=2**31 - 1)]
    base_model_hash: Annotated[str, Field(max_length=100)]
    rank: Annotated[int, Field(ge=1, le=2**31 - 1)]
    alpha: Annotated[float, Field(gt=0, le=1e6)]
    target_modules: Annotated[list[Annotated[str, Field(max_length=64)]], Field(min_length=1, max_length=32)]
    weights_uri: Annotated[str, Field(min_length=1, max_length=1024)]
    checksum: Annotated[str, Field(max_length=100)]


class AdapterView(BaseModel):
    """One adapter version as the registry holds it."""

    adapter_id: AdapterId
    tenant_id: TenantId
    version: int
    status: AdapterStatus
    base_model_hash: str
    rank: int
    alpha: float
    target_modules: list[str]
    weights_uri: str
    checksum: str
    size_bytes: int | None = None
    reason_code: str | None = None
    reason: str | None = None
    created_at: datetime
    updated_at: datetime
    # While pending: the checks the object store failed, the last one's error, and when the next is due.
    check_attempts: int = 0
    last_check_error: str | None = None
    next_check_at: datetime | None = None


class RegistrationAccepted(BaseModel):
    """The answer to a registration: 202 when new, 200 when the same version was already registered."""

    adapter_id: AdapterId
    status: AdapterStatus
    created: bool


class AdapterList(BaseModel):
    data: list[AdapterView]


class CanaryTarget(BaseModel):
    """A second ready version of the alias's tenant that takes `weight` of the alias's requests."""

    model_config = ConfigDict(extra="forbid")

    adapter_id: AdapterId
    weight: Annotated[float, Field(gt=0, lt=1)]


class AliasUpdate(BaseModel):
    """PUT /internal/aliases/{alias}: point the alias at a ready adapter version of the same tenant, and
    optionally split its requests with a canary version. A PUT without `canary` ends any canary."""

    model_config = ConfigDict(extra="forbid")

    adapter_id: AdapterId
    canary: CanaryTarget | None = None


class AliasView(BaseModel):
    alias: Alias
    tenant_id: TenantId
    adapter_id: AdapterId
    previous_adapter_id: AdapterId | None = None
    canary_adapter_id: AdapterId | None = None
    canary_weight: float | None = None
    revision: int
    updated_at: datetime


class AliasList(BaseModel):
    data: list[AliasView]


class ErrorDetail(BaseModel):
    """OpenAI's error object: all four keys present; param and code may be null."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
