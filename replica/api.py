"""HTTP bodies of the replica's internal API (the gateway is the only caller).

The generate stream is NDJSON (application/x-ndjson): one JSON object per line, in order
    {"type": "token", "token_id": 123, "text": "Hel"}                      (text may be "")
    {"type": "done", "finish_reason": "stop"|"length", "text": "...", "usage": {...}}
or, if the request fails after the stream started, a last line {"type": "error", "error": {...}}.
Responses carry x-adapter-id and x-adapter-tier (gpu | ram | disk | remote: where the adapter was when the
request arrived) for adapter requests.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from schemas.ids import AdapterId, Sha256


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class GenerateRequest(BaseModel):
    """A prompt (chat messages or token ids), the adapter to use (None = base) and sampling parameters."""

    messages: list[ChatMessage] | None = None
    prompt_token_ids: list[int] | None = None
    adapter_id: AdapterId | None = None
    request_id: str | None = Field(default=None, max_length=128)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    max_tokens: int = Field(default=256, ge=1)
    stop: str | list[str] | None = None
    ignore_eos: bool = False


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class LoadRequest(BaseModel):
    """Optional: the base_model_hash the adapter was trained on (from its registration)."""

    base_model_hash: Sha256 | None = None


class LoadResponse(BaseModel):
    adapter_id: str
    tier: Literal["gpu"]
    rank_bucket: int
    load_ms: float


class UnloadResponse(BaseModel):
    adapter_id: str
    unloaded: bool


class StateResponse(BaseModel):
    replica_id: str
    base_model_hash: str
    merged_adapter_id: str | None
    gpu_adapters: list[str]
    ram_adapters: list[str]
    disk_adapters: list[str]
    gpu_slots: int
    queue_depth: int
    tokens_in_flight: int
    evictions_per_min: float
    loads_per_min: float
