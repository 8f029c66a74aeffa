"""The gateway↔replica contract models: the NDJSON line format, what a line may not be, and the state body."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from schemas.api import ErrorDetail
from schemas.events import ReplicaState, ReplicaStateBody, parse_event
from schemas.openai import Usage
from schemas.replica_api import (
    STREAM_EVENT,
    DoneEvent,
    ErrorEvent,
    GenerateRequest,
    StateResponse,
    TokenEvent,
    encode_event,
)

USAGE = Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8)
HASH = "sha256:" + "ab" * 32

EVENTS: list[TokenEvent | DoneEvent | ErrorEvent] = [
    TokenEvent(token_id=42, text="Hé"),
    TokenEvent(token_id=7, text=""),
    DoneEvent(finish_reason="stop", text=" 世界", usage=USAGE),
    DoneEvent(finish_reason="length", text="", usage=USAGE),
    ErrorEvent(
        error=ErrorDetail(message="engine step failed", type="server_error", code="generation_failed")
    ),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.type)
def test_a_line_is_one_json_object_that_parses_back_to_the_same_event(
    event: TokenEvent | DoneEvent | ErrorEvent,
) -> None:
    line = encode_event(event)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert STREAM_EVENT.validate_json(line) == event


def test_lines_keep_the_field_names_order_and_raw_utf8_replicas_have_always_written() -> None:
    token, _, done, _, error = (encode_event(e) for e in EVENTS)
    assert list(json.loads(token).items()) == [
        ("type", "token"),
        ("token_id", 42),
        ("text", "Hé"),
        ("index", 0),
        ("logprobs", None),
    ]
    assert "Hé".encode() in token  # not \u-escaped
    assert list(json.loads(done)) == ["type", "finish_reason", "text", "usage", "index"]
    # a replica from before n and logprobs writes neither: its token line is choice 0's, without logprobs
    before = STREAM_EVENT.validate_json(b'{"type":"token","token_id":42,"text":"x"}')
    assert isinstance(before, TokenEvent) and (before.index, before.logprobs) == (0, None)
    assert json.loads(done)["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    # a replica from before the prefix cache writes no details: its line still parses, with none cached
    old = b'{"type":"done","finish_reason":"stop","text":"","usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}'
    assert STREAM_EVENT.validate_json(old).usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    assert json.loads(error) == {
        "type": "error",
        "error": {
            "message": "engine step failed",
            "type": "server_error",
            "param": None,
            "code": "generation_failed",
        },
    }


def test_lines_from_replicas_that_write_spaced_json_still_parse() -> None:
    # A rolling upgrade: replicas that wrote json.dumps(..., ensure_ascii=False) lines.
    for event in EVENTS:
        spaced = json.dumps(event.model_dump(), ensure_ascii=False).encode()
        assert STREAM_EVENT.validate_json(spaced) == event


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[]",
        b'{"token_id": 1, "text": "a"}',
        b'{"type": "tokens", "token_id": 1, "text": "a"}',
        b'{"type": "token", "text": "a"}',
        b'{"type": "token", "token_id": "1", "text": "a"}',
        b'{"type": "token", "token_id": -1, "text": "a"}',
        b'{"type": "token", "token_id": 1, "text": null}',
        b'{"type": "token", "token_id": 1, "text": "a", "logprob": -0.1}',
        b'{"type": "token", "token_id": 1, "text": "\xff"}',
        b'{"type": "done", "finish_reason": "error", "text": "", '
        b'"usage": {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}}',
        b'{"type": "done", "finish_reason": "stop", "text": ""}',
        b'{"type": "error", "error": "boom"}',
    ],
)
def test_a_line_outside_the_contract_is_refused(line: bytes) -> None:
    with pytest.raises(ValidationError):
        STREAM_EVENT.validate_json(line)


def test_generate_request_refuses_unknown_fields_and_loose_types() -> None:
    assert (
        GenerateRequest.model_validate_json(b'{"prompt_token_ids": [1], "temperature": 0}').temperature == 0
    )
    for bad in (b'{"prompt_token_ids": [1], "top_k": 5}', b'{"prompt_token_ids": [1], "max_tokens": "8"}'):
        with pytest.raises(ValidationError):
            GenerateRequest.model_validate_json(bad)


def test_the_state_body_and_replica_state_are_one_model() -> None:
    event = ReplicaState(
        replica_id="r1",
        url="http://127.0.0.1:9001",
        gpu_adapters=["a"],
        ram_adapters=["a", "b"],
        disk_adapters=["c"],
        gpu_slots=4,
        queue_depth=2,
        tokens_in_flight=300,
        evictions_per_min=1.5,
        loads_per_min=3.0,
    )
    body = StateResponse.of(event, HASH)
    wire = StateResponse.model_validate_json(body.model_dump_json())
    assert set(StateResponse.model_fields) == set(ReplicaStateBody.model_fields) | {"base_model_hash"}
    again = wire.replica_state()
    shared = set(ReplicaStateBody.model_fields)
    assert again.model_dump(include=shared) == event.model_dump(include=shared)
    assert parse_event(again.to_bytes(), "replica.state") == again
