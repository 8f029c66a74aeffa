"""OpenAI Chat Completions and Models bodies as the public gateway speaks them.

Requests: `model` is the caller's alias (tenant/name:label); max_completion_tokens wins over the deprecated
max_tokens. A field outside OpenAI's spec is refused, as OpenAI refuses it (extra="forbid", at every level),
and so is a value of a parameter lorafleet has not implemented (schemas.openai_params.UNSUPPORTED), so no
request's meaning changes silently. Fields that change no output (store, metadata, service_tier, user,
prompt_cache_key, prompt_cache_retention, safety_identifier, parallel_tool_calls, a message's name and
tool_call_id, stream_options.include_obfuscation) are checked for shape and ignored. Responses follow
openapi.yaml's CreateChatCompletionResponse, CreateChatCompletionStreamResponse and ListModelsResponse;
errors use schemas.api.ErrorBody, built by schemas.openai_params.request_error.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator

from schemas.openai_params import describe_unsupported, supported, unsupported_fields
from schemas.response_format import JsonObjectFormat, JsonSchemaFormat, ResponseFormat, TextFormat

Role = Literal["developer", "system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length"]

# OpenAI's ranges, shared with the replica's GenerateRequest: the gateway and the replica refuse alike.
Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]
# A token id as OpenAI writes it, a JSON object key: decimal, no sign or leading zero, so two keys are never
# the same id. The replica checks it against its vocabulary.
TokenIdKey = Annotated[str, StringConstraints(pattern=r"^(0|[1-9][0-9]{0,9})$")]
LogitBias = Annotated[
    dict[TokenIdKey, Annotated[float, Field(ge=-100.0, le=100.0, allow_inf_nan=False)]],
    Field(max_length=300, json_schema_extra={"additionalProperties": False}),  # only keys of the pattern
]
AnyObject = dict[str, Any]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=describe_unsupported("messages[].content[]."))
    type: Literal["text", "image_url", "input_audio", "file", "refusal"]
    text: str

    @field_validator(*unsupported_fields("messages[].content[]."))
    @classmethod
    def _refuse_unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        return supported(f"messages[].content[].{info.field_name}", value)


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=describe_unsupported("messages[]."))
    role: Role
    content: str | Annotated[list[ContentPart], Field(min_length=1)]
    name: str | None = None
    tool_call_id: str | None = None  # a tool message's; the chat template is given its content only
    tool_calls: list[AnyObject] | None = None
    function_call: AnyObject | None = None
    audio: AnyObject | None = None
    refusal: str | None = None

    @field_validator(*unsupported_fields("messages[]."))
    @classmethod
    def _refuse_unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        return supported(f"messages[].{info.field_name}", value)

    def text(self) -> str:
        """The content as plain text (text parts joined)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # no obfuscation field is sent either way


class SamplingRequest(BaseModel):
    """The fields the chat and the legacy completions bodies share: the alias, the token limit, sampling,
    streaming and the fields of both that change no output."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(min_length=1, max_length=200)]
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    stop: (
        Annotated[str, Field(max_length=256)]
        | Annotated[list[Annotated[str, Field(max_length=256)]], Field(min_length=1, max_length=4)]
        | None
    ) = None
    seed: Annotated[int, Field(ge=-(2**63), le=2**63 - 1)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # An extension (vLLM's): KV blocks are reused only between requests with the same salt, so one
    # tenant's end users cannot learn each other's prompts from the time to first token.
    cache_salt: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    # Accepted and ignored: it changes no output, and keeps a caller on one side of a canary.
    user: Annotated[str, Field(max_length=256)] | None = None
    # Not implemented: refused unless 1 (each body's table in schemas.openai_params).
    n: Annotated[int, Field(ge=1, le=128, strict=True)] | None = None  # strict: true is not 1

    def caller_limit(self) -> int | None:
        """The completion's token limit the caller named, if any."""
        return self.max_tokens

    def completion_limit(self, default: int) -> int:
        """The caller's limit, else the gateway's default."""
        return self.caller_limit() or default

    def wants_usage_chunk(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def json_format(self) -> JsonObjectFormat | JsonSchemaFormat | None:
        """The JSON the completion is held to; None for plain text."""
        return None


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=describe_unsupported(""))

    messages: Annotated[list[Message], Field(min_length=1, max_length=1024)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None

    # Accepted and ignored: they change no output.
    store: bool | None = None
    metadata: (
        Annotated[
            dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
            Field(max_length=16),
        ]
        | None
    ) = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = None
    prompt_cache_retention: Literal["in-memory", "24h"] | None = None
    safety_identifier: Annotated[str, Field(max_length=64)] | None = None
    parallel_tool_calls: bool | None = None  # a no-op while no tools are accepted

    # text, or JSON held to a schema by constrained decoding (schemas.response_format)
    response_format: ResponseFormat | None = None

    # Not implemented: refused unless the value is a no-op (schemas.openai_params.UNSUPPORTED).
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[AnyObject] | None = None
    tool_choice: Literal["none", "auto", "required"] | AnyObject | None = None
    functions: list[AnyObject] | None = None
    function_call: Literal["none", "auto"] | AnyObject | None = None
    audio: AnyObject | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    prediction: AnyObject | None = None
    web_search_options: AnyObject | None = None
    reasoning_effort: Annotated[str, Field(max_length=32)] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None

    @field_validator(*unsupported_fields(""))
    @classmethod
    def _refuse_unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        return supported(str(info.field_name), value)

    def caller_limit(self) -> int | None:
        """max_completion_tokens, else the deprecated max_tokens."""
        return self.max_completion_tokens or self.max_tokens

    def json_format(self) -> JsonObjectFormat | JsonSchemaFormat | None:
        return None if isinstance(self.response_format, TextFormat) else self.response_format


class PromptTokensDetails(BaseModel):
    """OpenAI's usage.prompt_tokens_details: cached_tokens came from the replica's prefix cache."""

    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None
    annotations: list[dict[str, Any]] = Field(default_factory=list)


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    """One SSE event; `usage` is null except on the last chunk when stream_options.include_usage is set."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    """One alias the caller can use; parent is the served base (vLLM's lineage field)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    parent: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
