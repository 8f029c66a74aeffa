"""OpenAI's legacy Completions bodies (POST /v1/completions) as the public gateway speaks them.

The request shares the chat body's alias, limit, sampling and streaming fields (schemas.openai
.SamplingRequest) and is refused the same way: a field outside OpenAI's CreateCompletionRequest is
unknown_parameter, and a value lorafleet has not implemented (schemas.openai_params.COMPLETIONS_UNSUPPORTED)
is unsupported_parameter. `prompt` is one string, sent to the model as raw text with no chat template.
Responses follow openapi.yaml's CreateCompletionResponse; a streamed chunk has the same shape, with
finish_reason null until the last content and `usage` set only on the usage chunk.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from schemas.openai import FinishReason, SamplingRequest, Usage
from schemas.openai_params import COMPLETIONS_UNSUPPORTED, describe_unsupported, supported, unsupported_fields

_UNSUPPORTED = unsupported_fields("", COMPLETIONS_UNSUPPORTED)


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra=describe_unsupported("", COMPLETIONS_UNSUPPORTED)
    )

    # OpenAI's four forms; only the first is served (COMPLETIONS_UNSUPPORTED says so for the others).
    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[int], Field(min_length=1)]
        | Annotated[list[list[int]], Field(min_length=1)]
    )

    # Not implemented: refused unless the value is a no-op.
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=0, le=20)] | None = None

    @field_validator(*_UNSUPPORTED)
    @classmethod
    def _refuse_unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        return supported(str(info.field_name), value, COMPLETIONS_UNSUPPORTED)

    def text(self) -> str:
        """The prompt (the validator lets through only a string)."""
        assert isinstance(self.prompt, str)
        return self.prompt


class CompletionChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: None = None
    finish_reason: FinishReason


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None


class CompletionChunkChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: None = None
    finish_reason: FinishReason | None = None


class CompletionChunk(BaseModel):
    """One SSE event; `usage` is null except on the last chunk when stream_options.include_usage is set."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
