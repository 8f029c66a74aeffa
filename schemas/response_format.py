"""response_format on POST /v1/chat/completions, as the gateway takes it and passes it to the replica.

`{"type": "text"}` asks for nothing; `{"type": "json_object"}` asks for any JSON object;
`{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}` asks for JSON that
validates against the schema. The replica enforces the JSON ones by constrained decoding, so `strict` is
accepted and every answer is held to the schema either way. SchemaLimits bounds what a schema may cost;
schema_problem is the one check of those bounds, and canonical_json the one spelling a cache keys on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

_BODY = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)


class TextFormat(BaseModel):
    model_config = _BODY
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = _BODY
    type: Literal["json_object"]


class JsonSchemaSpec(BaseModel):
    """The schema a json_schema answer follows (OpenAI's ResponseFormatJsonSchema.json_schema)."""

    model_config = _BODY
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    # `schema` as OpenAI spells it; the attribute name keeps clear of BaseModel's own `schema`
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(BaseModel):
    model_config = _BODY
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


_TAGS = {"text": "Text", "json_object": "JsonObject", "json_schema": "JsonSchema"}


def _tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return _TAGS.get(kind) if isinstance(kind, str) else None


# Tags in capitals: an error's location skips them (schemas.openai_params.param_path), so it reads
# response_format.json_schema.name, never response_format.json_schema.json_schema.name.
ResponseFormat = Annotated[
    Annotated[TextFormat, Tag("Text")]
    | Annotated[JsonObjectFormat, Tag("JsonObject")]
    | Annotated[JsonSchemaFormat, Tag("JsonSchema")],
    Discriminator(
        _tag,
        custom_error_type="invalid_response_format",
        custom_error_message="type must be text, json_object or json_schema",
    ),
]

# json_object: any JSON object, as a schema the grammar engine compiles like any other
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def constraint_schema(fmt: TextFormat | JsonObjectFormat | JsonSchemaFormat | None) -> dict[str, Any] | None:
    """The JSON schema the answer is held to; None when the format asks for plain text."""
    if isinstance(fmt, JsonSchemaFormat):
        return fmt.json_schema.json_schema
    if isinstance(fmt, JsonObjectFormat):
        return ANY_OBJECT
    return None


@dataclass(frozen=True)
class SchemaLimits:
    """What one schema may cost before any GPU work: its canonical JSON size, its nesting and its compile."""

    max_bytes: int = 32_768
    max_depth: int = 32  # nested objects and arrays, the outermost counting 1
    compile_timeout_s: float = 5.0


def canonical_json(schema: dict[str, Any]) -> str:
    """One spelling per schema whatever its key order or spacing."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def nesting_depth(value: Any) -> int:
    """How deep objects and arrays nest in value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def schema_problem(schema: dict[str, Any], limits: SchemaLimits) -> str | None:
    """Why the schema is over a limit, or None when it is within them."""
    depth = nesting_depth(schema)  # first: serialising a very deep schema would recurse
    if depth > limits.max_depth:
        return f"the schema nests {depth} levels deep; the limit is {limits.max_depth}"
    size = len(canonical_json(schema).encode())
    if size > limits.max_bytes:
        return f"the schema is {size} bytes; the limit is {limits.max_bytes}"
    return None
