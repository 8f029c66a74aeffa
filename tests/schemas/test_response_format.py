"""response_format: the bodies the gateway takes and passes on, the schema limits and the canonical key."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.openai import ChatCompletionRequest
from schemas.openai_params import request_error
from schemas.replica_api import GenerateRequest
from schemas.response_format import (
    ANY_OBJECT,
    JsonSchemaFormat,
    SchemaLimits,
    canonical_json,
    constraint_schema,
    nesting_depth,
    schema_problem,
)

BASE: dict[str, Any] = {"model": "acme/support:prod", "messages": [{"role": "user", "content": "Hi"}]}
SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


def chat(response_format: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate_json(json.dumps(BASE | {"response_format": response_format}))


def test_a_json_schema_reaches_the_replica_as_sent() -> None:
    body = chat({"type": "json_schema", "json_schema": {"name": "point", "schema": SCHEMA, "strict": True}})
    fmt = body.json_format()
    assert isinstance(fmt, JsonSchemaFormat) and constraint_schema(fmt) == SCHEMA
    wire = GenerateRequest(prompt="x", response_format=fmt).model_dump_json(exclude_none=True)
    assert json.loads(wire)["response_format"]["json_schema"]["schema"] == SCHEMA
    assert GenerateRequest.model_validate_json(wire).response_format == fmt


def test_json_object_asks_for_any_object_and_text_for_nothing() -> None:
    assert constraint_schema(chat({"type": "json_object"}).json_format()) == ANY_OBJECT
    assert chat({"type": "text"}).json_format() is None


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ({"type": "xml"}, "response_format"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "a b"}}, "response_format.json_schema.name"),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": []}},
            "response_format.json_schema.schema",
        ),
        ({"type": "json_object", "extra": 1}, "response_format.extra"),
    ],
)
def test_a_malformed_response_format_is_refused_by_its_path(response_format: object, param: str) -> None:
    with pytest.raises(ValidationError) as exc:
        chat(response_format)
    assert request_error(exc.value.errors(include_url=False)).param == param


def test_nesting_depth_counts_objects_and_arrays() -> None:
    assert nesting_depth(3) == 0
    assert nesting_depth({}) == 1
    assert nesting_depth({"a": [1, {"b": []}]}) == 4


def test_a_schema_over_a_limit_says_which() -> None:
    limits = SchemaLimits(max_bytes=40, max_depth=3)
    assert schema_problem({"type": "object"}, limits) is None
    assert "bytes" in (schema_problem({"description": "x" * 40}, limits) or "")
    assert "levels" in (schema_problem({"a": {"b": {"c": {}}}}, limits) or "")


def test_canonical_json_ignores_key_order_and_spacing() -> None:
    assert canonical_json({"b": 1, "a": [2, {"d": 3, "c": 4}]}) == canonical_json(
        json.loads('{ "a": [2, {"c": 4, "d": 3}], "b": 1 }')
    )
