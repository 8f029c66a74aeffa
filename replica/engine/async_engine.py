"""AsyncEngine: runs LLMEngine.step in a thread and gives each request an async stream of StepOutputs.

The event loop never runs the model: the server stays responsive while a step runs. Adds and aborts are
queued to the engine thread and applied between steps; a cancelled stream aborts its request, which frees
its KV row and adapter pin before the next step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator

from replica.engine.engine import LLMEngine, StepOutput
from replica.engine.grammar_mask import Grammar
from replica.engine.sampler import SamplingParams
from replica.engine.trace import AdmissionTrace

log = logging.getLogger(__name__)


class AsyncEngine:
    """Thread-backed front of LLMEngine for asyncio callers."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[tuple[str, tuple]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[StepOutput]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._counter = 0
        self._lock = threading.Lock()
        self._step_end = 0.0  # perf_counter() when the last step ended (engine thread)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="replica-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def next_request_id(self) -> str:
        with self._lock:
            self._counter += 1
            return f"req-{self._counter}"

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        adapter_id: str | None = None,
        request_id: str | None = None,
        trace: AdmissionTrace | None = None,
        tenant_id: str | None = None,
        cache_salt: str | None = None,
        grammar: Grammar | None = None,
    ) -> AsyncGenerator[StepOutput, None]:
        """Stream this request's outputs; leaving the iteration early cancels the request."""
        self.engine.check_request(prompt_token_ids, params)  # bad input fails here, before any event
        request_id = request_id or self.next_request_id()
        stream: asyncio.Queue[StepOutput] = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), stream)
        if trace is not None:
            trace.queued = time.perf_counter()
        args = (request_id, prompt_token_ids, params, adapter_id, trace, tenant_id, cache_salt, grammar)
        self._commands.put(("add", args))
        self._wake.set()
        finished = False
        try:
            while not finished:
                out = await stream.get()
                finished = out.finished
                yield out
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._commands.put(("abort", (request_id,)))
                self._wake.set()

    def interrupt(self, request_id: str, reason: str, message: str) -> bool:
        """End a running request's stream now with a failed output (finish_reason `reason`) and abort it in
        the engine. Call from the event loop; False when the request has no open stream."""
        target = self._streams.get(request_id)
        if target is None:
            return False
        target[1].put_nowait(StepOutput(request_id, None, "", True, reason, 0, 0, message))
        self._commands.put(("abort", (request_id,)))
        self._wake.set()
        return True

    def _deliver(self, outputs: list[StepOutput]) -> None:
        """Hand a step's outputs to their streams: one thread-safe wake-up per event loop, not per output."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[StepOutput], StepOutput]]] = {}
        for out in outputs:
            target = self._streams.get(out.request_id)
            if target is not None:
                batches.setdefault(target[0], []).append((target[1], out))
        for loop, batch in batches.items():
            loop.call_soon_threadsafe(_put_all, batch)

    def _apply_commands(self) -> None:
        while True:
            try:
                kind, args = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "abort":
                self.engine.abort(*args)
                continue
            request_id, trace = args[0], args[4]
            if trace is not None:
                trace.picked = time.perf_counter()
                trace.boundary = min(trace.picked, max(trace.queued, self._step_end))
            try:
                self.engine.add_request(*args)
            except Exception as exc:  # checked before queueing; a late failure still ends that stream only
                self._deliver([StepOutput(request_id, None, "", True, "error", len(args[1]), 0, str(exc))])

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._apply_commands()
            if not self.engine.has_work():
                self._wake.wait()  # set by every add, abort and stop: no idle timer to wait out
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # never let one bad step kill the engine: fail the running requests
                log.exception("engine step failed")
                outputs = self.engine.fail_running(f"engine error: {exc}")
            self._step_end = time.perf_counter()
            self._deliver(outputs)


def _put_all(batch: list[tuple[asyncio.Queue[StepOutput], StepOutput]]) -> None:
    """On the event loop: one step's outputs into their streams."""
    for stream, out in batch:
        stream.put_nowait(out)
