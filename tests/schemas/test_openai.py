"""The chat request body: what it honours, what it accepts and ignores, what it refuses, and the OpenAI error
(param, code) each refusal gets from request_error."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.api import ErrorDetail
from schemas.openai import ChatCompletionRequest
from schemas.openai_params import UNSUPPORTED, param_path, request_error
from schemas.replica_api import GenerateRequest

BASE: dict[str, Any] = {"model": "acme/support:prod", "messages": [{"role": "user", "content": "Hi"}]}


def parsed(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate_json(json.dumps(BASE | fields))


def refusal(**fields: Any) -> ErrorDetail:
    with pytest.raises(ValidationError) as exc:
        parsed(**fields)
    return request_error(exc.value.errors(include_url=False))


def message(**fields: Any) -> dict[str, Any]:
    return {"role": "user", "content": "Hi"} | fields


# (body fields, the refused param): one case for each UNSUPPORTED entry, with a value that is no no-op
UNSUPPORTED_CASES: list[tuple[dict[str, Any], str]] = [
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"verbosity": "low"}, "verbosity"),
    ({"messages": [message(role="assistant", function_call={"name": "f"})]}, "messages[0].function_call"),
    ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f"}, "custom": {}}]}, "tools[0].custom"),
    ({"messages": [message(role="assistant", audio={"id": "a1"})]}, "messages[0].audio"),
    ({"messages": [message(), message(role="assistant", refusal="no")]}, "messages[1].refusal"),
    (
        {"messages": [message(content=[{"type": "image_url", "image_url": {"url": "https://x/y.png"}}])]},
        "messages[0].content[0].type",
    ),
]


def test_every_unsupported_entry_has_a_case() -> None:
    assert {re.sub(r"\[\d+\]", "[]", param) for _, param in UNSUPPORTED_CASES} == set(UNSUPPORTED)


@pytest.mark.parametrize(("fields", "param"), UNSUPPORTED_CASES, ids=[p for _, p in UNSUPPORTED_CASES])
def test_an_unimplemented_parameter_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    error = refusal(**fields)
    assert (error.param, error.code, error.type) == (param, "unsupported_parameter", "invalid_request_error")
    assert f"'{param}' is not supported by this server" in error.message


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "text"}},
        {"tools": []},
        {"tool_choice": "none"},
        {"functions": []},
        {"function_call": "none"},
        {"modalities": ["text"]},
        {"n": None, "tools": None, "logprobs": None, "audio": None, "top_logprobs": None},
        {"messages": [message(role="assistant", tool_calls=[], refusal=None)]},
    ],
)
def test_a_no_op_value_of_an_unimplemented_parameter_is_accepted(fields: dict[str, Any]) -> None:
    parsed(**fields)


def test_fields_that_change_no_output_are_accepted() -> None:
    body = parsed(
        store=True,
        metadata={f"k{i}": "v" * 512 for i in range(16)},
        service_tier="flex",
        user="u-1",
        prompt_cache_key="conversation-7",
        prompt_cache_retention="24h",
        safety_identifier="s" * 64,
        parallel_tool_calls=False,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
        messages=[message(role="tool", tool_call_id="call_1", content="42")],
    )
    assert body.wants_usage_chunk() and body.messages[0].text() == "42"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"metadata": {"k": "v" * 513}}, "metadata"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"service_tier": "cheapest"}, "service_tier"),
        ({"safety_identifier": "s" * 65}, "safety_identifier"),
        ({"store": [True]}, "store"),
    ],
)
def test_a_no_op_field_of_the_wrong_shape_is_refused(fields: dict[str, Any], param: str) -> None:
    error = refusal(**fields)
    assert (error.param, error.code) == (param, "invalid_parameter")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"foo": 1}, "foo"),
        ({"Top-K": 5}, "Top-K"),
        ({"top_k": 5}, "top_k"),  # the engine has it; OpenAI's spec does not
        ({"messages": [message(foo=1)]}, "messages[0].foo"),
        ({"messages": [message(), message(content=[{"type": "text", "text": "x", "cache": 1}])]}, "messages[1].content[0].cache"),
        ({"stream_options": {"include_usage": True, "continuous_usage_stats": True}}, "stream_options.continuous_usage_stats"),
    ],
)  # fmt: skip
def test_a_field_outside_the_spec_is_refused_by_its_path(fields: dict[str, Any], param: str) -> None:
    error = refusal(**fields)
    assert (error.param, error.code) == (param, "unknown_parameter")
    assert error.message == f"Unrecognized request argument supplied: {param}"


def test_the_cache_salt_extension_is_kept() -> None:
    assert parsed(cache_salt="user-42").cache_salt == "user-42"


def test_penalties_and_logit_bias_are_honoured_within_openai_s_ranges() -> None:
    bias = {str(i): (-100.0 if i % 2 else 100.0) for i in range(300)}
    body = parsed(presence_penalty=-2, frequency_penalty=2.0, logit_bias=bias)
    assert (body.presence_penalty, body.frequency_penalty, body.logit_bias) == (-2.0, 2.0, bias)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"presence_penalty": 2.01}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"logit_bias": {"5": 100.5}}, "logit_bias"),
        ({"logit_bias": {"5": -101}}, "logit_bias"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ({"logit_bias": {"007": 1}}, "logit_bias"),  # the same id as "7": two keys could name one token
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ({"logit_bias": [[5, 1]]}, "logit_bias"),
    ],
)
def test_penalties_and_logit_bias_outside_their_ranges_are_refused(
    fields: dict[str, Any], param: str
) -> None:
    error = refusal(**fields)
    assert (error.param, error.code) == (param, "invalid_parameter")


def test_the_replica_contract_takes_the_same_ranges() -> None:
    ok = GenerateRequest.model_validate_json(
        '{"prompt_token_ids": [1], "presence_penalty": 2, "logit_bias": {"5": -100}}'
    )
    assert ok.presence_penalty == 2.0 and ok.logit_bias == {"5": -100.0}
    for bad in ('"frequency_penalty": 2.5', '"logit_bias": {"05": 1}', '"logit_bias": {"5": 101}'):
        with pytest.raises(ValidationError):
            GenerateRequest.model_validate_json('{"prompt_token_ids": [1], ' + bad + "}")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": [message(content=7)]}, "messages[0].content"),
        ({"messages": [message(content=[{"type": "text"}])]}, "messages[0].content[0].text"),
        ({"messages": [message(role="robot")]}, "messages[0].role"),
    ],
)
def test_an_invalid_value_names_its_deepest_path(fields: dict[str, Any], param: str) -> None:
    error = refusal(**fields)
    assert (error.param, error.code) == (param, "invalid_parameter") and error.message.startswith(param)


def test_an_unimplemented_parameter_is_reported_before_other_errors() -> None:
    error = refusal(temperature=5, foo=1, functions=[{"name": "f"}])
    assert error.param == "functions"
    assert refusal(temperature=5, foo=1).param == "foo"


@pytest.mark.parametrize(("raw", "code"), [(b'{"model": ', "invalid_json"), (b"[1, 2]", "invalid_parameter")])
def test_a_body_that_is_not_a_json_object_names_no_param(raw: bytes, code: str) -> None:
    with pytest.raises(ValidationError) as exc:
        ChatCompletionRequest.model_validate_json(raw)
    error = request_error(exc.value.errors(include_url=False))
    assert (error.param, error.code) == (None, code)


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        (("messages", 0, "content", "list[ContentPart]", 2, "type"), "messages[0].content[2].type"),
        (("stop", "constrained-str"), "stop"),
        (("stop", "list[constrained-str]", 1), "stop[1]"),
        (("logit_bias", "abc", "[key]"), "logit_bias"),
        (("metadata", "model"), "metadata"),
        (("tool_choice", "literal['none','auto','required']"), "tool_choice"),
        ((), None),
    ],
)  # fmt: skip
def test_a_location_becomes_openai_s_param_path(loc: tuple[int | str, ...], path: str | None) -> None:
    assert param_path(loc) == path


def test_fastapi_locations_lose_their_source() -> None:
    errors = [{"type": "extra_forbidden", "loc": ("body", "messages", 0, "foo"), "msg": "Extra inputs"}]
    assert request_error(errors, from_request=True).param == "messages[0].foo"
    assert request_error(errors).param == "body.messages[0].foo"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 20}, 20),
        ({"logprobs": False}, None),
        ({}, None),
    ],
)
def test_logprobs_ask_for_the_chosen_token_and_top_logprobs_alternatives(
    fields: dict[str, Any], expected: int | None
) -> None:
    assert parsed(**fields).logprob_alternatives() == expected


@pytest.mark.parametrize(
    "fields",
    [{"top_logprobs": 2}, {"logprobs": False, "top_logprobs": 2}, {"logprobs": None, "top_logprobs": 0}],
)
def test_top_logprobs_without_logprobs_is_refused_naming_top_logprobs(fields: dict[str, Any]) -> None:
    error = refusal(**fields)
    assert (error.param, error.code, error.type) == (
        "top_logprobs",
        "invalid_parameter",
        "invalid_request_error",
    )
    assert "logprobs must be true" in error.message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"n": 9}, "n"),
        ({"n": 0}, "n"),
        ({"n": True}, "n"),
    ],
)
def test_top_logprobs_past_20_and_n_past_the_cap_are_refused(fields: dict[str, Any], param: str) -> None:
    assert (refusal(**fields).param, refusal(**fields).code) == (param, "invalid_parameter")


def test_n_up_to_the_cap_is_accepted() -> None:
    assert [parsed(n=n).choices() for n in (1, 8)] == [1, 8] and parsed().choices() == 1
