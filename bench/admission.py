"""Replica admission: where a generate request's time goes before its first prefill step, per stage.

Starts a real replica process (`lorafleet replica serve`, the prepared SmolLM2 unless --model-dir) and sends
chat requests (max_tokens 1) straight to its generate endpoint. The replica stamps each request's stages
(replica/engine/trace.py) into lorafleet_replica_admission_seconds{stage}; the bench scrapes /metrics around
each probe, so one probe's stage times are the histogram sums' differences. Idle first, then under load:
--streams concurrent background streams decoding, none of them being admitted while a probe is measured.
Beside the idle probes, interleaved with them in this process and on a second thread as in the replica: the
same forward pass (ModelRunner on the bare model), and one step of the replica's own engine assembled as the
replica assembles it; their ratio is the engine's cost over the forward, and prefill/bare the process's.
Medians over --repeats; prints JSON.

    .venv/bin/python -m lorafleet.cli bench admission [--quick] [--out .data/bench/admission.json]
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench._util import median
from harness.env import SMALL_LORA_SLOTS, SMALL_REPLICA_ENV
from lorafleet.profile import DEV_PROFILE_ENV
from replica.engine.trace import STAGES
from schemas.replica_api import STREAM_EVENT, TokenEvent

METRIC = "lorafleet_replica_admission_seconds"
TOKEN = "bench-admission-token"
REPLICA_ID = "bench-admission"
SETTLE_S = 0.1  # between the bare forward and a probe: neither process's idle CPU threads overlap the other
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")


@dataclass(frozen=True)
class AdmissionBenchConfig:
    prompt_tokens: tuple[int, ...] = (31, 231)
    repeats: int = 15
    streams: int = 4  # background streams under load
    stream_tokens: int = 128  # tokens per background request
    model_dir: Path | None = None
    startup_timeout_s: float = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stage_sums(metrics_text: str) -> dict[str, tuple[float, float]]:
    """stage -> (count, sum) of the admission histogram in a /metrics page."""
    out: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != METRIC:
            continue
        counts = {s.labels["stage"]: s.value for s in family.samples if s.name.endswith("_count")}
        sums = {s.labels["stage"]: s.value for s in family.samples if s.name.endswith("_sum")}
        out = {stage: (counts[stage], sums[stage]) for stage in counts}
    return out


def one_request(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float] | None:
    """Each stage's seconds for the one request observed between two scrapes; None unless exactly one was."""
    got: dict[str, float] = {}
    for stage in STAGES:
        c0, s0 = before.get(stage, (0.0, 0.0))
        c1, s1 = after.get(stage, (0.0, 0.0))
        if c1 - c0 != 1:
            return None
        got[stage] = s1 - s0
    return got


def prompt_for(tokens: int, count: Callable[[str], int]) -> tuple[str, int]:
    """A user message whose templated prompt has about `tokens` tokens, and its exact count."""
    words, best = 1, ("", 0)
    while True:
        text = " ".join(WORDS[i % len(WORDS)] for i in range(words))
        n = count(text)
        if abs(n - tokens) < abs(best[1] - tokens) or not best[0]:
            best = (text, n)
        if n >= tokens:
            return best
        words += 1


class BareForward:
    """The replica's prefill forward (ModelRunner + greedy pick) on an unwrapped model in this process."""

    def __init__(self, model_dir: Path) -> None:
        import torch

        from replica.engine.model_runner import ModelRunner
        from replica.model.loader import load_model

        self.torch = torch
        self.runner = ModelRunner(load_model(model_dir, "float32", "cpu"), 1, 1024)

    def seconds(self, ids: list[int]) -> float:
        from replica.engine.model_runner import StepInput

        start = time.perf_counter()
        logits = self.runner.run([StepInput(ids, 0, self.runner.row_table(0))])
        int(logits.argmax(-1)[0])
        return time.perf_counter() - start


class EngineStep:
    """The replica's own engine, assembled as the replica assembles it (LoRA wrappers, slot pools), stepping
    one prefill in this process: beside BareForward it isolates the engine's cost from the process's."""

    def __init__(self, model_dir: Path) -> None:
        from replica.config import ReplicaSettings
        from replica.model.loader import load_model
        from replica.model.tokenizer import Tokenizer
        from replica.runtime import Replica

        settings = ReplicaSettings(
            model_dir=model_dir,
            device="cpu",
            max_num_seqs=8,
            max_model_len=1024,
            lora_slots=SMALL_LORA_SLOTS,
            base_model_hash="0" * 64,  # no adapter is loaded: skip hashing the checkpoint
            registry_url=None,
            control_enabled=False,
        )
        model = load_model(model_dir, "float32", "cpu")
        self.engine = Replica(settings, model, Tokenizer.from_dir(model_dir)).engine.engine
        self.count = 0

    def seconds(self, ids: list[int]) -> float:
        from replica.engine.sampler import SamplingParams

        self.count += 1
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        self.engine.add_request(f"bench-{self.count}", ids, params)
        start = time.perf_counter()
        self.engine.step()
        return time.perf_counter() - start


