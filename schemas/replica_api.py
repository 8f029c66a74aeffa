"""The gateway↔replica contract: the replica's internal HTTP API, whose one production caller is the gateway.

POST /internal/replicas/{replica_id}/generate takes a GenerateRequest. A request refused before any token
is answered with an ErrorBody (schemas.api) and a 4xx/5xx status; an accepted one is answered 200 with an
NDJSON stream (application/x-ndjson): one StreamEvent per line, named by its `type`, in this order:
    {"type":"token","token_id":123,"text":"Hel","index":0}        any number; text may be ""
    {"type":"done","finish_reason":"stop","text":"...","usage":{...},"index":0}   a choice's last line
    {"type":"error","error":{"message":...,"type":...,"param":...,"code":...}}  last line of a failed one
A request asks for n choices (index 0 to n-1); their lines interleave, each choice's in order, and the
stream ends after every choice's done line (or at the first error line). A "length" finish sends its last
token as a token line, and done.text is "". A "stop" finish sends no line for the token that stopped it;
done.text is the rest of the text. A choice's text is the concatenation of its tokens' text and its
done.text; its done.usage counts the prompt and that choice's tokens. A token line carries `logprobs` when
the request asked for them. A stream that ends before every choice is done has lost its replica. Lines
are written by encode_event and read by STREAM_EVENT.validate_json; anything else on a line is a protocol
error.

POST /internal/drain takes an optional DrainRequest and answers a DrainResponse: the replica publishes
replica.state with status draining, refuses new requests (503, code "replica_draining"), finishes the
running ones (ending any still running at the deadline with an error line of that code) and exits.

Responses carry x-request-id, and for adapter requests x-adapter-id and x-adapter-tier (gpu | ram | disk |
remote: where the adapter was when the request arrived).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, TypeAdapter, model_validator

from schemas.api import ErrorDetail
from schemas.events import ReplicaState, ReplicaStateBody
from schemas.ids import AdapterId, Sha256, TenantId
from schemas.openai import (
    MAX_CHOICES,
    MAX_TOP_LOGPROBS,
    FinishReason,
    LogitBias,
    Penalty,
    TokenLogprob,
    Usage,
)
from schemas.openai_tools import CallRecord, FunctionSpec
from schemas.response_format import ResponseFormat

_CONTRACT = ConfigDict(extra="forbid", frozen=True, strict=True)

ChatRole = Literal["system", "user", "assistant", "tool"]


class ChatMessage(BaseModel):
    """One message for the replica's chat template (the gateway maps OpenAI's developer role to system): an
    assistant message may carry the tool calls it made, a tool message the id of the call it answers."""

    model_config = _CONTRACT
    role: ChatRole
    content: str
    tool_calls: list[CallRecord] | None = None
    tool_call_id: str | None = None


class RequiredTool(BaseModel):
    """tool_choice naming one function."""

    model_config = _CONTRACT
    name: str


class GenerateRequest(BaseModel):
    """A prompt (exactly one of chat messages, raw text or token ids), the adapter to use (None = base), the
    tenant whose fair share of the replica it counts against (None = no tenant) and sampling.

    messages go through the model's chat template; prompt is tokenized as it is (the tokenizer's own special
    tokens added, as a legacy completion's prompt is); prompt_token_ids are used as given."""

    model_config = _CONTRACT

    messages: list[ChatMessage] | None = None
    # Functions shown to the model with messages (schemas.tool_format); "required" or a RequiredTool adds
    # that a call must be made (the gateway also constrains the answer to one).
    tools: list[FunctionSpec] | None = None
    tool_choice: Literal["auto", "required"] | RequiredTool = "auto"
    prompt: str | None = Field(default=None, min_length=1)
    prompt_token_ids: list[int] | None = None
    adapter_id: AdapterId | None = None
    tenant_id: TenantId | None = None
    request_id: str | None = Field(default=None, max_length=128)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: LogitBias | None = None  # token id (a decimal string, as OpenAI writes it) -> bias
    max_tokens: int = Field(default=256, ge=1)
    # True when max_tokens is the gateway's default, not the caller's: the replica lowers it (as it does a
    # max_tokens left out) to what the context leaves after the prompt. Otherwise a prompt plus max_tokens
    # over the context is refused (400 context_length_exceeded).
    max_tokens_is_default: bool = False
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    # KV blocks are shared only between requests of the same adapter version and the same salt
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    # choices sampled from the one prompt; choice i > 0 draws with a seed derived from (seed, i)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    # None: no logprobs; k: each token's logprob and the k most likely tokens' (the processed logits')
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    # JSON answers: constrained decoding holds the completion to the schema (schemas.response_format)
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateRequest:
        given = [f for f in (self.messages, self.prompt, self.prompt_token_ids) if f is not None]
        if len(given) != 1:
            raise ValueError("send exactly one of messages, prompt or prompt_token_ids")
        if self.tools is not None and self.messages is None:
            raise ValueError("tools go with messages")
        return self

    def tool_requirement(self) -> str | bool:
        """The function a call must name, True for any one, False when the model chooses."""
        if isinstance(self.tool_choice, RequiredTool):
            return self.tool_choice.name
        return self.tool_choice == "required"


