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

from schemas.openai import FinishReason, SamplingRequest, TokenLogprob, Usage
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

    # The chosen token's logprob and the logprobs most likely tokens' at each position (OpenAI's 0 to 5).
    logprobs: Annotated[int, Field(ge=0, le=5, strict=True)] | None = None

    # Not implemented: refused unless the value is a no-op.
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

    def logprob_alternatives(self) -> int | None:
        return self.logprobs


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy logprobs: per generated token its text, logprob, the most likely tokens' logprobs
    (text -> logprob) and its first character's offset in the choice's text."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)

    @classmethod
    def of(cls, entries: list[TokenLogprob], offset: int = 0) -> CompletionLogprobs:
        """The legacy shape of chat-shaped entries whose first token starts at character offset of the
        choice's text (each token's offset is the length of the tokens' text before it)."""
        offsets = []
        for e in entries:
            offsets.append(offset)
            offset += len(e.token)
        return cls(
            tokens=[e.token for e in entries],
            token_logprobs=[e.logprob for e in entries],
            top_logprobs=[{t.token: t.logprob for t in e.top_logprobs} for e in entries],
            text_offset=offsets,
        )


class CompletionChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: CompletionLogprobs | None = None
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
    logprobs: CompletionLogprobs | None = None
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