@contextlib.asynccontextmanager
async def replica_process(model_dir: Path | None, timeout_s: float) -> AsyncIterator[str]:
    """A `lorafleet replica serve` subprocess on a free port; yields its URL and stops it after."""
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="bench-admission-"))
    env = {
        **SMALL_REPLICA_ENV,  # not the production profile's gigabytes of slots
        **os.environ,
        **DEV_PROFILE_ENV,  # a bench stack runs on dev tokens
        "LORAFLEET_REPLICA_SERVICE_TOKEN": TOKEN,
        "LORAFLEET_REPLICA_CACHE_DIR": str(work / "cache"),
        "LORAFLEET_REPLICA_MAX_NUM_SEQS": "8",
        "LORAFLEET_REPLICA_MAX_MODEL_LEN": "1024",
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [sys.executable, "-m", "lorafleet.cli", "replica", "serve", "--replica-id", REPLICA_ID]
    cmd += ["--port", str(port), "--device", "cpu"]
    if model_dir is not None:
        cmd += ["--model-dir", str(model_dir)]
    url = f"http://127.0.0.1:{port}"
    with open(work / "replica.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient() as c:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"replica exited with {proc.returncode}; see {work / 'replica.log'}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await c.get(f"{url}/health", timeout=1)).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"replica did not answer within {timeout_s}s")
                await asyncio.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    shutil.rmtree(work, ignore_errors=True)  # kept, with the replica's log, when the run failed


class Probe:
    """Generate requests to one replica, and the background load that must not be admitted mid-probe."""

    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client = client
        self.generate_url = f"{url}/internal/replicas/{REPLICA_ID}/generate"
        self.metrics_url = f"{url}/metrics"
        self.may_start = asyncio.Event()
        self.may_start.set()
        self.admitting = 0  # background requests sent that have not had their first token yet
        self.gaps: list[float] = []  # background decode steps, client side

    async def stream(self, content: str, max_tokens: int, background: bool = False) -> float:
        """Seconds from sending to the first token line; reads the stream to its end.

        A background stream counts in `admitting` until its first token, and records its decode gaps.
        """
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
        body |= {"temperature": 0.0, "ignore_eos": True}
        admitting = background
        self.admitting += int(admitting)
        start = time.perf_counter()
        first, last = None, None
        try:
            async with self.client.stream("POST", self.generate_url, json=body) as resp:
                resp.raise_for_status()
                async for line in resp.aiter_lines():
                    if not line.strip() or not isinstance(STREAM_EVENT.validate_json(line), TokenEvent):
                        continue
                    now = time.perf_counter()
                    if first is None:
                        first = now
                        self.admitting -= int(admitting)
                        admitting = False
                    elif background and last is not None:
                        self.gaps.append(now - last)
                    last = now
        finally:
            self.admitting -= int(admitting)
        if first is None:
            raise RuntimeError("the replica sent no token")
        return first - start

    async def background(self, content: str, max_tokens: int, stop: asyncio.Event) -> None:
        """Back-to-back streams until stop, none started while a probe is measured."""
        while not stop.is_set():
            await self.may_start.wait()
            await self.stream(content, max_tokens, background=True)

    async def scrape(self) -> dict[str, tuple[float, float]]:
        resp = await self.client.get(self.metrics_url)
        return stage_sums(resp.raise_for_status().text)

    async def measure(self, content: str, phase_s: float = 0.0) -> dict[str, float] | None:
        """One probe's client TTFT and stage times (seconds); None if another request was observed too.

        Under load the probe waits a random part of phase_s (a decode step) after the scrape, so it meets
        the engine at a random point of its step, as independent traffic does.
        """
        self.may_start.clear()
        try:
            while self.admitting > 0:
                await asyncio.sleep(0.002)
            before = await self.scrape()
            if phase_s > 0:
                await asyncio.sleep(random.uniform(0.0, phase_s))
            ttft = await self.stream(content, 1)
            stages = one_request(before, await self.scrape())
        finally:
            self.may_start.set()
        return None if stages is None else {"client_ttft": ttft, **stages}


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def summarize(
    samples: list[dict[str, float]],
    prompt_tokens: int,
    bare: list[float],
    engine_steps: list[float] | None = None,
) -> dict[str, Any]:
    """Medians (ms) per stage, admission (every stage but the prefill) and what the stages do not cover."""
    admission = [sum(v for k, v in s.items() if k in STAGES and k != "prefill") for s in samples]
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "samples": len(samples),
        "client_ttft_ms": _ms(median([s["client_ttft"] for s in samples])),
        "stages_ms": {k: _ms(median([s[k] for s in samples])) for k in STAGES},
        "admission_ms": _ms(median(admission)),
        "admission_less_tokenize_ms": _ms(
            median([a - s["tokenize"] for a, s in zip(admission, samples, strict=True)])
        ),
        "outside_stages_ms": _ms(median([s["client_ttft"] - sum(s[k] for k in STAGES) for s in samples])),
    }
    if bare:
        b = median(bare)
        out["bare_forward_ms"] = _ms(b)
        out["ttft_over_bare"] = round(median([s["client_ttft"] for s in samples]) / b, 3)
        # paired: each probe over the bare forward timed just before it (both see the same machine load)
        pairs = [s["prefill"] / f for s, f in zip(samples, bare, strict=True)]
        out["prefill_over_bare"] = round(median(pairs), 3)
    if bare and engine_steps:
        out["engine_step_in_process_ms"] = _ms(median(engine_steps))
        pairs = [e / f for e, f in zip(engine_steps, bare, strict=True)]
        out["engine_step_over_bare_in_process"] = round(median(pairs), 3)
    return out


