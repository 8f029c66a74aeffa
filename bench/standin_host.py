"""Many calibrated stand-in replicas in one process: each with its own port, replica id and identity key.

Each one registers its address as a replica does (replica.control.registration), answers the generate
protocol (bench.standin.accept) with tokens timed by its modeled GPU (bench.standin_model: sim.timing's
calibration format, the brief's speeds by default; GPU slots, RAM and disk with their load times), applies
replica.commands through the replica's own CommandHandler and consume_commands in a consumer group of its
own, and publishes signed replica.state through the replica's publish_state, with the tiers it models.
Each response's x-adapter-tier is the tier its adapter was found in.

The model's clock runs `slow` times slower than the wall: at slow 4, a step the model times at 40 ms takes
160 ms, so a fleet fed a quarter of the brief's rate sees the brief's load per replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from bench.standin import _LINES, _prompt_tokens, accept
from bench.standin_http import Connection, Request, Stream, serve_http
from bench.standin_model import ModeledReplica
from lorafleet.config import PlatformSettings
from lorafleet.dead_letters import DeadLetters
from lorafleet.kafka import make_consumer, make_producer
from lorafleet.profile import DEV_TOKEN
from lorafleet.state_signature import state_key
from replica.adapter_cache.cache import CacheState
from replica.adapter_cache.tier import Tier
from replica.control.commands import CommandHandler, consume_commands
from replica.control.identity import identity_key
from replica.control.registration import register_until_done
from replica.control.state_publisher import Load, build_state, publish_state
from schemas import principals
from schemas.events import ReplicaState
from schemas.openai import Usage
from schemas.replica_api import DoneEvent, GenerateRequest, encode_event
from schemas.topics import REPLICA_COMMANDS
from sim.replica import CacheSizes
from sim.timing import TimingModel, load_timing

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostConfig:
    replica_ids: tuple[str, ...]
    ports: tuple[int, ...]  # one each, in the same order
    service_token: str
    timing: TimingModel
    sizes: CacheSizes
    slow: float = 1.0  # wall seconds per model second
    state_interval_s: float = 1.0
    host: str = "127.0.0.1"
    # counts each request's prompt as the replica would, so the model prefills the client's lengths; None:
    # about four bytes a token
    tokenizer: Tokenizer | None = None


class StreamSink:
    """A request's tokens as NDJSON lines on its chunked response (opened once the tier is known; the model
    sends nothing before its next step boundary, which comes after)."""

    def __init__(self, done_line: bytes, first: Callable[[], None]) -> None:
        self.done_line = done_line
        self.first = first  # called at the first token
        self.stream: Stream | None = None

    def token(self, index: int) -> None:
        assert self.stream is not None
        if index == 0:
            self.first()
        self.stream.write(_LINES[index % len(_LINES)])

    def done(self) -> None:
        assert self.stream is not None
        self.stream.write(self.done_line)
        self.stream.end()


class HostedStandin:
    """One stand-in replica: its model on the loop's clock, its HTTP handler and its cache for commands."""

    def __init__(self, replica_id: str, url: str, config: HostConfig) -> None:
        self.replica_id, self.url, self.config = replica_id, url, config
        self.expected = f"Bearer {config.service_token}".encode()
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.t0_unix = time.time()  # model time 0 on the wall clock, for readers that keep a warm-up apart
        self.model = ModeledReplica(replica_id, config.timing, config.sizes, self._schedule)
        self.owned: set[str] = set()
        # (arrival, seconds from it to the first token), model seconds, for each request that got one
        self.ttfts: list[tuple[float, float]] = []

    def now(self) -> float:
        """Model seconds since the start."""
        return (self.loop.time() - self.t0) / self.config.slow

    def _schedule(self, t: float, kind: int, payload: object) -> None:
        self.loop.call_at(self.t0 + t * self.config.slow, self.model.dispatch, kind, payload, t)

    def handle(self, req: Request, conn: Connection) -> None:
        if req.method == "GET" and req.path in ("/stats", "/cache"):  # what the fleet benchmark polls
            answer = self.report() if req.path == "/stats" else self.model.contents()
            conn.respond(200, {"content-type": "application/json"}, json.dumps(answer).encode())
            return
        body = accept(req, conn, self.expected, self.replica_id)
        if body is not None:
            self._generate(conn, body)

    def _generate(self, conn: Connection, body: GenerateRequest) -> None:
        n, prompt = body.max_tokens, _prompt_tokens(body, self.config.tokenizer)
        usage = Usage(prompt_tokens=prompt, completion_tokens=n, total_tokens=prompt + n)
        done = encode_event(DoneEvent(finish_reason="length", text="", usage=usage))
        # a base-model request has no adapter to find: it is modeled as one always on the GPU
        adapter_id = body.adapter_id or ""
        if not adapter_id:
            self.model.own("", "gpu", self.now())
        arrived = self.now()
        sink = StreamSink(done, lambda: self.ttfts.append((arrived, self.now() - arrived)))
        tier = self.model.submit(adapter_id, prompt, n, arrived, sink)
        headers = {"content-type": "application/x-ndjson", "x-request-id": body.request_id or "standin"}
        if body.adapter_id is not None:
            headers |= {"x-adapter-id": body.adapter_id, "x-adapter-tier": tier}
        sink.stream = conn.open_stream(headers)
        sink.stream.cancel.append(lambda: self.model.cancel(sink))

    # the cache side, for the replica's command handler and state publisher

    async def own(self, adapter_id: str, target: Tier = "ram") -> Tier:
        self.owned.add(adapter_id)
        return self.model.own(adapter_id, target, self.now())

    async def unload(self, adapter_id: str, drain_timeout_s: float = 600.0) -> bool:
        self.owned.discard(adapter_id)
        return self.model.unload(adapter_id, self.now())

    def state(self) -> CacheState:
        return self.model.cache_state(self.now())

    def replica_state(self) -> ReplicaState:
        tiers = self.state()
        warm = len(
            self.owned.intersection(tiers.ram_adapters).union(self.owned.intersection(tiers.gpu_adapters))
        )
        batch = self.model.sim.batch()
        load = Load(
            batch.waiting,
            self.model.tokens_in_flight(),
            running=batch.running,
            max_running=self.model.max_running(),
            prefill_tokens=batch.prefill_tokens,
        )
        return build_state(
            self.replica_id,
            self.url,
            "ready",
            self,
            self.config.sizes.gpu_slots,
            load,
            owned_adapters=len(self.owned),
            warm_adapters=warm,
        )

    def report(self) -> dict[str, object]:
        return {
            "replica_id": self.replica_id,
            "served": self.model.served,
            "found": dict(self.model.found),
            # [arrival, time to first token] pairs, model seconds; arrival a was at t0_unix + a * slow (wall)
            "t0_unix": self.t0_unix,
            "slow": self.config.slow,
            "ttft_s": [[round(a, 4), round(t, 4)] for a, t in self.ttfts],
            "model_ttft_s": [[round(a, 4), round(t, 4)] for a, t in self.model.model_ttfts],
        }


