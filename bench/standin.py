"""The stand-in replica: the replica's generate protocol and state publishing, with tokens on a clock.

It is the load generator's counterpart for `lorafleet bench gateway`, run as its own process. It answers
POST /internal/replicas/{replica_id}/generate like replica.server: the service token, a GenerateRequest
body, then 200 and NDJSON lines written by schemas.replica_api.encode_event, with x-request-id,
x-adapter-id and x-adapter-tier. Instead of a model it sends max_tokens token lines, the first ttft_s after
the request arrives and the rest every 1/token_rate s on a fixed schedule, then a "length" done line. It
publishes replica.state (status ready, its adapters on GPU, its tokens in flight) every state_interval_s
through the platform's producer, so a real gateway discovers it and routes to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError

from bench.standin_http import Connection, Request, Stream, serve_http
from lorafleet.config import PlatformSettings
from lorafleet.kafka import make_producer
from lorafleet.profile import DEV_TOKEN
from lorafleet.state_signature import SIGNATURE_HEADER, sign, state_key
from replica.control.identity import identity_key
from replica.control.registration import register_until_done
from schemas import principals
from schemas.api import ErrorBody, ErrorDetail
from schemas.events import ReplicaState
from schemas.openai import Usage
from schemas.replica_api import DoneEvent, GenerateRequest, TokenEvent, encode_event

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

# Token texts cycled through: plain words, a newline, a quote and multi-byte characters.
VOCAB = tuple(' the| quick| brown| fox| jumps| over| a| "lazy"| dog|.|\n| 世界| é'.split("|"))
_LINES = tuple(encode_event(TokenEvent(token_id=100 + i, text=t)) for i, t in enumerate(VOCAB))
_JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class StandinConfig:
    replica_id: str
    host: str
    port: int
    service_token: str
    adapters: tuple[str, ...]
    token_rate: float  # tokens per second per stream
    ttft_s: float  # from the request's arrival to its first token
    state_interval_s: float

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _error(
    conn: Connection, status: int, code: str, message: str, kind: str = "invalid_request_error"
) -> None:
    body = ErrorBody(error=ErrorDetail(message=message, type=kind, code=code)).model_dump_json()
    conn.respond(status, _JSON, body.encode())


def _prompt_tokens(body: GenerateRequest, tokenizer: Tokenizer | None = None) -> int:
    """The messages' tokens under the served model's tokenizer, or about four bytes a token without one,
    plus a few for each message's template."""
    if body.prompt_token_ids is not None:
        return len(body.prompt_token_ids)
    if tokenizer is None:
        return sum(len(m.content.encode()) // 4 + 4 for m in body.messages or ())
    messages = body.messages or ()
    return sum(len(tokenizer.encode(m.content, add_special_tokens=False).ids) + 4 for m in messages)


def accept(req: Request, conn: Connection, expected: bytes, replica_id: str) -> GenerateRequest | None:
    """The generate request's body, or None once an answer went out (health, a wrong path, token or body)."""
    if req.method == "GET" and req.path == "/health":
        conn.respond(200, _JSON, b'{"status":"ok"}')
        return None
    if not req.path.startswith("/internal/replicas/"):
        _error(conn, 404, "not_found", "Not Found")
        return None
    auth = req.headers.get("authorization", "").encode()
    if not hmac.compare_digest(auth, expected):
        _error(conn, 401, "invalid_service_token", "missing or invalid service token", "authentication_error")
        return None
    if req.method != "POST" or req.path != f"/internal/replicas/{replica_id}/generate":
        _error(conn, 404, "wrong_replica", f"this is replica {replica_id!r}")
        return None
    try:
        return GenerateRequest.model_validate_json(req.body)
    except ValidationError as exc:
        _error(conn, 400, "invalid_request", f"invalid request: {exc.errors()[0]['msg']}")
        return None


class Standin:
    """The request handler and its streams in flight."""

    def __init__(self, config: StandinConfig) -> None:
        self.config = config
        self.expected = f"Bearer {config.service_token}".encode()
        self.remaining: dict[int, int] = {}  # id(stream) -> tokens still to send
        self.requests = 0

    def tokens_in_flight(self) -> int:
        return sum(self.remaining.values())

    def handle(self, req: Request, conn: Connection) -> None:
        body = accept(req, conn, self.expected, self.config.replica_id)
        if body is None:
            return
        self.requests += 1
        request_id = body.request_id or f"standin-{self.requests}"
        headers = {"content-type": "application/x-ndjson", "x-request-id": request_id}
        if body.adapter_id is not None:
            headers |= {"x-adapter-id": body.adapter_id, "x-adapter-tier": "gpu"}
        self._schedule(conn.open_stream(headers), body)

    def _schedule(self, stream: Stream, body: GenerateRequest) -> None:
        """Every token line at its time on the clock, then the done line with the last token."""
        loop = asyncio.get_running_loop()
        n, prompt = body.max_tokens, _prompt_tokens(body)
        usage = Usage(prompt_tokens=prompt, completion_tokens=n, total_tokens=prompt + n)
        done = encode_event(DoneEvent(finish_reason="length", text="", usage=usage))
        key = id(stream)
        self.remaining[key] = n
        start = loop.time() + self.config.ttft_s
        step = 1.0 / self.config.token_rate

        def send(i: int) -> None:
            if stream.closed:
                return
            stream.write(_LINES[i % len(_LINES)] + (done if i == n - 1 else b""))
            self.remaining[key] = n - i - 1
            if i == n - 1:
                self.remaining.pop(key, None)
                stream.end()
                return
            timer[0] = loop.call_at(start + (i + 1) * step, send, i + 1)

        def cut() -> None:
            timer[0].cancel()
            self.remaining.pop(key, None)

        timer = [loop.call_at(start, send, 0)]
        stream.cancel.append(cut)


async def _publish_states(config: StandinConfig, standin: Standin, stop: asyncio.Event) -> None:
    """replica.state every interval until stop, like a replica's control loop; a failed send is logged."""
    platform = PlatformSettings().as_service(principals.REPLICA)
    # the gateway routes only to registered addresses, like a replica's own start-up row
    key = identity_key(platform.data_dir / "replica-identity" / f"{config.replica_id}.key")
    await register_until_done(platform.database_url, config.replica_id, config.url, key, stop)
    producer = make_producer(platform)
    await producer.start()
    try:
        while not stop.is_set():
            state = ReplicaState(
                replica_id=config.replica_id,
                url=config.url,
                status="ready",
                gpu_adapters=list(config.adapters),
                gpu_slots=max(1, len(config.adapters)),
                tokens_in_flight=standin.tokens_in_flight(),
                owned_adapters=len(config.adapters),
                warm_adapters=len(config.adapters),
            )
            value = state.to_bytes()
            signed = [(SIGNATURE_HEADER, sign(state_key(key), value))]  # as a replica signs its own
            try:
                await producer.send(state.topic.name, value, key=state.key().encode(), headers=signed)
            except Exception:  # noqa: BLE001 - keep serving; the next tick retries
                log.exception("could not publish replica state")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), config.state_interval_s)
    finally:
        await producer.stop()