async def run(cfg: AdmissionBenchConfig) -> dict[str, Any]:
    from lorafleet.model.prepare import ensure_default_model
    from replica.model.tokenizer import Tokenizer

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe request otherwise
    model_dir = cfg.model_dir or ensure_default_model()
    tokenizer = Tokenizer.from_dir(model_dir)

    def count(text: str) -> int:
        return len(tokenizer.apply_chat_template([{"role": "user", "content": text}]))

    prompts = [prompt_for(n, count) for n in cfg.prompt_tokens]
    ids = {n: tokenizer.apply_chat_template([{"role": "user", "content": t}]) for t, n in prompts}
    load_before = round(os.getloadavg()[0], 2)
    bare_model, engine_step = BareForward(model_dir), EngineStep(model_dir)
    # In-process steps run as the replica runs its steps: loaded on the main thread, stepped on another. That
    # gives the process two OpenMP teams, more threads than CPUs on a small host, and libgomp then spins only
    # briefly at its barriers: the replica's regime. One team spins long (faster on idle cores, much slower on
    # shared ones), which would compare two regimes instead of two code paths.
    stepper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-step")
    loop = asyncio.get_running_loop()

    async def on_stepper(fn: Callable[[list[int]], float], prompt: list[int]) -> float:
        return await loop.run_in_executor(stepper, fn, prompt)

    result: dict[str, Any] = {"benchmark": "replica_admission", "stages": list(STAGES)}
    async with replica_process(cfg.model_dir, cfg.startup_timeout_s) as url:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(headers=headers, timeout=600) as client:
            probe = Probe(client, url)
            for text, n in prompts:  # warm-up: first-call costs (allocator, jinja, sockets) stay out
                await probe.stream(text, 2)
                await on_stepper(bare_model.seconds, ids[n])
                await on_stepper(engine_step.seconds, ids[n])
            idle: dict[int, list[dict[str, float]]] = {n: [] for _, n in prompts}
            bare: dict[int, list[float]] = {n: [] for _, n in prompts}
            steps: dict[int, list[float]] = {n: [] for _, n in prompts}
            for _ in range(cfg.repeats):
                for text, n in prompts:
                    stepped = await on_stepper(engine_step.seconds, ids[n])
                    forward = await on_stepper(bare_model.seconds, ids[n])
                    await asyncio.sleep(SETTLE_S)
                    if (got := await probe.measure(text)) is not None:
                        idle[n].append(got)
                        bare[n].append(forward)
                        steps[n].append(stepped)
            result["idle"] = [summarize(idle[n], n, bare[n], steps[n]) for _, n in prompts]
            loaded: dict[int, list[dict[str, float]]] = {n: [] for _, n in prompts}
            stop = asyncio.Event()
            load_text = prompts[0][0]
            tasks = [
                asyncio.create_task(probe.background(load_text, cfg.stream_tokens, stop))
                for _ in range(cfg.streams)
            ]
            try:
                await asyncio.sleep(2.0)
                step = median(probe.gaps)
                for _ in range(cfg.repeats):
                    for text, n in prompts:
                        if (got := await probe.measure(text, step)) is not None:
                            loaded[n].append(got)
            finally:
                stop.set()
                await asyncio.gather(*tasks)
            result["under_load"] = {
                "streams": cfg.streams,
                "decode_step_ms": _ms(median(probe.gaps)),
                "results": [summarize(loaded[n], n, []) for _, n in prompts],
            }
    stepper.shutdown()
    result["environment"] = {
        "model_dir": str(model_dir),
        "cpu_count": os.cpu_count(),
        "load_average_1m_before": load_before,
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "repeats": cfg.repeats,
    }
    return result