async def _run_one(
    standin: HostedStandin,
    platform: PlatformSettings,
    letters: DeadLetters,
    producer: AIOKafkaProducer,
    stop: asyncio.Event,
) -> None:
    """Register, then consume commands and publish state until stop (the replica's control loop)."""
    key = identity_key(platform.data_dir / "replica-identity" / f"{standin.replica_id}.key")
    await register_until_done(platform.database_url, standin.replica_id, standin.url, key, stop)
    consumer = make_consumer(platform, REPLICA_COMMANDS.name, group_id=f"replica-{standin.replica_id}")
    await consumer.start()
    try:
        handler = CommandHandler(standin, standin.replica_id, letters)
        interval = standin.config.state_interval_s
        await asyncio.gather(
            consume_commands(consumer, handler, stop),
            publish_state(producer, standin.replica_state, stop, interval, signing_key=state_key(key)),
        )
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()


async def run_host(config: HostConfig, stop: asyncio.Event) -> list[HostedStandin]:
    """Serve every stand-in until stop; their reports come back."""
    platform = PlatformSettings().as_service(principals.REPLICA)
    standins = [
        HostedStandin(rid, f"http://{config.host}:{port}", config)
        for rid, port in zip(config.replica_ids, config.ports, strict=True)
    ]
    servers = [
        await serve_http(s.handle, config.host, p) for s, p in zip(standins, config.ports, strict=True)
    ]
    producer = make_producer(platform)
    letters = DeadLetters.own_pool("replica-commands", platform)
    await producer.start()
    try:
        print(json.dumps({"standins": [s.url for s in standins]}), flush=True)  # noqa: T201
        await asyncio.gather(*(_run_one(s, platform, letters, producer, stop) for s in standins))
    finally:
        for server in servers:
            server.close()
        await producer.stop()
        await letters.close()
    return standins


def standin_host(
    replica_id: Annotated[list[str], typer.Option(help="a replica id to host (repeat)")],
    first_port: Annotated[int, typer.Option(help="the first replica's port; the others follow it")] = 18300,
    calibration: Annotated[
        list[Path] | None, typer.Option(help="timing calibration files, as `lorafleet simulate` reads them")
    ] = None,
    slow: Annotated[float, typer.Option(help="wall seconds per model second")] = 1.0,
    gpu_slots: Annotated[int, typer.Option(help="GPU adapter slots per replica")] = CacheSizes().gpu_slots,
    state_interval_s: Annotated[float, typer.Option(help="replica.state period (wall seconds)")] = 1.0,
    service_token: Annotated[
        str, typer.Option(envvar="LORAFLEET_REPLICA_SERVICE_TOKEN", help="callers' bearer token")
    ] = DEV_TOKEN,
    report: Annotated[Path | None, typer.Option(help="writes each stand-in's counts here on exit")] = None,
    tokenizer: Annotated[
        Path | None, typer.Option(help="tokenizer.json that counts prompts (default: about 4 bytes a token)")
    ] = None,
) -> None:
    """Host many calibrated stand-in replicas in one process until SIGTERM (see bench/standin_host.py)."""
    from tokenizers import Tokenizer

    logging.basicConfig(level=logging.WARNING)
    config = HostConfig(
        replica_ids=tuple(replica_id),
        ports=tuple(first_port + i for i in range(len(replica_id))),
        service_token=service_token,
        timing=load_timing(list(calibration or [])),
        sizes=CacheSizes(gpu_slots=gpu_slots),
        slow=slow,
        state_interval_s=state_interval_s,
        tokenizer=Tokenizer.from_file(str(tokenizer)) if tokenizer is not None else None,
    )

    async def main() -> list[HostedStandin]:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        return await run_host(config, stop)

    standins = asyncio.run(main())
    if report is not None:
        report.write_text(json.dumps([s.report() for s in standins]) + "\n")
