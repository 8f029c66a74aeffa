"""n choices and logprobs over one replica stream: each choice's chunks carry its index and its tokens'
logprobs in the endpoint's shape, and the usage counts the prompt once and every choice's tokens."""

from __future__ import annotations

import json

from gateway.public.online import RequestRecord
from gateway.public.upstream.chat_response import CHAT_SHAPE, TEXT_SHAPE, completion_response, sse_chunks
from replica.engine.engine import StepOutput
from replica.engine.logprobs import TokenLogprobs
from replica.stream_events import stream_events
from schemas.replica_api import encode_event
from tests.gateway.public.upstream.replica_lines import PROMPT_TOKENS, record, upstream

SPELL = {100: "Hel", 101: "lo", 102: "!", 200: "Bye", 201: "."}


def _choice(ids: list[int], reason: str) -> list[StepOutput]:
    """A choice's outputs, every token with its logprob and one alternative."""
    out = []
    for i, t in enumerate(ids):
        lp = TokenLogprobs(-0.25 * (i + 1), ((t, -0.25 * (i + 1)), (102, -3.0)))
        last = i == len(ids) - 1
        out.append(
            StepOutput("r", t, SPELL[t], last, reason if last else None, PROMPT_TOKENS, i + 1, logprobs=lp)
        )
    return out


def _body() -> bytes:
    """Two choices, their lines interleaved as the replica sends them."""
    first, second = _choice([100, 101, 102], "length"), _choice([200, 201], "length")
    order = [(0, first[0]), (1, second[0]), (0, first[1]), (1, second[1]), (0, first[2])]
    return b"".join(
        encode_event(e) for i, o in order for e in stream_events(o, i, lambda t: SPELL[t].encode())
    )


class Finished:
    def __init__(self) -> None:
        self.calls: list[tuple[RequestRecord, str]] = []

    async def __call__(self, rec: RequestRecord, status: str, code: str | None) -> None:
        self.calls.append((rec, status))


async def test_a_whole_chat_completion_has_every_choice_its_logprobs_and_the_summed_usage() -> None:
    finished, rec = Finished(), record()
    resp = await completion_response(rec, upstream(_body(), chunk=9), "m", {}, finished, CHAT_SHAPE, 2, True)
    body = json.loads(bytes(resp.body))
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["message"]["content"] for c in body["choices"]] == ["Hello!", "Bye."]
    content = body["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == ["Hel", "lo", "!"]
    assert content[0] == {
        "token": "Hel",
        "logprob": -0.25,
        "bytes": list(b"Hel"),
        "top_logprobs": [
            {"token": "Hel", "logprob": -0.25, "bytes": list(b"Hel")},
            {"token": "!", "logprob": -3.0, "bytes": [33]},
        ],
    }
    assert body["usage"]["prompt_tokens"] == PROMPT_TOKENS and body["usage"]["completion_tokens"] == 5
    assert body["usage"]["total_tokens"] == PROMPT_TOKENS + 5
    assert finished.calls == [(rec, "ok")] and rec.usage is not None and rec.usage.completion_tokens == 5


async def test_a_whole_text_completion_has_openais_legacy_logprobs_per_choice() -> None:
    resp = await completion_response(record(), upstream(_body()), "m", {}, Finished(), TEXT_SHAPE, 2, True)
    choices = json.loads(bytes(resp.body))["choices"]
    assert [c["text"] for c in choices] == ["Hello!", "Bye."]
    assert choices[1]["logprobs"] == {
        "tokens": ["Bye", "."],
        "token_logprobs": [-0.25, -0.5],
        "top_logprobs": [{"Bye": -0.25, "!": -3.0}, {".": -0.5, "!": -3.0}],
        "text_offset": [0, 3],
    }


async def _stream(shape, usage: bool = True) -> list[dict]:  # type: ignore[no-untyped-def]
    frames = [
        f async for f in sse_chunks(record(), upstream(_body(), chunk=5), "m", usage, Finished(), shape, 2)
    ]
    assert frames[-1] == b"data: [DONE]\r\n\r\n"
    return [json.loads(f[len(b"data: ") : -4]) for f in frames[:-1]]


async def test_streamed_chat_chunks_carry_each_choices_index_role_logprobs_and_finish() -> None:
    chunks = await _stream(CHAT_SHAPE)
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    by_index: dict[int, list[dict]] = {0: [], 1: []}
    for c in chunks:
        (choice,) = c["choices"]
        by_index[choice["index"]].append(choice)
    for index, text in ((0, "Hello!"), (1, "Bye.")):
        seen = by_index[index]
        assert seen[0]["delta"]["role"] == "assistant"
        assert all(s["delta"].get("role") is None for s in seen[1:])
        assert "".join(s["delta"].get("content") or "" for s in seen) == text
        assert seen[-1]["finish_reason"] == "length"
        tokens = [e["token"] for s in seen if s["logprobs"] for e in s["logprobs"]["content"]]
        assert "".join(tokens) == text


async def test_streamed_text_chunks_carry_offsets_into_their_own_choices_text() -> None:
    chunks = await _stream(TEXT_SHAPE, usage=False)
    offsets: dict[int, list[int]] = {0: [], 1: []}
    for c in chunks:
        (choice,) = c["choices"]
        if choice["logprobs"]:
            offsets[choice["index"]] += choice["logprobs"]["text_offset"]
    assert offsets == {0: [0, 3, 5], 1: [0, 3]}


async def test_a_line_for_a_choice_the_request_has_not_is_a_bad_gateway() -> None:
    finished = Finished()
    frames = [f async for f in sse_chunks(record(), upstream(_body()), "m", False, finished, CHAT_SHAPE, 1)]
    assert frames[-1].startswith(b"event: error") and b"bad_replica_response" in frames[-1]
    assert finished.calls[0][1] == "error"