class TokenEvent(BaseModel):
    """One generated token and the text it adds (empty while a multi-byte character is incomplete)."""

    model_config = _CONTRACT
    type: Literal["token"] = "token"
    token_id: NonNegativeInt
    text: str
    index: NonNegativeInt = 0  # the choice
    logprobs: TokenLogprob | None = None


class DoneEvent(BaseModel):
    """The request finished: why, the text not yet sent in token lines, and the token counts."""

    model_config = _CONTRACT
    type: Literal["done"] = "done"
    finish_reason: FinishReason
    text: str
    usage: Usage
    index: NonNegativeInt = 0  # the choice


class ErrorEvent(BaseModel):
    """The request failed after its stream started; OpenAI's error object."""

    model_config = _CONTRACT
    type: Literal["error"] = "error"
    error: ErrorDetail


StreamEvent = Annotated[TokenEvent | DoneEvent | ErrorEvent, Field(discriminator="type")]
STREAM_EVENT: TypeAdapter[TokenEvent | DoneEvent | ErrorEvent] = TypeAdapter(StreamEvent)


def encode_event(event: TokenEvent | DoneEvent | ErrorEvent) -> bytes:
    """One NDJSON line: the event's JSON (fields in declaration order, UTF-8 unescaped) and a newline."""
    return (event.model_dump_json() + "\n").encode()


class LoadRequest(BaseModel):
    """POST .../adapters/{adapter_id}/load (optional body): the base_model_hash from the registration."""

    model_config = _CONTRACT
    base_model_hash: Sha256 | None = None


class LoadResponse(BaseModel):
    """The adapter holds a GPU slot of this rank bucket; load_ms is how long it took to get there."""

    model_config = _CONTRACT
    adapter_id: AdapterId
    tier: Literal["gpu"]
    rank_bucket: int
    load_ms: float


class DrainRequest(BaseModel):
    """POST /internal/drain (optional body): stop taking requests, finish the running ones, then exit.

    Requests still running after deadline_s end with an ErrorEvent (code "replica_draining"); None means
    the replica's configured drain deadline."""

    model_config = _CONTRACT
    deadline_s: float | None = Field(default=None, gt=0)


class DrainResponse(BaseModel):
    """The replica is draining (repeating the call changes nothing): requests in flight, and the deadline."""

    model_config = _CONTRACT
    replica_id: str
    status: Literal["draining"] = "draining"
    in_flight: NonNegativeInt
    deadline_s: float


class UnloadResponse(BaseModel):
    """POST .../adapters/{adapter_id}/unload: the adapter is gone from every tier of this replica."""

    model_config = _CONTRACT
    adapter_id: AdapterId
    unloaded: bool


class StateResponse(ReplicaStateBody):
    """GET .../state: what replica.state reports (merged_adapter_id included), plus the base checkpoint."""

    base_model_hash: Sha256

    @classmethod
    def of(cls, state: ReplicaStateBody, base_model_hash: str) -> StateResponse:
        """The state body around a replica.state event (or any ReplicaStateBody)."""
        return cls(
            **{name: getattr(state, name) for name in ReplicaStateBody.model_fields},
            base_model_hash=base_model_hash,
        )

    def replica_state(self) -> ReplicaState:
        """The replica.state event this body reports (a fresh envelope)."""
        return ReplicaState(**{name: getattr(self, name) for name in ReplicaStateBody.model_fields})
