"""OpenAI Chat Completions and Models bodies as the public gateway speaks them.

Requests: `model` is the caller's alias (tenant/name:label); n must be 1; max_completion_tokens wins over
the deprecated max_tokens. Unknown fields are ignored, as vLLM does. Responses follow openapi.yaml's
CreateChatCompletionResponse, CreateChatCompletionStreamResponse and ListModelsResponse; errors use
schemas.api.ErrorBody.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["developer", "system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length"]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Role
    content: str | Annotated[list[ContentPart], Field(min_length=1)]
    name: str | None = None

    def text(self) -> str:
        """The content as plain text (text parts joined)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool | None = None


class ChatCompletionRequest(BaseModel):
    """POST /v1/chat/completions."""

    model_config = ConfigDict(extra="ignore")

    model: Annotated[str, Field(min_length=1, max_length=200)]
    messages: Annotated[list[Message], Field(min_length=1, max_length=1024)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] | None = None
    stop: (
        Annotated[str, Field(max_length=256)]
        | Annotated[list[Annotated[str, Field(max_length=256)]], Field(min_length=1, max_length=4)]
        | None
    ) = None
    seed: Annotated[int, Field(ge=-(2**63), le=2**63 - 1)] | None = None
    n: Literal[1] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    # An extension (vLLM's): KV blocks are reused only between requests with the same salt, so one
    # tenant's end users cannot learn each other's prompts from the time to first token.
    cache_salt: Annotated[str, Field(min_length=1, max_length=256)] | None = None

    def completion_limit(self, default: int) -> int:
        """max_completion_tokens, else max_tokens, else the gateway's default."""
        return self.max_completion_tokens or self.max_tokens or default

    def wants_usage_chunk(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


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
