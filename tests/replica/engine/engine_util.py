"""A tiny engine for tests: random Llama, LoRA slots written by the adapter cache, and a one-character-per-token
detokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from replica.adapter_cache.cache import AdapterCache, Lease
from replica.engine.engine import KvPolicy, LLMEngine, StepOutput
from replica.engine.model_runner import ModelRunner
from replica.engine.sampler import SamplingParams
from tests.replica.cache_util import local_cache
from tests.replica.peft_util import build_lora_model

EOS = 0


class CharDetokenizer:
    """Token t is the letter chr(97 + t % 26): a real, simple detokenizer for a tiny vocabulary."""

    def push(self, token_id: int) -> str:
        return chr(97 + token_id % 26)

    def flush(self) -> str:
        return ""


class RecordingDetokenizer(CharDetokenizer):
    """A CharDetokenizer that appends "text" to events at each token it turns into text."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def push(self, token_id: int) -> str:
        self.events.append("text")
        return super().push(token_id)


@dataclass
class Served:
    """An LLMEngine stepped by the test over the GPU tier its adapter cache writes.

    add() serves a request as the replica does: the adapter cache brings its adapter into a slot and pins it
    (a lease, held until the request ends), then the engine queues it; step() releases the leases of the
    requests that ended.
    """

    engine: LLMEngine
    cache: AdapterCache
    leases: dict[str, Lease] = field(default_factory=dict)

    async def add(
        self, request_id: str, prompt: list[int], params: SamplingParams, adapter_id: str | None = None
    ) -> None:
        lease = await self.cache.acquire(adapter_id) if adapter_id is not None else None
        try:
            self.engine.add_request(request_id, prompt, params, adapter_id)
        except BaseException:
            if lease is not None:
                self.cache.release(lease)
            raise
        if lease is not None:
            self.leases[request_id] = lease

    def step(self) -> list[StepOutput]:
        outputs = self.engine.step()
        for o in outputs:
            if o.finished:
                self.release(o.request_id)
        return outputs

    def release(self, request_id: str) -> None:
        """End the request's hold on its adapter (the replica does it when the response ends)."""
        lease = self.leases.pop(request_id, None)
        if lease is not None:
            self.cache.release(lease)

    def run_all(self) -> dict[str, list[StepOutput]]:
        """Step until every request finished; return each request's outputs."""
        out: dict[str, list[StepOutput]] = {}
        while self.engine.has_work():
            for o in self.step():
                out.setdefault(o.request_id, []).append(o)
        return out


def make_engine(
    base_dir: Path,
    adapters: dict[str, Path],
    capacities: dict[int, int],
    cache_dir: Path,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 8192,
    kv: KvPolicy = KvPolicy(),
    num_blocks: int | None = None,
    overlap_text: bool | None = None,
    prepare_ahead: bool | None = None,
) -> Served:
    """The engine and the adapter cache of a replica serving these adapter folders; no adapter loaded yet."""
    model, gpu, spec = build_lora_model(base_dir, capacities)
    runner = ModelRunner(model, max_num_seqs=max_num_seqs, max_model_len=128, num_blocks=num_blocks)
    engine = LLMEngine(
        runner,
        gpu,
        {EOS},
        max_num_batched_tokens,
        detokenizer_factory=CharDetokenizer,
        kv=kv,
        overlap_text=overlap_text,
        prepare_ahead=prepare_ahead,
    )
    return Served(engine, local_cache(spec, gpu, adapters, cache_dir))


def tokens(outs: list[StepOutput]) -> list[int]:
    return [o.token_id for o in outs if o.token_id is not None]


def greedy(max_tokens: int = 10, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)