async def run_standin(config: StandinConfig) -> None:
    """Serve and publish until SIGTERM or SIGINT."""
    standin = Standin(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await serve_http(standin.handle, config.host, config.port)
    publisher = asyncio.create_task(_publish_states(config, standin, stop))
    print(json.dumps({"standin": config.replica_id, "url": config.url}), flush=True)  # noqa: T201
    try:
        await stop.wait()
    finally:
        server.close()
        stop.set()
        await publisher


def standin(
    replica_id: Annotated[str, typer.Option(help="the id it publishes and answers to")] = "bench-standin",
    port: Annotated[int, typer.Option()] = 18190,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    service_token: Annotated[
        str, typer.Option(envvar="LORAFLEET_REPLICA_SERVICE_TOKEN", help="callers' bearer token")
    ] = DEV_TOKEN,
    adapter: Annotated[list[str] | None, typer.Option(help="adapter ids it reports on GPU (repeat)")] = None,
    token_rate: Annotated[float, typer.Option(help="tokens per second per stream")] = 100.0,
    ttft_ms: Annotated[float, typer.Option(help="delay before each request's first token")] = 0.0,
    state_interval_s: Annotated[float, typer.Option(help="replica.state period")] = 0.5,
) -> None:
    """Serve the replica's generate protocol with paced tokens and no model (see bench/standin.py)."""
    logging.basicConfig(level=logging.WARNING)
    config = StandinConfig(
        replica_id=replica_id,
        host=host,
        port=port,
        service_token=service_token,
        adapters=tuple(adapter or ()),
        token_rate=token_rate,
        ttft_s=ttft_ms / 1000.0,
        state_interval_s=state_interval_s,
    )
    asyncio.run(run_standin(config))
