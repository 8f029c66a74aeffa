"""OpenAI Chat Completions and Models bodies as the public gateway speaks them.

Requests: `model` is the caller's alias (tenant/name:label); max_completion_tokens wins over the deprecated
max_tokens. A field outside OpenAI's spec is refused, as OpenAI refuses it (extra="forbid", at every level),
and so is a value of a parameter lorafleet has not implemented (schemas.openai_params.UNSUPPORTED), so no
request's meaning changes silently. Fields that change no output (store, metadata, service_tier, user,
prompt_cache_key, prompt_cache_retention, safety_identifier, a message's name,
stream_options.include_obfuscation) are checked for shape and ignored. Function tools are
schemas.openai_tools'. Responses follow
openapi.yaml's CreateChatCompletionResponse, CreateChatCompletionStreamResponse and ListModelsResponse;
errors use schemas.api.ErrorBody, built by schemas.openai_params.request_error.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from schemas.openai_params import describe_unsupported, supported, unsupported_fields
from schemas.openai_tools import (
    MAX_TOOLS,
    NamedToolChoice,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolMode,
    choice_problem,
    tools_problem,
)
from schemas.response_format import (
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaSpec,
    ResponseFormat,
    TextFormat,
)
from schemas.tool_format import call_schema

Role = Literal["developer", "system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length"]
ChatFinishReason = Literal["stop", "length", "tool_calls"]  # tool_calls: the answer ended with its calls

MAX_CHOICES = 8  # the largest n a request may ask for: each choice holds its own KV blocks and a batch row
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs; a legacy completion's logprobs stops at 5, as OpenAI's does

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
    # null only in an assistant message that made tool calls
    content: str | Annotated[list[ContentPart], Field(min_length=1)] | None = None
    name: str | None = None
    tool_call_id: Annotated[str, Field(max_length=256)] | None = None  # the call a tool message answers
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOLS)] | None = None  # [] as none
    function_call: AnyObject | None = None
    audio: AnyObject | None = None
    refusal: str | None = None
    # what an answer's message carries back when a client appends it to the conversation: ignored
    annotations: Annotated[list[AnyObject], Field(max_length=1024)] | None = None

    @field_validator(*unsupported_fields("messages[]."))
    @classmethod
    def _refuse_unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        return supported(f"messages[].{info.field_name}", value)

    @model_validator(mode="after")
    def _content_or_calls(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise PydanticCustomError("invalid_message", "only an assistant message carries tool_calls")
        if self.content is None and not self.tool_calls:
            raise PydanticCustomError(
                "invalid_message", "content is required unless the message has tool_calls"
            )
        return self

    def text(self) -> str:
        """The content as plain text (text parts joined; none: empty)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
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
    # Choices sampled from the one prompt, each with its own seed (choice 0 keeps the request's seed).
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES, strict=True)] | None = None  # strict: true is not 1

    def caller_limit(self) -> int | None:
        """The completion's token limit the caller named, if any."""
        return self.max_tokens

    def completion_limit(self, default: int) -> int:
        """The caller's limit, else the gateway's default."""
        return self.caller_limit() or default

    def wants_usage_chunk(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def choices(self) -> int:
        return self.n or 1

    def logprob_alternatives(self) -> int | None:
        """How many alternatives each token's logprobs list; None when the caller asked for no logprobs."""
        return None

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

    # Function tools (schemas.openai_tools): shown to the model, its calls read back from the answer.
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolMode | NamedToolChoice | None = None  # default: "auto" with tools, else "none"
    parallel_tool_calls: bool | None = None  # false: an answer's first call only

    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS, strict=True)] | None = None

    # text, or JSON held to a schema by constrained decoding (schemas.response_format)
    response_format: ResponseFormat | None = None

    # Not implemented: refused unless the value is a no-op (schemas.openai_params.UNSUPPORTED).
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

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("logprobs") is not True:
            raise ValueError("logprobs must be true when top_logprobs is given")
        return value

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, tools: list[Tool] | None) -> list[Tool] | None:
        problem = tools_problem(tools) if tools else None
        if problem is not None:
            raise PydanticCustomError("invalid_tools", problem)
        return tools

    @field_validator("tool_choice")
    @classmethod
    def _check_tool_choice(cls, choice: ToolMode | NamedToolChoice | None, info: ValidationInfo) -> Any:
        problem = choice_problem(info.data.get("tools"), choice) if choice is not None else None
        if problem is not None:
            raise PydanticCustomError("invalid_tool_choice", problem)
        return choice

    def tool_mode(self) -> ToolMode | NamedToolChoice:
        """tool_choice as it applies: "none" without tools, "auto" when tools came without a choice."""
        if not self.tools:
            return "none"
        return self.tool_choice or "auto"

    def caller_limit(self) -> int | None:
        """max_completion_tokens, else the deprecated max_tokens."""
        return self.max_completion_tokens or self.max_tokens

    def logprob_alternatives(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("response_format")
    @classmethod
    def _format_or_required_call(cls, fmt: ResponseFormat | None, info: ValidationInfo) -> Any:
        choice = info.data.get("tool_choice")
        required = bool(info.data.get("tools")) and choice not in (None, "none", "auto")
        if required and fmt is not None and not isinstance(fmt, TextFormat):
            raise PydanticCustomError(
                "invalid_response_format", "a JSON response_format cannot go with a required tool call"
            )
        return fmt

    def json_format(self) -> JsonObjectFormat | JsonSchemaFormat | None:
        """The JSON the answer is held to: one call of the required function(s), else response_format's."""
        mode = self.tool_mode()
        if mode == "required" or isinstance(mode, NamedToolChoice):
            name = mode.function.name if isinstance(mode, NamedToolChoice) else None
            schema = call_schema([t.shown() for t in self.tools or []], name)
            return JsonSchemaFormat(
                type="json_schema", json_schema=JsonSchemaSpec(name="tool_call", schema=schema)
            )
        return None if isinstance(self.response_format, TextFormat) else self.response_format


class PromptTokensDetails(BaseModel):
    """OpenAI's usage.prompt_tokens_details: cached_tokens came from the replica's prefix cache."""

    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class TopLogprob(BaseModel):
    """One candidate token: its text, its logprob and its text's UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    """A generated token's logprob and the most likely tokens at its position (most likely first)."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    """A choice's logprobs: one entry per generated token."""

    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # null when the answer is only tool calls
    refusal: None = None
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: ChatFinishReason


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
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: ChatFinishReason | None = None


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
