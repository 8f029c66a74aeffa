"""The gateway's one reader of replica generate streams, fed by the replica's own serializer."""

from __future__ import annotations

import pytest

from gateway.errors import BadGateway, GatewayError, ServiceUnavailable
from gateway.public.online import RequestRecord
from gateway.public.upstream.events import completion_events
from gateway.public.upstream.replica_client import UpstreamStream
from replica.stream_events import stream_events
from schemas.replica_api import DoneEvent, TokenEvent
from tests.gateway.public.upstream.replica_lines import failed, outputs, record, replica_bytes, upstream


async def _read(up: UpstreamStream, rec: RequestRecord) -> list[TokenEvent | DoneEvent]:
    return [ev async for ev in completion_events(up, rec)]


@pytest.mark.parametrize("chunk", [0, 1, 3, 64])
@pytest.mark.parametrize(
    ("steps", "text"),
    [
        (outputs(["Hel", "lo", ", 世", "", "界"], "stop", "!"), "Hello, 世界!"),
        (outputs(["a", "b"], "length", "c"), "abc"),
    ],
    ids=["stop", "length"],
)
async def test_what_the_replica_writes_is_what_the_gateway_reads(steps, text: str, chunk: int) -> None:
    written = [e for step in steps for e in stream_events(step)]
    rec = record()
    read = await _read(upstream(replica_bytes(steps), chunk), rec)
    assert read == written
    assert "".join(e.text for e in read) == text
    done = read[-1]
    assert isinstance(done, DoneEvent) and rec.usage == done.usage
    tokens = sum(isinstance(e, TokenEvent) for e in read)
    # every generated token is a token line, except the one that stopped a "stop" finish
    assert done.usage.completion_tokens == tokens + (done.finish_reason == "stop")
    assert rec.completion_tokens_seen == tokens
    assert rec.ttft_s is not None


async def test_a_replica_error_line_ends_the_stream_with_its_code() -> None:
    rec = record()
    seen: list[TokenEvent | DoneEvent] = []
    with pytest.raises(ServiceUnavailable) as err:
        async for ev in completion_events(upstream(replica_bytes(failed(["a", "b"]))), rec):
            seen.append(ev)
    assert [e.text for e in seen] == ["a", "b"]
    assert err.value.code == "generation_failed" and "RuntimeError" in err.value.message


async def test_a_stream_that_stops_before_done_is_a_lost_replica() -> None:
    body = replica_bytes(outputs(["a", "b"], "stop"))
    cut = body[: body.rindex(b'{"type":"done"')]
    with pytest.raises(ServiceUnavailable) as err:
        await _read(upstream(cut), record())
    assert err.value.code == "replica_lost" and err.value.headers == {"Retry-After": "1"}


@pytest.mark.parametrize(
    "line",
    [
        b"<html>502 Bad Gateway</html>",
        b'{"type": "logprobs", "token_id": 1}',
        b'{"type": "token", "token_id": 1}',
        b'{"type": "token", "token_id": 1, "text": "\xc3"}',
        b'{"type": "token", "token_id": 1, "text": "x"',
    ],
)
async def test_a_line_outside_the_contract_is_a_bad_gateway_not_a_skipped_line(line: bytes) -> None:
    good = replica_bytes(outputs(["a", "b"], "stop"))
    first, rest = good.split(b"\n", 1)
    rec = record()
    seen: list[TokenEvent | DoneEvent] = []
    with pytest.raises(BadGateway) as err:
        async for ev in completion_events(upstream(first + b"\n" + line + b"\n" + rest), rec):
            seen.append(ev)
    assert [e.text for e in seen] == ["a"]  # nothing after the bad line is delivered as if it were whole
    assert isinstance(err.value, GatewayError) and err.value.status == 502
    assert err.value.body()["error"]["code"] == "bad_replica_response"
    assert rec.usage is None
