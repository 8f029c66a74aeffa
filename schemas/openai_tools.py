"""OpenAI's function tools as the public gateway takes and answers them, and their contract with the replica.

A request's `tools` are function definitions whose `parameters` is a JSON schema (an object schema, or left
out for a function without arguments). `tool_choice` is "none" (no call; the tools are not shown), "auto"
(the model may call), "required" (it must call one) or a named function (it must call that one). A
conversation's assistant messages may carry the calls they made and `tool` messages their results, each
naming its call by tool_call_id. Answers carry `tool_calls` with arguments as a JSON string, as OpenAI's do.
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

MAX_TOOLS = 128  # OpenAI's own limit
FunctionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
ToolMode = Literal["none", "auto", "required"]


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: FunctionName
    description: Annotated[str, Field(max_length=8192)] | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; left out: the function takes no arguments
    strict: bool | None = None  # calls always follow the schema where it binds them (tool_choice)


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=describe_unsupported("tools[]."))
    type: Literal["function", "custom"]  # custom (free-form input) tools are refused by name
    function: FunctionDefinition | None = None
    custom: dict[str, Any] | None = None

    @field_validator(*unsupported_fields("tools[]."))
    @classmethod
    def _refuse_unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        return supported(f"tools[].{info.field_name}", value)

    @model_validator(mode="after")
    def _function_given(self) -> Tool:
        if self.function is None:
            raise PydanticCustomError("missing", "a function tool needs its function")
        return self

    @property
    def spec(self) -> FunctionDefinition:
        """The function (every accepted tool has one)."""
        assert self.function is not None
        return self.function

    def shown(self) -> FunctionSpec:
        """The function as the model is shown it."""
        f = self.spec
        return FunctionSpec(name=f.name, description=f.description, parameters=f.parameters)


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: FunctionName


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: FunctionName
    arguments: Annotated[str, Field(max_length=1_000_000)]  # JSON text, as the model wrote it


class ToolCall(BaseModel):
    """A call in an answer, or in an earlier assistant message of the conversation."""

    model_config = ConfigDict(extra="forbid")
    id: Annotated[str, Field(min_length=1, max_length=256)]
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    """A streamed piece of a call; the client joins the pieces of one index."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


def tools_problem(tools: list[Tool]) -> str | None:
    """Why a request's tools cannot be shown to a model, else None."""
    names = [t.spec.name for t in tools]
    if len(set(names)) != len(names):
        return "two tools have the same name"
    for tool in tools:
        params = tool.spec.parameters
        if params is not None and params.get("type", "object") != "object":
            return f"the parameters of {tool.spec.name!r} must be an object schema"
    return None


def choice_problem(tools: list[Tool] | None, choice: ToolMode | NamedToolChoice) -> str | None:
    """Why tool_choice cannot go with tools, else None."""
    names = {t.spec.name for t in tools or []}
    if choice != "none" and not names:
        return "tool_choice needs tools"
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        return f"tool_choice names {choice.function.name!r}, which is not in tools"
    return None


# The replica's side: what its chat template renders, and what the gateway reads back.


class FunctionSpec(BaseModel):
    """One function the model is shown (the gateway's Tool, flattened)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class CallRecord(BaseModel):
    """A call an earlier assistant message made, for the chat template."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    id: str
    name: str
    arguments: str  # JSON text
