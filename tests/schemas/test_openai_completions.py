"""The legacy completions request body: the prompt forms it serves and refuses, the parameters it shares with
chat, the ones it has not implemented, and the OpenAI error (param, code) each refusal gets."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.api import ErrorDetail
from schemas.openai import TokenLogprob, TopLogprob
from schemas.openai_completions import Completion, CompletionChunk, CompletionLogprobs, CompletionRequest
from schemas.openai_params import COMPLETIONS_UNSUPPORTED, request_error
from schemas.replica_api import ChatMessage, GenerateRequest

BASE: dict[str, Any] = {"model": "acme/support:prod", "prompt": "Once upon a time"}


def parsed(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate_json(json.dumps(BASE | fields))


def refusal(**fields: Any) -> ErrorDetail:
    with pytest.raises(ValidationError) as exc:
        parsed(**fields)
    return request_error(exc.value.errors(include_url=False))


# (body fields, the refused param): one case for each COMPLETIONS_UNSUPPORTED entry, with no no-op value
UNSUPPORTED_CASES: list[tuple[dict[str, Any], str]] = [
    ({"prompt": ["one", "two"]}, "prompt"),
    ({"echo": True}, "echo"),
    ({"suffix": " the end."}, "suffix"),
    ({"best_of": 2}, "best_of"),
]


def test_every_unsupported_entry_has_a_case() -> None:
    assert {param for _, param in UNSUPPORTED_CASES} == set(COMPLETIONS_UNSUPPORTED)


@pytest.mark.parametrize(("fields", "param"), UNSUPPORTED_CASES, ids=[p for _, p in UNSUPPORTED_CASES])
def test_an_unimplemented_parameter_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    error = refusal(**fields)
    assert (error.param, error.code, error.type) == (param, "unsupported_parameter", "invalid_request_error")
    assert f"'{param}' is not supported by this server" in error.message


@pytest.mark.parametrize("prompt", [["a"], [1, 2, 3], [[1, 2], [3]]], ids=["strings", "tokens", "batches"])
def test_only_a_single_prompt_string_is_served(prompt: list[Any]) -> None:
    error = refusal(prompt=prompt)
    assert (error.param, error.code) == ("prompt", "unsupported_parameter")
    assert "accepts only a string" in error.message


@pytest.mark.parametrize(
    "fields",
    [{"echo": False}, {"best_of": 1}, {"suffix": None, "echo": None}],
)
def test_a_no_op_value_of_an_unimplemented_parameter_is_accepted(fields: dict[str, Any]) -> None:
    parsed(**fields)


def test_the_fields_shared_with_chat_are_honoured() -> None:
    body = parsed(
        max_tokens=7,
        temperature=0,
        top_p=0.5,
        seed=3,
        stop=["\n"],
        presence_penalty=1,
        frequency_penalty=-1,
        logit_bias={"5": 10},
        user="u-1",
        cache_salt="s",
        stream=True,
        stream_options={"include_usage": True},
    )
    assert body.text() == "Once upon a time" and body.completion_limit(256) == 7
    assert body.caller_limit() == 7 and body.wants_usage_chunk()
    assert parsed().completion_limit(256) == 256 and parsed().caller_limit() is None


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"messages": [{"role": "user", "content": "Hi"}]}, "messages", "unknown_parameter"),
        ({"max_completion_tokens": 5}, "max_completion_tokens", "unknown_parameter"),  # chat's only
        ({"top_k": 5}, "top_k", "unknown_parameter"),
        ({"prompt": ""}, "prompt", "invalid_parameter"),
        ({"prompt": 7}, "prompt", "invalid_parameter"),
        ({"temperature": 5}, "temperature", "invalid_parameter"),
        ({"logprobs": 6}, "logprobs", "invalid_parameter"),
        ({"logprobs": True}, "logprobs", "invalid_parameter"),
        ({"n": 9}, "n", "invalid_parameter"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_parameter"),
    ],
)
def test_a_field_outside_the_spec_or_its_range_is_refused(
    fields: dict[str, Any], param: str, code: str
) -> None:
    error = refusal(**fields)
    assert (error.param, error.code) == (param, code)


def test_a_missing_prompt_is_refused_by_name() -> None:
    with pytest.raises(ValidationError) as exc:
        CompletionRequest.model_validate({"model": "acme/support:prod"})
    assert request_error(exc.value.errors(include_url=False)).param == "prompt"


def test_the_answers_are_openai_s_text_completion_objects() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    whole = Completion.model_validate(
        {
            "id": "cmpl-1",
            "created": 1,
            "model": "m",
            "choices": [{"text": "Hi", "finish_reason": "stop"}],
            "usage": usage,
        }
    )
    assert whole.model_dump()["object"] == "text_completion"
    assert whole.model_dump()["choices"] == [
        {"text": "Hi", "index": 0, "logprobs": None, "finish_reason": "stop"}
    ]
    chunk = CompletionChunk.model_validate(
        {"id": "cmpl-1", "created": 1, "model": "m", "choices": [{"text": "H"}]}
    )
    assert (
        chunk.object == "text_completion" and chunk.choices[0].finish_reason is None and chunk.usage is None
    )


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"prompt": "Hi", "messages": [ChatMessage(role="user", content="Hi")]},
        {"prompt": "Hi", "prompt_token_ids": [1]},
        {"prompt": ""},
    ],
    ids=["none", "prompt-and-messages", "prompt-and-ids", "empty"],
)
def test_the_replica_contract_takes_exactly_one_prompt(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        GenerateRequest(**fields)


def test_the_replica_contract_carries_a_raw_prompt() -> None:
    body = GenerateRequest(prompt="Once upon a time", max_tokens=4)
    assert GenerateRequest.model_validate_json(body.model_dump_json()) == body
    assert body.messages is None and body.prompt_token_ids is None


def test_logprobs_and_n_are_honoured() -> None:
    body = parsed(logprobs=5, n=3)
    assert (body.logprob_alternatives(), body.choices()) == (5, 3)
    assert (parsed(logprobs=0).logprob_alternatives(), parsed().logprob_alternatives()) == (0, None)


def test_legacy_logprobs_list_each_token_its_top_and_its_offset() -> None:
    entries = [
        TokenLogprob(token="Hel", logprob=-0.5, top_logprobs=[TopLogprob(token="Hel", logprob=-0.5)]),
        TokenLogprob(token="lo", logprob=-1.0, top_logprobs=[TopLogprob(token="p", logprob=-0.7)]),
    ]
    assert CompletionLogprobs.of(entries, 4).model_dump() == {
        "tokens": ["Hel", "lo"],
        "token_logprobs": [-0.5, -1.0],
        "top_logprobs": [{"Hel": -0.5}, {"p": -0.7}],
        "text_offset": [4, 7],
    }
